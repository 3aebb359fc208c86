"""``DataLoaderX.from_config``: mappings and YAML, TOML and JSON files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dataloaderx import ConfigError, DataLoaderX, UnknownBackendError
from dataloaderx.backends.background import BackgroundBackend
from tests.helpers import RangeDataset

SETTINGS: dict[str, Any] = {
    "batch_size": 4,
    "drop_last": True,
    "backend": "background",
    "backend_options": {"depth": 3},
}

FILES = {
    "yaml": "batch_size: 4\ndrop_last: true\nbackend: background\nbackend_options:\n  depth: 3\n",
    "yml": "batch_size: 4\ndrop_last: true\nbackend: background\nbackend_options: {depth: 3}\n",
    "toml": 'batch_size = 4\ndrop_last = true\nbackend = "background"\n'
    "[backend_options]\ndepth = 3\n",
    "json": json.dumps(SETTINGS),
}


def _check(loader: DataLoaderX[Any]) -> None:
    assert loader.batch_size == 4
    assert loader.drop_last is True
    assert isinstance(loader.prefetch_backend, BackgroundBackend)
    assert loader.prefetch_backend.depth == 3
    assert len(list(loader)) == len(loader) == 2


def test_from_mapping() -> None:
    _check(DataLoaderX.from_config(RangeDataset(10), SETTINGS))


@pytest.mark.parametrize("suffix", sorted(FILES))
def test_from_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"loader.{suffix}"
    path.write_text(FILES[suffix])
    _check(DataLoaderX.from_config(RangeDataset(10), path))
    _check(DataLoaderX.from_config(RangeDataset(10), str(path)))


def test_hydra_style_target_is_accepted() -> None:
    config = {"_target_": "dataloaderx.DataLoaderX", **SETTINGS}
    _check(DataLoaderX.from_config(RangeDataset(10), config))


def test_backend_mapping_in_config() -> None:
    config = {"batch_size": 4, "drop_last": True, "backend": {"name": "background", "depth": 3}}
    _check(DataLoaderX.from_config(RangeDataset(10), config))


def test_unknown_keys_are_each_named_with_a_suggestion() -> None:
    with pytest.raises(ConfigError) as info:
        DataLoaderX.from_config(RangeDataset(10), {"batchsize": 4, "num_worker": 2, "zzz": 1})
    message = str(info.value)
    assert "'batchsize'; did you mean 'batch_size'?" in message
    assert "'num_worker'; did you mean 'num_workers'?" in message
    assert "'zzz'" in message
    assert "Valid keys:" in message
    assert "'backend_options'" in message


@pytest.mark.parametrize(
    ("suffix", "text", "pattern"),
    [
        ("yaml", "batch_size: [4\n", r"is not valid YAML"),
        ("toml", "batch_size = \n", r"is not valid TOML"),
        ("json", "{batch_size: 4}", r"is not valid JSON"),
        ("yaml", "- 4\n- 5\n", r"must hold a mapping .* got list"),
        ("yaml", "!!python/object/apply:os.system ['echo unsafe']\n", r"is not valid YAML"),
        ("ini", "batch_size=4", r"suffix '.ini'; supported suffixes: '.yaml', '.yml'"),
    ],
)
def test_malformed_files(tmp_path: Path, suffix: str, text: str, pattern: str) -> None:
    path = tmp_path / f"bad.{suffix}"
    path.write_text(text)
    with pytest.raises(ConfigError, match=pattern):
        DataLoaderX.from_config(RangeDataset(10), path)


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(FileNotFoundError, match=r"config file '.*absent.yaml' does not exist"):
        DataLoaderX.from_config(RangeDataset(10), missing)


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert DataLoaderX.from_config(RangeDataset(10), path).batch_size == 1


@pytest.mark.parametrize(
    ("config", "error", "pattern"),
    [
        ({"_target_": "torch.utils.data.DataLoader"}, ConfigError, r"'_target_' is 'torch.utils"),
        ({"dataset": [1, 2]}, ConfigError, r"must not hold 'dataset'"),
        ({"backend": "nope"}, UnknownBackendError, r"unknown backend 'nope'"),
        (42, TypeError, r"config must be a mapping or the path .* got 42 \(int\)"),
    ],
)
def test_bad_configs(config: Any, error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        DataLoaderX.from_config(RangeDataset(10), config)


@pytest.mark.parametrize("suffix", ["yaml", "toml", "json"])
def test_worker_method_from_a_file(tmp_path: Path, suffix: str) -> None:
    text = {
        "yaml": "num_workers: 2\nworker_method: thread\n",
        "toml": 'num_workers = 2\nworker_method = "thread"\n',
        "json": '{"num_workers": 2, "worker_method": "thread"}',
    }[suffix]
    path = tmp_path / f"loader.{suffix}"
    path.write_text(text)
    loader = DataLoaderX.from_config(RangeDataset(6), path)
    assert loader.worker_method == "thread"
    assert sorted(int(batch[0, 0]) for batch in loader) == list(range(6))


@pytest.mark.parametrize("suffix", ["yaml", "toml", "json", "mapping"])
def test_elastic_workers_from_a_file_or_a_mapping(tmp_path: Path, suffix: str) -> None:
    config: Any = {
        "num_workers": "auto",
        "worker_method": "thread",
        "worker_options": {"min_workers": 2, "max_workers": 4},
    }
    if suffix != "mapping":
        text = {
            "yaml": "num_workers: auto\nworker_method: thread\n"
            "worker_options: {min_workers: 2, max_workers: 4}\n",
            "toml": 'num_workers = "auto"\nworker_method = "thread"\n'
            "worker_options = {min_workers = 2, max_workers = 4}\n",
            "json": json.dumps(config),
        }[suffix]
        config = tmp_path / f"loader.{suffix}"
        config.write_text(text)
    loader = DataLoaderX.from_config(RangeDataset(6), config)
    assert loader._scaling is not None
    assert loader._scaling.bounds[:2] == (2, 4)
    assert sorted(int(batch[0, 0]) for batch in loader) == list(range(6))
