"""Arguments and entry point of ``dataloaderx bench``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from dataloaderx.bench import workload
from dataloaderx.bench.errors import BenchError
from dataloaderx.bench.loading import load_dataset, load_step
from dataloaderx.bench.report import as_json, as_table
from dataloaderx.bench.runner import BenchConfig, run_bench
from dataloaderx.engine.buffer_options import AUTO, check_depth, check_max_bytes
from dataloaderx.registry import available_backends, registered_backends
from dataloaderx.util.suggest import did_you_mean, quoted

__all__ = ["add_arguments", "run"]

#: Batches per run when a user dataset is given without ``--batches``.
USER_BATCHES = 50


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


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
    parser.add_argument("--num-workers", type=_non_negative_int, default=0)
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
        "--rounds", type=_positive_int, default=3, help="runs per loader, alternated"
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


def _config(args: argparse.Namespace) -> BenchConfig:
    backends = _backends(args.backends)
    if args.dataset is None:
        dataset: Any = workload.default_dataset()
        batches = args.batches or workload.DEFAULT_BATCHES
    else:
        dataset = load_dataset(args.dataset)
        batches = args.batches or USER_BATCHES
    step: Callable[[Any], object] = (
        workload.fake_step if args.step is None else load_step(args.step)
    )
    return BenchConfig(
        dataset=dataset,
        step=step,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        batches=batches,
        backends=backends,
        rounds=args.rounds,
        depth=args.depth,
        max_bytes=args.max_bytes,
    )


def _bench(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.plot is not None:
        from dataloaderx.bench.plot import _pyplot

        _pyplot()  # fail before running, not after
    try:
        result = run_bench(config, progress=not args.no_progress)
    except BenchError:
        raise
    except Exception as exc:
        raise BenchError(f"the benchmark run failed: {exc!r}") from exc
    print(as_json(result) if args.json else as_table(result))
    if args.plot is not None:
        from dataloaderx.bench.plot import save_plot

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
