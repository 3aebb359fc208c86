"""The contracts the layers agree on: a backend and the stream it opens, the mode policy
that picks prefetching or inline batches, and the checks of backend options. Everything
else in the package builds on them; they import nothing from it."""
