"""Do, in the consumer's thread, the imports that the first batch from a worker triggers.

The first time a process reads a batch from a ``DataLoader`` with workers, Python imports
a few modules: ``torch`` loads profiler support the first time ``record_function`` is
entered (every ``DataLoader`` iterator enters it in ``__next__``), and the tensor arrives
as a file descriptor (``multiprocessing.resource_sharer``) over a connection that is
authenticated with ``hmac``. A producer thread would do those imports while the consumer's
thread may be forking the workers of another iterator, and a worker forked while another
thread holds a module's import lock waits forever once it imports that module itself
(every worker imports ``hmac`` when it seeds numpy). Doing them before any producer starts
leaves the producer nothing to import on that path.
"""

from __future__ import annotations

import importlib
from typing import Final

import torch

__all__ = ["HANDOFF_MODULES", "import_handoff_modules"]

#: Standard-library modules that receiving a tensor from a worker process imports.
HANDOFF_MODULES: Final = ("multiprocessing.resource_sharer", "hmac")

_imported = False


def import_handoff_modules() -> None:
    """Import what the first batch from a worker would import (once per process)."""
    global _imported
    if _imported:
        return
    for name in HANDOFF_MODULES:
        importlib.import_module(name)
    with torch.autograd.profiler.record_function("dataloaderx.import_handoff_modules"):
        pass
    _imported = True
