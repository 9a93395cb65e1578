"""Daemon health: systemd notification, worker progress for the watchdog, and log setup."""
