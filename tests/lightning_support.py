"""What the Lightning tests share (each test module imports Lightning only if installed)."""

from __future__ import annotations

from typing import Any


def one_machine() -> list[Any]:
    """Trainer plugins naming the cluster environment Lightning picks on one machine anyway,
    so that it does not probe for MPI: with mpi4py installed, that probe starts MPI's daemon
    (``orted``), a child process that lives as long as the test process."""
    from lightning.pytorch.plugins.environments import LightningEnvironment

    return [LightningEnvironment()]
