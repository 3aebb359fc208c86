"""Producer threads import nothing while they receive batches from worker processes.

A worker forked while another thread holds a module's import lock waits forever once it
imports that module. ``DataLoader`` forks workers in ``iter(loader)`` while producers of
other iterators may be receiving their first batch, which imports modules on first use;
the consumer's thread does those imports before any producer starts.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.reliability_support import scenario_report

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: The scenario imports torch and runs two short epochs with two workers.
SCENARIO_SECONDS = 90.0


def _producer_imports(backend: str, *flags: str) -> dict[str, Any]:
    report = scenario_report("producer_imports.py", [backend, *flags], SCENARIO_SECONDS)
    assert report["fresh"] is True  # hmac was still to be imported when the loader started
    assert report["batches"] == [5, 5]
    return report


def test_producers_import_nothing_while_receiving_worker_batches(backend: str) -> None:
    assert _producer_imports(backend)["imported"] == []


@pytest.mark.parametrize("backend_name", ["thread", "background"])
def test_without_the_warm_up_a_producer_would_import_hmac(backend_name: str) -> None:
    # The control: the check above sees the imports it guards against.
    imported = _producer_imports(backend_name, "--no-warm-up", "--always-prefetch")["imported"]
    assert isinstance(imported, list)
    assert "hmac" in imported
