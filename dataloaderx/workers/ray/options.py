"""``worker_options`` of ``worker_method="ray"``: the actors' Ray options and the loader's
own (reservation timeout, bounded replacements, the hand-over, a local Ray's
authentication, an elastic pool's placement and idle timeout)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from dataloaderx.util.suggest import did_you_mean, quoted
from dataloaderx.workers.option_checks import bad, check_keys, choice, count, flag, number

__all__ = ["HANDOVERS", "PLACEMENTS", "RayOptions", "parse_options"]

#: Scheduling strategies given by name; other strategies are Ray's strategy objects.
_STRATEGY_NAMES: Final = ("SPREAD", "DEFAULT")
#: How batches come back: shared memory from actors on the loop's machine, or the object
#: store from every actor.
HANDOVERS: Final = ("auto", "object_store")
#: Where an elastic pool (``num_workers="auto"``) places the actors it adds: the loop's
#: node first, then the others; the loop's node only; the other nodes only.
PLACEMENTS: Final = ("host_first", "host_only", "remote_only")
#: The options of a fixed count alone, and those of ``num_workers="auto"`` alone.
_FIXED_ONLY: Final = ("scheduling_strategy",)
_ELASTIC_ONLY: Final = ("placement", "idle_timeout_s")


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
    #: Start a local Ray even where ``RAY_AUTH_MODE`` turns its authentication off.
    start_local_ray_without_authentication: bool = False
    #: One of :data:`PLACEMENTS` (``num_workers="auto"`` only).
    placement: str = "host_first"
    #: Seconds an elastic pool's actors stay idle between epochs before they end
    #: (``None``: as long as one took to start, the median).
    idle_timeout_s: float | None = None

    def bundle(self) -> dict[str, float]:
        """The resources of one actor, as a placement-group bundle (zeros left out)."""
        wanted = {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}
        if self.memory is not None:
            wanted["memory"] = float(self.memory)
        return {name: amount for name, amount in wanted.items() if amount}


def _resources(value: object) -> dict[str, float]:
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise bad("resources", value, "a mapping of resource names to amounts")
    return {name: number(f"resources.{name}", amount) for name, amount in value.items()}


def _strategy(value: object) -> Any:
    if isinstance(value, str) and value not in _STRATEGY_NAMES:
        raise bad(
            "scheduling_strategy",
            value,
            f"one of {quoted(_STRATEGY_NAMES)} or a Ray scheduling strategy object"
            f"{did_you_mean(value, _STRATEGY_NAMES)}",
        )
    return value


def _runtime_env(value: object) -> Mapping[str, Any] | None:
    if value is not None and not isinstance(value, Mapping):
        raise bad("runtime_env", value, "a mapping (Ray's runtime_env) or None")
    return value


def _memory(value: object) -> int | None:
    return None if value is None else count("memory", value, least=1)


_PARSERS: Final[dict[str, Callable[[Any], Any]]] = {
    "num_cpus": lambda value: number("num_cpus", value),
    "num_gpus": lambda value: number("num_gpus", value),
    "memory": _memory,
    "resources": _resources,
    "scheduling_strategy": _strategy,
    "runtime_env": _runtime_env,
    "placement_timeout_s": lambda value: number("placement_timeout_s", value, positive=True),
    "max_replacements": lambda value: count("max_replacements", value),
    "handover": lambda value: choice("handover", value, HANDOVERS),
    "placement": lambda value: choice("placement", value, PLACEMENTS),
    "idle_timeout_s": lambda value: None if value is None else number("idle_timeout_s", value),
    "start_local_ray_without_authentication": lambda value: flag(
        "start_local_ray_without_authentication", value
    ),
}

#: What to do instead of each option of one kind of count given to the other.
_FIXES: Final = {
    "scheduling_strategy": (
        "worker_options['placement'] places the actors of num_workers='auto' (one of "
        f"{quoted(PLACEMENTS)})"
    ),
    "placement": "use num_workers='auto', or worker_options['scheduling_strategy']",
    "idle_timeout_s": "use num_workers='auto'; a fixed count keeps its actors between epochs",
}


def parse_options(options: Mapping[str, Any], *, elastic: bool = False) -> RayOptions:
    """The :class:`RayOptions` ``options`` give, for a fixed count of workers or an elastic
    pool; ``ValueError`` names a bad key or value."""
    others = _FIXED_ONLY if elastic else _ELASTIC_ONLY
    own = "num_workers='auto'" if elastic else "a fixed count"
    for other in (key for key in others if key in options):
        raise ValueError(
            f"worker_options {other}={options[other]!r} does not apply to worker_method='ray' "
            f"with {own}: {_FIXES[other]}; remove {other}"
        )
    return RayOptions(**check_keys("ray", options, _PARSERS))
