"""The nested-batch mover: tensors replaced, structure, types and other leaves kept."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, defaultdict, namedtuple
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
import torch

from dataloaderx.util.tree import iter_tensors, map_tensors

Point = namedtuple("Point", ["x", "y"])


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    label: int
    extra: dict[str, Any]
    cached: int = dataclasses.field(default=0, init=False)


@dataclasses.dataclass(frozen=True)
class Frozen:
    data: torch.Tensor
    name: str


class Tagged(list[Any]):
    tag = "tagged"


def to_meta(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to("meta")


def test_every_tensor_is_mapped_and_every_other_leaf_is_kept() -> None:
    array = np.arange(3)
    batch = {
        "image": torch.ones(2, 3),
        "ids": [torch.tensor([1]), "name", 7, None, array, 2.5],
        "pair": (torch.zeros(1), {"deep": torch.ones(1)}),
    }
    moved = map_tensors(to_meta, batch)
    assert type(moved) is dict
    assert list(moved) == ["image", "ids", "pair"]
    assert moved["image"].device.type == "meta"
    assert moved["image"].shape == (2, 3)
    assert moved["ids"][0].device.type == "meta"
    assert moved["ids"][1:4] == ["name", 7, None]
    assert moved["ids"][4] is array
    assert type(moved["pair"]) is tuple
    assert moved["pair"][1]["deep"].device.type == "meta"
    assert batch["image"].device.type == "cpu"  # the input is not modified


def test_named_tuples_and_tuple_subclasses_keep_their_type() -> None:
    moved = map_tensors(to_meta, Point(torch.ones(1), "label"))
    assert type(moved) is Point
    assert moved.x.device.type == "meta"
    assert moved.y == "label"
    size = torch.Size([2, 3])
    assert map_tensors(to_meta, size) is size


def test_dict_subclasses_keep_type_order_and_state() -> None:
    ordered = OrderedDict([("b", torch.ones(1)), ("a", torch.zeros(1))])
    moved = map_tensors(to_meta, ordered)
    assert type(moved) is OrderedDict
    assert list(moved) == ["b", "a"]
    counts: defaultdict[str, Any] = defaultdict(list, {"x": torch.ones(1)})
    moved_counts = map_tensors(to_meta, counts)
    assert type(moved_counts) is defaultdict
    assert moved_counts.default_factory is list
    assert moved_counts["x"].device.type == "meta"


def test_read_only_mapping_becomes_a_dict_rather_than_keeping_host_tensors() -> None:
    moved = map_tensors(to_meta, MappingProxyType({"x": torch.ones(1)}))
    assert moved == {"x": moved["x"]}
    assert moved["x"].device.type == "meta"


def test_list_subclass_keeps_type_and_attributes() -> None:
    tagged = Tagged([torch.ones(1), "s"])
    moved = map_tensors(to_meta, tagged)
    assert type(moved) is Tagged
    assert moved.tag == "tagged"
    assert moved[0].device.type == "meta"
    assert moved[1] == "s"


def test_dataclasses_keep_type_and_fields_outside_init() -> None:
    sample = Sample(torch.ones(2), 3, {"mask": torch.zeros(2)})
    sample.cached = 9
    moved = map_tensors(to_meta, sample)
    assert type(moved) is Sample
    assert moved is not sample
    assert moved.image.device.type == "meta"
    assert moved.extra["mask"].device.type == "meta"
    assert (moved.label, moved.cached) == (3, 9)
    assert sample.image.device.type == "cpu"
    frozen = map_tensors(to_meta, Frozen(torch.ones(1), "f"))
    assert type(frozen) is Frozen
    assert frozen.data.device.type == "meta"
    assert frozen.name == "f"


@pytest.mark.parametrize(
    "leaf", ["text", 3, None, np.ones(2), (1, "a"), {"k": [1, 2]}, [], {}, Sample]
)
def test_structures_without_tensors_are_returned_as_the_same_object(leaf: Any) -> None:
    assert map_tensors(to_meta, leaf) is leaf
    assert list(iter_tensors(leaf)) == []


def test_iter_tensors_walks_in_container_order() -> None:
    a, b, c, d = (torch.tensor(i) for i in range(4))
    batch = {"first": a, "rest": [Point(b, "x"), Sample(c, 0, {"d": d})]}
    assert [int(t) for t in iter_tensors(batch)] == [0, 1, 2, 3]
    assert next(iter_tensors(a)) is a
