"""Read loader settings from a mapping or a YAML, TOML or JSON file."""

from __future__ import annotations

import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from dataloaderx.errors import ConfigError
from dataloaderx.util.suggest import did_you_mean, quoted

__all__ = ["SUPPORTED_SUFFIXES", "TARGET_KEY", "load_config_file", "loader_kwargs"]

#: Hydra's key naming the class to build.
TARGET_KEY: Final = "_target_"
_TARGET_NAMES: Final = frozenset({"dataloaderx.DataLoaderX", "dataloaderx.loader.DataLoaderX"})


def _parse_yaml(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def _parse_toml(text: str) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]
    return tomllib.loads(text)


_PARSERS: Final[dict[str, tuple[str, Callable[[str], Any]]]] = {
    ".yaml": ("YAML", _parse_yaml),
    ".yml": ("YAML", _parse_yaml),
    ".toml": ("TOML", _parse_toml),
    ".json": ("JSON", json.loads),
}
SUPPORTED_SUFFIXES: Final = tuple(_PARSERS)


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a config file (YAML with a safe loader, TOML or JSON) into a mapping."""
    file = Path(path)
    parser = _PARSERS.get(file.suffix.lower())
    if parser is None:
        raise ConfigError(
            f"config file {str(file)!r} has the suffix {file.suffix!r}; "
            f"supported suffixes: {quoted(SUPPORTED_SUFFIXES)}"
        )
    kind, parse = parser
    if not file.is_file():
        raise FileNotFoundError(f"config file {str(file)!r} does not exist")
    text = file.read_text(encoding="utf-8")
    try:
        data = parse(text)
    except Exception as exc:
        raise ConfigError(f"config file {str(file)!r} is not valid {kind}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(file)!r} must hold a mapping of DataLoaderX arguments at "
            f"the top level, got {type(data).__name__}: {data!r}"
        )
    return data


def loader_kwargs(
    config: Mapping[str, Any] | str | os.PathLike[str], cls: type[Any]
) -> dict[str, Any]:
    """Return the keyword arguments for ``cls(dataset, **kwargs)`` held in ``config``."""
    if isinstance(config, (str, os.PathLike)):
        settings = load_config_file(config)
    elif isinstance(config, Mapping):
        settings = dict(config)
    else:
        raise TypeError(
            "config must be a mapping or the path of a .yaml, .yml, .toml or .json file, "
            f"got {config!r} ({type(config).__name__})"
        )
    target = settings.pop(TARGET_KEY, None)
    if target is not None and target not in _TARGET_NAMES:
        raise ConfigError(
            f"config key {TARGET_KEY!r} is {target!r}, but from_config builds "
            f"{cls.__module__.split('.')[0]}.{cls.__name__}; remove the key or set it to "
            "'dataloaderx.DataLoaderX'"
        )
    if "dataset" in settings:
        raise ConfigError(
            "config must not hold 'dataset'; pass the dataset as from_config's first argument"
        )
    valid = [name for name in inspect.signature(cls).parameters if name != "dataset"]
    unknown = [key for key in settings if key not in valid]
    if unknown:
        details = "; ".join(f"{key!r}{did_you_mean(str(key), valid)}" for key in unknown)
        raise ConfigError(f"unknown config key(s): {details}. Valid keys: {quoted(valid)}")
    return settings
