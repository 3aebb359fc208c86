"""``worker_options`` of ``worker_method="ray"``: the actors' Ray options and the loader's
own (reservation timeout, bounded replacements), checked without importing Ray."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from dataloaderx.util.suggest import did_you_mean, quoted

__all__ = ["HANDOVERS", "RayOptions", "parse_options"]

#: Scheduling strategies given by name; other strategies are Ray's strategy objects.
_STRATEGY_NAMES: Final = ("SPREAD", "DEFAULT")
#: How batches come back: shared memory from actors on the loop's machine, or the object
#: store from every actor.
HANDOVERS: Final = ("auto", "object_store")


@dataclass(frozen=True)
class RayOptions:
    """The checked ``worker_options``; see ``docs/ray-workers.md``."""

    #: CPUs each actor reserves (fractions allowed, as Ray's ``num_cpus``).
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    #: Bytes of memory each actor reserves (``None``: none).
    memory: int | None = None
    #: Custom resources each actor reserves, such as ``{"cpu_node": 1}``.
    resources: Mapping[str, float] = field(default_factory=dict)
    #: ``"SPREAD"`` (over nodes), ``"DEFAULT"`` (packed), or a Ray strategy object.
    scheduling_strategy: Any = "SPREAD"
    runtime_env: Mapping[str, Any] | None = None
    #: Seconds to wait for the actors' resources (and a replacement's start) before an error.
    placement_timeout_s: float = 60.0
    #: How many lost actors one iterator replaces before it raises.
    max_replacements: int = 4
    #: One of :data:`HANDOVERS`.
    handover: str = "auto"

    def bundle(self) -> dict[str, float]:
        """The resources of one actor, as a placement-group bundle (zeros left out)."""
        wanted = {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}
        if self.memory is not None:
            wanted["memory"] = float(self.memory)
        return {name: amount for name, amount in wanted.items() if amount}


def _bad(key: str, value: object, wanted: str) -> ValueError:
    return ValueError(f"worker_options[{key!r}] must be {wanted}, got {value!r}")


def _number(key: str, value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(key, value, "a finite number")
    if value < 0 or (positive and value == 0):
        raise _bad(key, value, "a number > 0" if positive else "a number >= 0")
    return float(value)


def _resources(value: object) -> dict[str, float]:
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise _bad("resources", value, "a mapping of resource names to amounts")
    return {name: _number(f"resources.{name}", amount) for name, amount in value.items()}


def _strategy(value: object) -> Any:
    if isinstance(value, str) and value not in _STRATEGY_NAMES:
        raise _bad(
            "scheduling_strategy",
            value,
            f"one of {quoted(_STRATEGY_NAMES)} or a Ray scheduling strategy object"
            f"{did_you_mean(value, _STRATEGY_NAMES)}",
        )
    return value


def _runtime_env(value: object) -> Mapping[str, Any] | None:
    if value is not None and not isinstance(value, Mapping):
        raise _bad("runtime_env", value, "a mapping (Ray's runtime_env) or None")
    return value


def _memory(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _bad("memory", value, "a number of bytes > 0 or None")
    return value


def _replacements(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad("max_replacements", value, "an int >= 0")
    return value


def _handover(value: object) -> str:
    if not isinstance(value, str) or value not in HANDOVERS:
        name = value if isinstance(value, str) else ""
        raise _bad("handover", value, f"one of {quoted(HANDOVERS)}{did_you_mean(name, HANDOVERS)}")
    return value


_PARSERS: Final = {
    "num_cpus": lambda value: _number("num_cpus", value),
    "num_gpus": lambda value: _number("num_gpus", value),
    "memory": _memory,
    "resources": _resources,
    "scheduling_strategy": _strategy,
    "runtime_env": _runtime_env,
    "placement_timeout_s": lambda value: _number("placement_timeout_s", value, positive=True),
    "max_replacements": _replacements,
    "handover": _handover,
}


def parse_options(options: Mapping[str, Any]) -> RayOptions:
    """The :class:`RayOptions` ``options`` give; ``ValueError`` names a bad key or value."""
    for key in options:
        if key not in _PARSERS:
            name = key if isinstance(key, str) else repr(key)
            raise ValueError(
                f"unknown worker_options key {key!r} (value {options[key]!r}) for "
                f"worker_method='ray'; valid keys: {quoted(_PARSERS)}"
                f"{did_you_mean(name, list(_PARSERS))}"
            )
    return RayOptions(**{key: _PARSERS[key](value) for key, value in options.items()})
