"""``dataloaderx bench``: measure whether a training loop waits for data, per backend."""

from dataloaderx.bench.runner import BenchConfig, BenchResult, Contestant, RunResult, run_bench

__all__ = ["BenchConfig", "BenchResult", "Contestant", "RunResult", "run_bench"]
