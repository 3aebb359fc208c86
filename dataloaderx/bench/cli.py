"""Arguments and entry point of ``dataloaderx bench``."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from dataloaderx.bench import workload
from dataloaderx.bench.errors import BenchError
from dataloaderx.bench.loading import load_dataset, load_step
from dataloaderx.bench.plot import pyplot, save_plot
from dataloaderx.bench.report import as_json, as_table
from dataloaderx.bench.runner import BenchConfig, run_bench
from dataloaderx.bench.tune import report as tune_report
from dataloaderx.bench.tune.cluster import connect_cluster, ray_reason
from dataloaderx.bench.tune.measure import Workload
from dataloaderx.bench.tune.plot import save_plot as save_tune_plot
from dataloaderx.bench.tune.tuner import TuneConfig, run_tune
from dataloaderx.engine.buffer_options import AUTO, check_depth, check_max_bytes
from dataloaderx.registry import available_backends, registered_backends
from dataloaderx.util.suggest import did_you_mean, quoted
from dataloaderx.workers.elastic.bounds import AUTO as ELASTIC
from dataloaderx.workers.method import RAY

__all__ = ["add_arguments", "run"]

N = TypeVar("N", int, float)

#: Batches per run when a user dataset is given without ``--batches``.
USER_BATCHES = 50
#: Runs per loader without ``--rounds``.
ROUNDS = 3
#: Seconds ``--tune`` takes without ``--budget``.
TUNE_BUDGET = 60.0
#: Options that ``--tune`` sets itself.
_NOT_WITH_TUNE = {
    "rounds": "--rounds (the sweep runs the leaders as often as --budget allows)",
    "depth": "--depth (the sweep tries depth=2 and depth='auto')",
    "max_bytes": "--max-bytes",
}


def _number(
    convert: Callable[[str], N], accept: Callable[[N], bool], expected: str
) -> Callable[[str], N]:
    """An argparse type: ``convert(text)``, refused unless ``accept`` holds for it."""

    def parse(text: str) -> N:
        try:
            value: N | None = convert(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


_positive_int = _number(int, lambda value: value > 0, "a positive integer")
_non_negative_int = _number(int, lambda value: value >= 0, "an integer >= 0")
_budget = _number(
    float, lambda value: math.isfinite(value) and value > 0, "a positive number of seconds"
)


def _num_workers(text: str) -> int | str:
    if text == ELASTIC:
        return text
    try:
        return _non_negative_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 0 or {ELASTIC!r}, got {text!r}"
        ) from None


def _depth(text: str) -> int | str:
    try:
        return check_depth("bench", "--depth", text if text == AUTO else int(text))
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected a positive integer or 'auto', got {text!r}"
        ) from None


def _max_bytes(text: str) -> int:
    try:
        size = check_max_bytes("bench", "--max-bytes", text)
    except ValueError:
        size = None
    if size is None:
        raise argparse.ArgumentTypeError(
            f"expected a size such as 2GiB, 512MiB or 1000000, got {text!r}"
        )
    return size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to ``parser``."""
    parser.add_argument(
        "--dataset",
        metavar="MODULE:FACTORY",
        help="profile your dataset: FACTORY() returns a torch Dataset (default: an embedded "
        "synthetic image dataset)",
    )
    parser.add_argument(
        "--step",
        metavar="MODULE:FN",
        help="training step FN(batch) to time (default: a 20 ms GIL-releasing wait)",
    )
    parser.add_argument("--batch-size", type=_positive_int, default=workload.DEFAULT_BATCH_SIZE)
    parser.add_argument(
        "--num-workers",
        type=_num_workers,
        default=0,
        help="your num_workers (default 0); above 0, each backend runs with worker processes "
        "and with worker threads (worker_method='thread'); 'auto': each backend with elastic "
        "worker threads (and elastic Ray workers with --worker-method ray), against "
        "DataLoader with a worker process per core",
    )
    parser.add_argument(
        "--worker-method",
        choices=[RAY],
        help="also run each backend with Ray workers (worker_method='ray'; needs "
        "pip install 'dataloaderx[ray]', and --num-workers above 0 or 'auto' without "
        "--tune): a Ray already initialised, RAY_ADDRESS's cluster, or a local one; each "
        "run starts its actors; with --tune, Ray workers are weighed up to the cluster's CPUs",
    )
    parser.add_argument(
        "--batches",
        type=_positive_int,
        help=f"batches per run (default: {workload.DEFAULT_BATCHES}, or {USER_BATCHES} "
        "with --dataset)",
    )
    parser.add_argument(
        "--backends",
        metavar="NAME[,NAME...]",
        help="comma-separated backends to compare with DataLoader (default: all available)",
    )
    parser.add_argument(
        "--rounds", type=_positive_int, help=f"runs per loader, alternated (default {ROUNDS})"
    )
    parser.add_argument(
        "--depth",
        type=_depth,
        help="depth for every backend that takes one: a number of batches or 'auto' "
        "(default: each backend's own)",
    )
    parser.add_argument(
        "--max-bytes",
        type=_max_bytes,
        metavar="SIZE",
        help="cap on the bytes buffered, for every backend that takes one, e.g. 2GiB",
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="sweep num_workers with worker processes and threads (and Ray workers with "
        "--worker-method ray, RAY_ADDRESS or a Ray initialised), backends, depth (and "
        "pin_memory with an accelerator) within --budget and print the best setting as code",
    )
    parser.add_argument(
        "--budget",
        type=_budget,
        metavar="SECONDS",
        help=f"with --tune: seconds for the whole sweep (default {TUNE_BUDGET:.0f})",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--plot", metavar="OUT.png", help="save a chart (needs matplotlib)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")


def _backends(text: str | None) -> tuple[str, ...]:
    available = available_backends()
    if text is None:
        return tuple(available)
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise BenchError("--backends needs at least one backend name")
    for name in names:
        if name not in available:
            known = registered_backends()
            why = "is not available on this machine" if name in known else "is not a backend"
            raise BenchError(
                f"--backends: {name!r} {why}; available: {quoted(available)}"
                f"{did_you_mean(name, available)}"
            )
    return names


def _workload(args: argparse.Namespace) -> Workload:
    if args.dataset is None:
        dataset: Any = workload.default_dataset()
        batches = args.batches or workload.DEFAULT_BATCHES
    else:
        dataset = load_dataset(args.dataset)
        batches = args.batches or USER_BATCHES
    step: Callable[[Any], object] = (
        workload.fake_step if args.step is None else load_step(args.step)
    )
    return Workload(dataset, step, args.batch_size, batches)


def _config(args: argparse.Namespace) -> BenchConfig:
    if args.budget is not None:
        raise BenchError("--budget applies to --tune only: add --tune, or leave --budget out")
    if args.worker_method is not None and args.num_workers == 0:
        raise BenchError(
            f"--worker-method {args.worker_method} needs a number of workers: "
            f"--num-workers {args.num_workers} has none; give --num-workers 2 (or more)"
        )
    run = _workload(args)
    return BenchConfig(
        dataset=run.dataset,
        step=run.step,
        batch_size=run.batch_size,
        num_workers=args.num_workers,
        batches=run.batches,
        backends=_backends(args.backends),
        rounds=args.rounds or ROUNDS,
        depth=args.depth,
        max_bytes=args.max_bytes,
        extra_methods=() if args.worker_method is None else (args.worker_method,),
    )


def _tune_config(args: argparse.Namespace) -> TuneConfig:
    for option, name in _NOT_WITH_TUNE.items():
        if getattr(args, option) is not None:
            raise BenchError(f"{name} does not apply with --tune: leave it out")
    if args.num_workers == ELASTIC:
        raise BenchError(
            f"--tune tries num_workers={ELASTIC!r} itself, against your own count: give "
            "--num-workers the count you use now, or leave it out"
        )
    run = _workload(args)
    needed = run.batches * run.batch_size
    size = len(run.dataset) if hasattr(run.dataset, "__len__") else None
    if size is not None and size < needed:
        raise BenchError(
            f"--tune runs {run.batches} batches of {run.batch_size} ({needed} items) per "
            f"setting, but the dataset has {size} items: pass --batches "
            f"{size // run.batch_size or 1} or less, or a smaller --batch-size"
        )
    backends = _backends(args.backends)
    reason = ray_reason(asked=args.worker_method == RAY)
    return TuneConfig(
        run,
        backends,
        num_workers=args.num_workers,
        budget_seconds=args.budget or TUNE_BUDGET,
        ray=None if reason is None else connect_cluster(reason),
    )


def _bench(args: argparse.Namespace) -> int:
    config: BenchConfig | TuneConfig = _tune_config(args) if args.tune else _config(args)
    if args.plot is not None:
        pyplot()  # fail before running, not after
    try:
        if isinstance(config, TuneConfig):
            tuned = run_tune(config, progress=not args.no_progress)
            print(tune_report.as_json(tuned) if args.json else tune_report.as_table(tuned))
        else:
            result = run_bench(config, progress=not args.no_progress)
            print(as_json(result) if args.json else as_table(result))
    except BenchError:
        raise
    except Exception as exc:
        raise BenchError(f"the benchmark run failed: {exc!r}") from exc
    if args.plot is not None:
        if isinstance(config, TuneConfig):
            save_tune_plot(tuned, args.plot)
        else:
            save_plot(result, args.plot)
        print(f"plot saved to {args.plot}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; return the exit code (2 for a bad input)."""
    try:
        return _bench(args)
    except BenchError as exc:
        if args.debug:
            raise
        print(f"dataloaderx bench: error: {exc}", file=sys.stderr)
        return 2
