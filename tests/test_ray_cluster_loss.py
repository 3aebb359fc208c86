"""A Ray cluster that goes away mid-epoch: a clear error within ``placement_timeout_s``, then
an exit that leaves no process behind (``tests/scenarios/ray_cluster_loss.py``)."""

from __future__ import annotations

import pytest

from tests.helpers import session_processes, wait_for
from tests.reliability_support import scenario_report

pytest.importorskip("ray", reason="ray is not installed: pip install 'dataloaderx[ray]'")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

#: Long enough for actors to start on a loaded machine: it bounds their start too.
PLACEMENT_TIMEOUT_S = 15.0
#: A hang bound, not a speed bound: Ray itself ends a driver 60 s after losing its GCS.
WITHIN_SECONDS = 45.0


def test_a_cluster_gone_mid_epoch_is_a_clear_error_and_the_process_exits() -> None:
    report = scenario_report("ray_cluster_loss.py", [str(PLACEMENT_TIMEOUT_S)], timeout=180)
    assert {"gcs_server", "raylet", "ray::RayWorker"} <= set(report["killed"])
    assert report["error"] is not None, "the loop got no error once the cluster was gone"
    kind, message = report["error"]
    assert kind == "RuntimeError"
    assert message.startswith("the Ray cluster went away: its GCS did not answer")
    assert f"worker_options['placement_timeout_s']={PLACEMENT_TIMEOUT_S!r}," in message
    assert "resume from a checkpoint (state_dict())" in message
    assert report["seconds"] < WITHIN_SECONDS
    assert wait_for(lambda: not session_processes(report["pid"]), within=30)
