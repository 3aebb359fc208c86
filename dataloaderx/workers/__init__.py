"""``DataLoader``'s workers made elsewhere than in worker processes: the ``worker_method``
argument, the worker threads and their pool, the schedule of an epoch's tasks, and the
iterator that keeps the worker contract over them."""
