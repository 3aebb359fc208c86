"""``worker_method="ray"``: a loader's workers as Ray actors, on this machine or a cluster's.

``options`` checks ``worker_options``; ``cluster`` connects to Ray (or starts a local one)
and reserves the actors' resources; ``actor`` is the worker, run in an actor's process;
``transfer`` hands tensors over as numpy arrays; ``group`` is a loader's actors, kept
between epochs; ``pool`` runs an epoch's tasks on them and replaces a lost one.
"""
