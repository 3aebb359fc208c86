"""``worker_method="ray"``: a loader's workers as Ray actors, on this machine or a cluster's.

``options`` checks ``worker_options``; ``cluster`` connects to Ray (or starts a local one,
loopback only and authenticated), reserves the actors' resources and guards every Ray
call; ``actor`` is the worker core in an actor's process; ``transfer`` and ``shared`` hand
batches over; ``group`` is a loader's actors, kept between epochs; ``pool`` runs an
epoch's tasks on them, ``recovery`` says what a lost actor means and ``heartbeat`` whether
the cluster is still there.
"""
