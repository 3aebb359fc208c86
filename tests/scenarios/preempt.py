"""A training job that saves its loader's state every few steps and can be killed at any time.

Usage: preempt.py WORKDIR BACKEND NUM_WORKERS EVERY [--hold]. Each step appends the batch's
indices to ``WORKDIR/consumed.log`` (one write per line); every ``EVERY`` steps the job
saves ``{"loader": loader.state_dict(), "epoch": ..., "steps": ...}`` to
``WORKDIR/state.pt`` atomically. If that file exists at start, the job resumes from it.
Prints one JSON line at the end: the step it started from and the steps it took. With
``--hold`` it first waits for its standard input to close: a job to be killed is never
found to have ended before the kill, however late it comes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from dataloaderx import DataLoaderX
from tests.helpers import RangeDataset

SIZE = 120
BATCH_SIZE = 4
EPOCHS = 2
STEP_SECONDS = 0.01


def main(workdir: Path, backend: str, num_workers: int, every: int, hold: bool) -> None:
    generator = torch.Generator()
    generator.manual_seed(1234)
    loader = DataLoaderX(
        RangeDataset(SIZE),
        batch_size=BATCH_SIZE,
        shuffle=True,
        generator=generator,
        num_workers=num_workers,
        backend=backend,
    )
    state_path = workdir / "state.pt"
    start_epoch, steps = 0, 0
    if state_path.exists():
        checkpoint = torch.load(state_path, weights_only=True)
        loader.load_state_dict(checkpoint["loader"])
        start_epoch, steps = checkpoint["epoch"], checkpoint["steps"]
    started_at = steps
    log = os.open(workdir / "consumed.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    for epoch in range(start_epoch, EPOCHS):
        for batch in loader:
            time.sleep(STEP_SECONDS)  # the training step
            steps += 1
            os.write(log, (" ".join(str(int(i)) for i in batch[:, 0]) + "\n").encode())
            if steps % every == 0:
                saved = {"loader": loader.state_dict(), "epoch": epoch, "steps": steps}
                torch.save(saved, workdir / "state.tmp")
                os.replace(workdir / "state.tmp", state_path)
    os.close(log)
    if hold:
        sys.stdin.read()
    print(json.dumps({"started_at": started_at, "steps": steps}))


if __name__ == "__main__":
    main(
        Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), "--hold" in sys.argv[5:]
    )
