"""The example plugin packages, pip-installed for real and used by name in a fresh process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip(
    "setuptools", reason="building the example plugins needs setuptools (pip install setuptools)"
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plugins installed into a directory of their own.

    They are built from copies, so the build leaves nothing in the source tree.
    """
    target = tmp_path_factory.mktemp("plugins")
    sources = tmp_path_factory.mktemp("plugin-sources")
    names = ("plugin", "broken_plugin", "worker_plugin")
    for name in names:
        shutil.copytree(EXAMPLES / name, sources / name)
    subprocess.run(
        [
            sys.executable,
            *("-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"),
            *("--target", str(target)),
            *(str(sources / name) for name in names),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return target


def run_with_plugins(plugin_dir: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_installed_plugin_is_used_by_name(plugin_dir: Path) -> None:
    result = run_with_plugins(
        plugin_dir,
        """
        import logging, sys
        import torch
        from dataloaderx import DataLoaderX, available_backends, registered_backends

        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s: %(message)s")
        assert "logged" in available_backends(), available_backends()
        print(registered_backends()["logged"].origin)
        loader = DataLoaderX(torch.arange(10), batch_size=2, backend="logged",
                             backend_options={"every": 2})
        print([batch.tolist() for batch in loader])
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "plugin dataloaderx_logged:LoggedBackend from distribution 'dataloaderx-logged'",
        "dataloaderx_logged: 2 batches so far",
        "dataloaderx_logged: 4 batches so far",
        "[[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]",
    ]


def test_plugin_options_are_validated(plugin_dir: Path) -> None:
    result = run_with_plugins(
        plugin_dir,
        """
        from dataloaderx import prefetch
        prefetch([1], backend={"name": "logged", "evry": 2})
        """,
    )
    assert "TypeError: backend 'logged' got an unknown option 'evry'" in result.stderr


def test_broken_plugin_breaks_only_its_own_name(plugin_dir: Path) -> None:
    result = run_with_plugins(
        plugin_dir,
        """
        import dataloaderx
        print(sorted(dataloaderx.available_backends()))
        dataloaderx.DataLoaderX([1, 2], backend="broken")
        """,
    )
    assert "'logged'" in result.stdout.splitlines()[0]
    assert "'broken'" not in result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("dataloaderx.errors.BackendUnavailableError: backend 'broken'")
    assert "plugin distribution 'dataloaderx-broken-plugin'" in last
    assert "dataloaderx_broken_plugin:BrokenBackend" in last
    assert "No module named 'dataloaderx_missing_dependency'" in last


def test_cli_lists_both_plugins(plugin_dir: Path) -> None:
    result = run_with_plugins(
        plugin_dir, "import sys; from dataloaderx.cli import main; sys.exit(main(['backends']))"
    )
    assert result.returncode == 0, result.stderr
    assert "logged\n    No prefetch; logs the running batch count every" in result.stdout
    assert "options: every: int = 100" in result.stdout
    assert "broken  [unavailable: backend 'broken' comes from plugin distribution" in result.stdout


def test_an_installed_worker_method_keeps_the_worker_contract(plugin_dir: Path) -> None:
    # Spawned processes: the worker core seeds each like a worker process and sets its
    # get_worker_info(), so the batches, ids, seeds and draws are worker processes'.
    result = run_with_plugins(
        plugin_dir,
        """
        import torch
        from torch.utils.data import DataLoader
        from dataloaderx import DataLoaderX
        from dataloaderx.workers.registry import worker_method_names
        from tests.helpers import Draws, assert_same

        assert "spawned" in worker_method_names(), worker_method_names()
        def options():
            generator = torch.Generator().manual_seed(4)
            return {"batch_size": 3, "num_workers": 2, "shuffle": True, "generator": generator}

        expected = list(DataLoader(Draws(20), **options()))
        loader = DataLoaderX(Draws(20), **options(), worker_method="spawned")
        assert_same(list(loader), expected)
        print(loader.worker_method, len(expected))
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["spawned", "7"]
