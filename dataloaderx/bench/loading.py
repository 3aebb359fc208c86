"""Load the user's ``MODULE:FACTORY`` dataset and ``MODULE:FN`` step."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from dataloaderx.bench.errors import BenchError

__all__ = ["load_dataset", "load_object", "load_step"]


def load_object(spec: str, option: str) -> Any:
    """Import ``MODULE`` and return its attribute ``NAME`` for ``spec == "MODULE:NAME"``."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise BenchError(
            f"{option} must look like MODULE:NAME (e.g. mypkg.data:make), got {spec!r}"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise BenchError(f"{option}: cannot import module {module_name!r}: {exc!r}") from exc
    found: Any = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise BenchError(
                f"{option}: module {module_name!r} has no attribute {attribute!r}"
            ) from None
    if not callable(found):
        raise BenchError(f"{option}: {spec!r} is {found!r}, which is not callable")
    return found


def load_dataset(spec: str) -> Dataset[Any]:
    """Call the factory named by ``spec`` and check it returned a non-empty dataset."""
    factory = load_object(spec, "--dataset")
    try:
        dataset = factory()
    except Exception as exc:
        raise BenchError(f"--dataset: calling {spec}() raised {exc!r}") from exc
    if isinstance(dataset, IterableDataset):
        return dataset
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise BenchError(
            f"--dataset: {spec}() returned {type(dataset).__name__}, not a Dataset "
            "(it needs __getitem__ and __len__, or must be an IterableDataset)"
        )
    if len(dataset) == 0:
        raise BenchError(f"--dataset: {spec}() returned an empty dataset (len 0)")
    return dataset  # type: ignore[no-any-return]


def load_step(spec: str) -> Callable[[Any], object]:
    """Return the training-step function named by ``spec`` (called with each batch)."""
    step: Callable[[Any], object] = load_object(spec, "--step")
    return step
