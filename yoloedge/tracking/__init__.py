"""Tracking (issue 17): placeholder so that the events package builds against the seam; the track
helper's package replaces this file (Tracker, TrackingConfig, Track, TrackFrame)."""
