"""DDP on the real engine: two gloo processes on CPU, launched with ``torchrun``."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dataloaderx import available_backends
from tests.reliability_support import SCRIPTS, run_scenario

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def run_ranks(out: Path, *args: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run ``scenarios/ddp.py OUT *args`` on two ranks; return rank 0's summary."""
    result = run_scenario(
        sys.executable,
        [
            "-m",
            "torch.distributed.run",
            # A rendezvous store on a port its server binds itself (port 0), shared with
            # the ranks: no port is picked ahead, which another job could take meanwhile.
            "--standalone",
            "--nnodes=1",
            "--nproc-per-node=2",
            str(SCRIPTS / "ddp.py"),
            str(out),
            *args,
        ],
        timeout=180,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return summary


def test_two_ranks_match_dataloader_and_cover_the_dataset(tmp_path: Path) -> None:
    summary = run_ranks(tmp_path / "summary.json")
    backends = available_backends()
    assert summary == {"world": 2, "backends": backends, "epochs_checked": 3 * 2 * len(backends)}


def test_two_ranks_with_ray_workers_on_one_cluster_match_worker_processes(
    tmp_path: Path, ray_cluster: Any
) -> None:
    # Each rank connects to the cluster RAY_ADDRESS names, as under `ray start` + torchrun.
    env = {"RAY_ADDRESS": ray_cluster.address}
    summary = run_ranks(tmp_path / "summary.json", "ray", env=env)
    assert summary == {"world": 2, "backends": [None], "epochs_checked": 3}
