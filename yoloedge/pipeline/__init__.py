"""Cameras -> bounded queues -> batcher -> device workers -> post-processing -> publishing."""
