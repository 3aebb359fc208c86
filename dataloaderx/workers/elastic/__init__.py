"""Elastic workers (``num_workers="auto"``): a pool sized while training runs, from the
loader's wait for data (``docs/elastic-workers.md``)."""
