"""Small helpers with no knowledge of loaders: nested batches, suggestions, wrappers."""
