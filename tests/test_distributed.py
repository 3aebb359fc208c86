"""DDP on the real engine: two gloo processes on CPU, launched with ``torchrun``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dataloaderx import available_backends
from tests.reliability_support import SCRIPTS, run_scenario

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_two_ranks_match_dataloader_and_cover_the_dataset(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
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
        ],
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(out.read_text(encoding="utf-8"))
    backends = available_backends()
    assert summary == {"world": 2, "backends": backends, "epochs_checked": 3 * 2 * len(backends)}
