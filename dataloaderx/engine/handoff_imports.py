"""Do, in the loop's thread, the imports that the first batch from a worker triggers, so
that no producer thread holds an import lock while workers fork (``docs/design.md``,
*Forking while a producer runs*)."""

from __future__ import annotations

import importlib
from typing import Final

import torch

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
