"""The backend registry: built-ins, decorator registrations and entry-point plugins.

Plugins declare ``name = "package.module:Class"`` in the entry-point group
``dataloaderx.backends``. The group is read on the first lookup, not at import, and a
plugin module is imported only when its name is used, so a broken plugin can never
break ``import dataloaderx``. Built-in names win clashes.
"""

from __future__ import annotations

import importlib.metadata
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, TypeVar

from dataloaderx._suggest import did_you_mean, quoted
from dataloaderx.errors import BackendUnavailableError, UnknownBackendError

if TYPE_CHECKING:
    from dataloaderx.backends.base import Backend

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
    """Where a registered backend comes from.

    ``backend_class`` is ``None`` for a plugin that has not been imported yet.
    """

    name: str
    aliases: tuple[str, ...]
    origin: str
    backend_class: type[Backend] | None = None
    entry_point: importlib.metadata.EntryPoint | None = None


_lock = threading.RLock()
_entries: dict[str, BackendEntry] = {}
_aliases: dict[str, str] = {}
_plugins_scanned = False
_builtins_loaded = False
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-.")


def _check_name(what: str, name: object) -> str:
    if not isinstance(name, str) or not name or not set(name) <= _NAME_CHARS:
        raise ValueError(
            f"{what} must be a non-empty lowercase string of letters, digits, '_', '-' "
            f"or '.', got {name!r}"
        )
    return name


def _claimed_by(name: str) -> str | None:
    canonical = _aliases.get(name, name)
    entry = _entries.get(canonical)
    return None if entry is None else entry.origin


def register_backend(name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[B], B]:
    """Class decorator that registers a :class:`~dataloaderx.Backend` under ``name``.

    Raises ``ValueError`` if the name or an alias is already taken.
    """
    _check_name("backend name", name)
    for alias in aliases:
        _check_name("backend alias", alias)

    def decorator(cls: B) -> B:
        from dataloaderx.backends.base import Backend

        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise TypeError(
                f"register_backend({name!r}) decorates a subclass of dataloaderx.Backend, "
                f"got {cls!r}"
            )
        with _lock:
            if not _builtins_loaded and not cls.__module__.startswith("dataloaderx."):
                _load_builtins()
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


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    import dataloaderx.backends  # noqa: F401 - registers the built-in backends


def _distribution_name(entry_point: importlib.metadata.EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    return dist.name if dist is not None else "an unknown distribution"


def _scan_plugins() -> None:
    global _plugins_scanned
    with _lock:
        if _plugins_scanned:
            return
        _plugins_scanned = True
        _load_builtins()
        try:
            found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        except Exception as exc:  # noqa: BLE001 - broken metadata must not break lookups
            warnings.warn(
                f"dataloaderx: could not read the {ENTRY_POINT_GROUP!r} entry points: {exc!r}",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        for entry_point in found:
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


def _load_plugin(entry: BackendEntry) -> type[Backend]:
    from dataloaderx.backends.base import Backend

    entry_point = entry.entry_point
    assert entry_point is not None  # only plugin entries lack a class
    dist = _distribution_name(entry_point)
    try:
        loaded = entry_point.load()
    except Exception as exc:
        raise BackendUnavailableError(
            f"backend {entry.name!r} comes from plugin distribution {dist!r} "
            f"(entry point {entry_point.value!r}), which failed to import: {exc!r}; "
            f"fix or uninstall {dist!r}, or choose another backend"
        ) from exc
    if not (isinstance(loaded, type) and issubclass(loaded, Backend)):
        raise BackendUnavailableError(
            f"backend {entry.name!r} from plugin distribution {dist!r} points at "
            f"{entry_point.value!r}, which is {loaded!r}, not a dataloaderx.Backend subclass"
        )
    loaded.name = entry.name
    with _lock:
        _entries[entry.name] = BackendEntry(
            name=entry.name,
            aliases=(),
            origin=entry.origin,
            backend_class=loaded,
            entry_point=entry_point,
        )
    return loaded


def registered_backends() -> Mapping[str, BackendEntry]:
    """Return a read-only view of every registered backend, plugins included."""
    _scan_plugins()
    return MappingProxyType(_entries)


def get_backend(name: str) -> type[Backend]:
    """Return the backend class registered under ``name`` or one of its aliases.

    Raises :class:`UnknownBackendError` for an unknown name and
    :class:`BackendUnavailableError` for a plugin that fails to import.
    """
    _scan_plugins()
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str, got {name!r} ({type(name).__name__})")
    canonical = _aliases.get(name, name)
    entry = _entries.get(canonical)
    if entry is None:
        known = sorted([*_entries, *_aliases])
        aliases = f" (aliases: {quoted(sorted(_aliases))})" if _aliases else ""
        raise UnknownBackendError(
            f"unknown backend {name!r}; available backends: "
            f"{quoted(_entries)}{aliases}{did_you_mean(name, known)}"
        )
    if entry.backend_class is None:
        return _load_plugin(entry)
    return entry.backend_class


def available_backends() -> list[str]:
    """Return the names of the backends that can run on this machine, in registration order.

    Plugins are imported to find out; one that fails to import is left out (its error
    is raised when its name is used).
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
