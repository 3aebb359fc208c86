"""Exceptions raised by dataloaderx; every one is also importable from ``dataloaderx``."""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "ConfigError",
    "ResumeStateError",
    "UnknownBackendError",
    "WorkerMethodUnavailableError",
]


class UnknownBackendError(ValueError):
    """No backend is registered under the requested name."""


class BackendUnavailableError(RuntimeError):
    """The backend exists but cannot run here (a missing package, device or broken plugin)."""


class ConfigError(ValueError):
    """A loader configuration (mapping or file) is malformed or holds unknown keys."""


class ResumeStateError(ValueError):
    """A state given to ``load_state_dict()`` does not fit the loader, is corrupt or too new."""


class WorkerMethodUnavailableError(ImportError):
    """A worker method's pool cannot be imported (a missing package or a broken plugin)."""
