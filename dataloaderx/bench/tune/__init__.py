"""``dataloaderx bench --tune``: sweep the loader settings within a time budget."""

from dataloaderx.bench.tune.tuner import TuneConfig, TuneResult, run_tune

__all__ = ["TuneConfig", "TuneResult", "run_tune"]
