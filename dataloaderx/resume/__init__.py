"""Saving and resuming a loader's position within an epoch."""
