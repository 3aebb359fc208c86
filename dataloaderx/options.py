"""Turn the ``backend`` / ``backend_options`` arguments into a configured backend."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from dataloaderx.contracts.backend import Backend
from dataloaderx.errors import BackendUnavailableError, UnknownBackendError
from dataloaderx.registry import get_backend
from dataloaderx.util.suggest import did_you_mean, quoted

__all__ = [
    "COMMON_OPTIONS",
    "DEFAULT_BACKEND",
    "ENV_VAR",
    "BackendSpec",
    "CommonOptions",
    "backend_option_names",
    "make_backend",
    "resolve_backend",
]

#: Environment variable naming the backend used when ``backend=None``.
ENV_VAR: Final = "DATALOADERX_BACKEND"
#: Backend used when neither the argument nor the environment names one.
DEFAULT_BACKEND: Final = "thread"

#: What the ``backend`` argument accepts.
BackendSpec = str | Mapping[str, Any] | None


def backend_option_names(backend_class: type[Backend]) -> list[str] | None:
    """Return the option names ``backend_class`` accepts, or ``None`` if it takes any."""
    parameters = inspect.signature(backend_class).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _split_spec(backend: BackendSpec) -> tuple[str, dict[str, Any]]:
    if backend is None:
        return os.environ.get(ENV_VAR) or DEFAULT_BACKEND, {}
    if isinstance(backend, str):
        return backend, {}
    if isinstance(backend, Mapping):
        options = dict(backend)
        if "name" not in options:
            raise ValueError(
                f"backend mapping {backend!r} has no 'name' key; "
                "write it as {'name': 'thread', 'depth': 4}"
            )
        name = options.pop("name")
        if not isinstance(name, str):
            raise TypeError(
                f"backend mapping's 'name' must be a str, got {name!r} ({type(name).__name__})"
            )
        return name, options
    raise TypeError(
        "backend must be a backend name (str), a mapping with a 'name' key, or None; "
        f"got {backend!r} ({type(backend).__name__})"
    )


@dataclass(frozen=True)
class CommonOptions:
    """Options every backend accepts, handled by the loader rather than the backend."""

    #: ``True`` records stall statistics (``loader.stats``), ``False`` turns them off,
    #: ``"trace"`` also keeps every batch's start and end times.
    stats: bool | str = True


#: Option names every backend accepts (see :class:`CommonOptions`).
COMMON_OPTIONS: Final = tuple(f.name for f in fields(CommonOptions))


def resolve_backend(
    backend: BackendSpec, backend_options: Mapping[str, Any] | None
) -> tuple[Backend, CommonOptions]:
    """Resolve, check and construct the backend described by the two arguments.

    ``backend=None`` means the :data:`ENV_VAR` environment variable if set, else
    :data:`DEFAULT_BACKEND`. ``backend_options`` is merged over options in a ``backend``
    mapping. The options every backend accepts (:data:`COMMON_OPTIONS`) are returned apart,
    validated; the rest go to the backend's constructor. Starts no thread, touches no device.
    """
    name, options = _split_spec(backend)
    if backend_options is not None:
        if not isinstance(backend_options, Mapping):
            raise TypeError(
                "backend_options must be a mapping of option names to values or None, "
                f"got {backend_options!r} ({type(backend_options).__name__})"
            )
        options.update(backend_options)
    try:
        backend_class = get_backend(name)
    except UnknownBackendError as exc:
        if backend is not None:
            raise
        raise UnknownBackendError(
            f"{exc} (the name comes from the {ENV_VAR} environment variable; "
            "set it to a valid name or unset it)"
        ) from None
    reason = backend_class.unavailable_reason()
    if reason is not None:
        raise BackendUnavailableError(reason)
    stats = options.pop("stats", True)
    if stats is not True and stats is not False and stats != "trace":
        raise TypeError(
            f"backend {backend_class.name!r} option 'stats' must be True, False or 'trace', "
            f"got {stats!r}"
        )
    own = backend_option_names(backend_class)
    if own is not None:
        valid = [*own, *COMMON_OPTIONS]
        for option in options:
            if option not in own:
                raise TypeError(
                    f"backend {backend_class.name!r} got an unknown option {option!r}; "
                    f"valid options: {quoted(valid)}{did_you_mean(str(option), valid)}"
                )
    return backend_class(**options), CommonOptions(stats=stats)


def make_backend(backend: BackendSpec, backend_options: Mapping[str, Any] | None) -> Backend:
    """Like :func:`resolve_backend`, returning only the backend."""
    return resolve_backend(backend, backend_options)[0]
