"""Small helpers with no knowledge of loaders: nested batches, suggestions, wrappers,
plugins, held interrupts, and the reaper of what a process leaves."""
