"""The ``cuda`` backend's device machinery: the device API, pinned staging memory, the
threads that copy into it and the per-batch stream protocol."""
