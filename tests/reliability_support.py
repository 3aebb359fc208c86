"""Datasets and subprocess helpers for the reliability tests (importable by worker processes)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from dataloaderx import get_backend
from dataloaderx.options import backend_option_names
from tests.helpers import Pair

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scenarios"

#: The batch structures the fuzzing test draws from.
ITEM_KINDS = ("tensor", "int", "tuple", "dict", "namedtuple")


class KindDataset(Dataset[Any]):
    """Item ``i`` as one of :data:`ITEM_KINDS`; raises ``ValueError`` at indices in ``fail_at``."""

    def __init__(self, size: int, kind: str, fail_at: frozenset[int] = frozenset()) -> None:
        self.size = size
        self.kind = kind
        self.fail_at = fail_at

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Any:
        if index in self.fail_at:
            raise ValueError(f"bad index {index}")
        if self.kind == "tensor":
            return torch.tensor([index, -index])
        if self.kind == "int":
            return index
        if self.kind == "tuple":
            return (torch.tensor(index), float(index) / 2, f"s{index}")
        if self.kind == "dict":
            return {"x": torch.full((2,), float(index)), "y": index % 5, "tag": f"t{index}"}
        return Pair(torch.tensor([index]), {"z": torch.tensor(index * 3)})


class StuckDataset(Dataset[torch.Tensor]):
    """Item ``stuck_at`` is stuck until ``release`` is set (at most ``STUCK_CAP`` seconds);
    the others return at once, and the one before it sets ``made_before`` once made.

    Both are ``multiprocessing`` events: a worker process shares them with the test.
    """

    #: Longer than any deadline of the tests: an item that waits it out never came in time.
    STUCK_CAP = 60.0

    def __init__(self, size: int, stuck_at: int) -> None:
        self.size = size
        self.stuck_at = stuck_at
        self.made_before = multiprocessing.Event()
        self.release = multiprocessing.Event()

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.stuck_at:
            self.release.wait(self.STUCK_CAP)
        elif index == self.stuck_at - 1:
            self.made_before.set()
        return torch.tensor(index)


def takes_option(backend: str, option: str) -> bool:
    """Whether ``backend`` accepts the option ``option``."""
    options = backend_option_names(get_backend(backend))
    return options is None or option in options


def takes_depth(backend: str) -> bool:
    """Whether ``backend`` accepts a ``depth`` option."""
    return takes_option(backend, "depth")


def scenario_command(script: str, *args: str) -> list[str]:
    """The command line running ``tests/scenarios/<script>`` with this interpreter."""
    return [sys.executable, str(SCRIPTS / script), *args]


def scenario_env() -> dict[str, str]:
    """The environment for a scenario subprocess: the repository importable, output unbuffered."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_scenario(
    script: str, args: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a scenario in its own session, with the variables ``env`` added to its
    environment; after ``timeout`` seconds kill it and its children."""
    command = scenario_command(script, *args) if script.endswith(".py") else [script, *args]
    process = subprocess.Popen(
        command,
        env={**scenario_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"{command} did not finish within {timeout} s\nstdout:\n{stdout}\nstderr:\n{stderr}"
        ) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def scenario_report(script: str, args: Sequence[str], timeout: float) -> dict[str, Any]:
    """Run a scenario that must succeed, and return the JSON report on its last line."""
    result = run_scenario(script, args, timeout)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report
