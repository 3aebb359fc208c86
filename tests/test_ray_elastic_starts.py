"""An elastic Ray pool starts at most as many actors at once as the cluster has CPUs, the
others as those answer: on a Ray of one CPU of its own (a child process), a pool asked to
grow from its start to 6 actors never has two starting at once, and runs all 6."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_python_without_session_ray

pytest.importorskip("ray", reason="ray is not installed: pip install 'dataloaderx[ray]'")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

_GROW = """
import json, logging, threading, time
import ray, torch
from ray._private import state
from dataloaderx import DataLoaderX
from dataloaderx.workers.elastic import scaling
from dataloaderx.workers.elastic.policy import Change, ScalePolicy

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000
    def __getitem__(self, index):
        time.sleep(0.005)
        return index

asked = []
def observe(policy, window):  # the first window asks for 6; no change after
    asked.append(window.workers)
    return Change(6, "scripted: 6") if len(asked) == 1 else None

scaling.WINDOW_SECONDS, scaling.WINDOW_BATCHES = 0.0, 1
ScalePolicy.observe = observe
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
         logging_level=logging.ERROR)
# samples: the sampler's own until it is joined; all_alive: set once it sees 6 alive.
samples, stop, all_alive = [], threading.Event(), threading.Event()
def sample():
    while not stop.is_set():
        states = [actor["State"] for actor in state.actors().values()
                  if "RayWorker" in str(actor.get("ActorClassName"))]
        samples.append([sum(s not in ("ALIVE", "DEAD") for s in states),
                        states.count("ALIVE")])
        if states.count("ALIVE") == 6:
            all_alive.set()
        stop.wait(0.02)
sampler = threading.Thread(target=sample)
sampler.start()
loader = DataLoaderX(Slow(), batch_size=2, num_workers="auto", worker_method="ray",
                     worker_options={"num_cpus": 0.125, "min_workers": 1, "max_workers": 6})
deadline = time.monotonic() + 200
for batch in loader:
    if all_alive.is_set() or time.monotonic() > deadline:
        break
stop.set()
sampler.join()
counts = [workers for _, workers, _ in loader.stats.workers]
del loader
ray.shutdown()
print(json.dumps({"samples": samples, "counts": counts}))
"""


def test_an_elastic_pool_starts_at_most_the_clusters_cpus_at_once() -> None:
    done = run_python_without_session_ray(_GROW, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    starting = [pending for pending, _ in report["samples"]]
    alive = [alive for _, alive in report["samples"]]
    assert report["counts"][-1] == 6, report["counts"]
    assert max(alive) == 6, alive
    # Actors were seen starting, never two at once.
    assert max(starting) == 1, starting
