"""The backend registry: built-ins, decorator registrations and entry-point plugins.

Built-ins are ``"module:Class"`` strings imported on first use, so the registry imports no
backend (and no backend imports the registry). Plugins declare ``name = "package.module:Class"``
in the entry-point group ``dataloaderx.backends``, read on the first lookup (not at import); a
plugin module is imported only when its name is used, so a broken plugin can never break
``import dataloaderx``. Built-in names win clashes.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, TypeVar

from dataloaderx.contracts.backend import Backend
from dataloaderx.errors import BackendUnavailableError, UnknownBackendError
from dataloaderx.util.plugins import entry_points, subclass_or_none
from dataloaderx.util.suggest import did_you_mean, quoted

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendEntry",
    "available_backends",
    "get_backend",
    "register_backend",
    "registered_backends",
]

ENTRY_POINT_GROUP: Final = "dataloaderx.backends"

B = TypeVar("B", bound="type[Backend]")


@dataclass(frozen=True)
class BackendEntry:
    """Where a registered backend comes from; ``backend_class`` is ``None`` for a plugin that
    has not been imported yet."""

    name: str
    aliases: tuple[str, ...]
    origin: str
    backend_class: type[Backend] | None = None
    entry_point: importlib.metadata.EntryPoint | None = None


#: The built-in backends, in the order they are listed: aliases and ``"module:Class"``.
BUILTINS: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    "background": (("prefetch_generator",), "dataloaderx.backends.background:BackgroundBackend"),
    "sync": (("none",), "dataloaderx.backends.sync:SyncBackend"),
    "thread": ((), "dataloaderx.backends.thread:ThreadBackend"),
    "cuda": (("cuda_stream",), "dataloaderx.backends.cuda:CudaBackend"),
    "auto": ((), "dataloaderx.backends.auto:AutoBackend"),
}

_lock = threading.RLock()
_entries: dict[str, BackendEntry] = {
    name: BackendEntry(
        name,
        aliases,
        target.replace(":", "."),
        entry_point=importlib.metadata.EntryPoint(name, target, ENTRY_POINT_GROUP),
    )
    for name, (aliases, target) in BUILTINS.items()
}
_aliases: dict[str, str] = {
    alias: name for name, (aliases, _) in BUILTINS.items() for alias in aliases
}
_plugins_scanned = False
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-.")


def _check_name(what: str, name: object) -> str:
    if not isinstance(name, str) or not name or not set(name) <= _NAME_CHARS:
        raise ValueError(
            f"{what} must be a non-empty lowercase string of letters, digits, '_', '-' "
            f"or '.', got {name!r}"
        )
    return name


def _claimed_by(name: str) -> str | None:
    entry = _entries.get(_aliases.get(name, name))
    return None if entry is None else entry.origin


def register_backend(name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[B], B]:
    """Class decorator that registers a :class:`~dataloaderx.Backend` under ``name``; raises
    ``ValueError`` if the name or an alias is invalid or already taken."""
    _check_name("backend name", name)
    for alias in aliases:
        _check_name("backend alias", alias)

    def decorator(cls: B) -> B:
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise TypeError(
                f"register_backend({name!r}) decorates a subclass of dataloaderx.Backend, "
                f"got {cls!r}"
            )
        with _lock:
            for key in (name, *aliases):
                owner = _claimed_by(key)
                if owner is not None:
                    raise ValueError(
                        f"backend name {key!r} is already registered by {owner}; "
                        "choose another name"
                    )
            cls.name = name
            _entries[name] = BackendEntry(
                name=name,
                aliases=tuple(aliases),
                origin=f"{cls.__module__}.{cls.__qualname__}",
                backend_class=cls,
            )
            for alias in aliases:
                _aliases[alias] = name
        return cls

    return decorator


def _distribution_name(entry_point: importlib.metadata.EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    return dist.name if dist is not None else "an unknown distribution"


def _scan_plugins() -> None:
    global _plugins_scanned
    with _lock:
        if _plugins_scanned:
            return
        _plugins_scanned = True
        for entry_point in entry_points(ENTRY_POINT_GROUP):
            dist = _distribution_name(entry_point)
            owner = _claimed_by(entry_point.name)
            if owner is not None:
                warnings.warn(
                    f"dataloaderx: plugin distribution {dist!r} registers backend "
                    f"{entry_point.name!r} ({entry_point.value}), which {owner} already "
                    "provides; the plugin's backend is ignored",
                    RuntimeWarning,
                    stacklevel=3,
                )
                continue
            _entries[entry_point.name] = BackendEntry(
                name=entry_point.name,
                aliases=(),
                origin=f"plugin {entry_point.value} from distribution {dist!r}",
                entry_point=entry_point,
            )


def _load(entry: BackendEntry) -> type[Backend]:
    """Import ``entry``'s class (a built-in's, or a plugin's) and keep it in the registry."""
    entry_point = entry.entry_point
    if entry_point is None:  # a registered class was given; not reached
        raise BackendUnavailableError(f"backend {entry.name!r} has no class to import")
    dist = _distribution_name(entry_point)
    try:
        loaded = entry_point.load()
    except Exception as exc:
        raise BackendUnavailableError(
            f"backend {entry.name!r} comes from plugin distribution {dist!r} "
            f"(entry point {entry_point.value!r}), which failed to import: {exc!r}; "
            f"fix or uninstall {dist!r}, or choose another backend"
        ) from exc
    backend_class: type[Backend] | None = subclass_or_none(loaded, Backend)
    if backend_class is None:
        raise BackendUnavailableError(
            f"backend {entry.name!r} from plugin distribution {dist!r} points at "
            f"{entry_point.value!r}, which is {loaded!r}, not a dataloaderx.Backend subclass"
        )
    backend_class.name = entry.name
    with _lock:
        _entries[entry.name] = dataclasses.replace(entry, backend_class=backend_class)
    return backend_class


def registered_backends() -> Mapping[str, BackendEntry]:
    """Return a read-only view of every registered backend, plugins included (built-ins hold
    their class; a plugin's is ``None`` until its name is used)."""
    _scan_plugins()
    for name in BUILTINS:
        get_backend(name)
    return MappingProxyType(_entries)


def get_backend(name: str) -> type[Backend]:
    """Return the backend class registered under ``name`` or one of its aliases.

    Raises :class:`UnknownBackendError` for an unknown name and
    :class:`BackendUnavailableError` for a plugin that fails to import.
    """
    _scan_plugins()
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str, got {name!r} ({type(name).__name__})")
    entry = _entries.get(_aliases.get(name, name))
    if entry is None:
        known = sorted([*_entries, *_aliases])
        aliases = f" (aliases: {quoted(sorted(_aliases))})" if _aliases else ""
        raise UnknownBackendError(
            f"unknown backend {name!r}; available backends: "
            f"{quoted(_entries)}{aliases}{did_you_mean(name, known)}"
        )
    return entry.backend_class if entry.backend_class is not None else _load(entry)


def available_backends() -> list[str]:
    """Return the names of the backends that can run on this machine, in registration order.

    Plugins are imported to find out; one that fails to import is left out (and raises if used).
    """
    names = []
    for name in list(registered_backends()):
        try:
            backend_class = get_backend(name)
        except BackendUnavailableError:
            continue
        if backend_class.unavailable_reason() is None:
            names.append(name)
    return names
