"""Print a :class:`~dataloaderx.bench.tune.tuner.TuneResult` as a table or as JSON."""

from __future__ import annotations

import json
from typing import Any

from dataloaderx.bench.report import fixed_width, without_column
from dataloaderx.bench.runner import WORKER_NAMES, workers_text
from dataloaderx.bench.tune.grid import Setting
from dataloaderx.bench.tune.memory import MEMORY_HINT
from dataloaderx.bench.tune.tuner import TuneResult, as_code, as_yaml
from dataloaderx.workers.elastic.bounds import AUTO

__all__ = ["as_json", "as_table", "verdict"]

_MIB = 1024**2
_COLUMNS = (
    "loader",
    "workers",
    "depth",
    "pin",
    "batches/s",
    "of ceiling",
    "vs DataLoader",
    "step",
    "first batch ms",
    "actors start ms",
    "peak MiB",
    "runs",
)


def _row(result: TuneResult, setting: Setting) -> dict[str, Any]:
    runs = result.sweep.runs[setting]
    rate = result.rate(setting)
    peak = result.peak_bytes(setting)
    startup = result.startup_seconds(setting)
    return {
        "loader": setting.loader,
        "num_workers": AUTO if setting.elastic else setting.num_workers,
        "worker_method": setting.worker_method,
        "depth": setting.depth,
        "pin_memory": setting.pin_memory,
        "batches_per_second": rate,
        "share_of_ceiling": rate / result.ceiling.rate if result.ceiling.rate > 0 else None,
        "speedup_vs_dataloader": rate / result.rate(result.own),
        "step_slowdown": result.step_slowdown(setting),
        "first_batch_ms": 1000 * min(run.first_batch_seconds for run in runs),
        "actors_start_ms": None if startup is None else 1000 * startup,
        "peak_bytes": peak,
        "runs_batches_per_second": [run.rate for run in runs],
        "pruned": setting not in result.sweep.leaders,
    }


def _rows(result: TuneResult) -> list[dict[str, Any]]:
    return [_row(result, setting) for setting in result.sweep.ranked()]


def verdict(result: TuneResult) -> list[str]:
    """The answer in words: the setting to use, the runner-up, the ceiling, the neighbour."""
    answer = result.answer()
    batch_size = result.config.workload.batch_size
    best = answer.best
    runs = len(result.sweep.runs[best])
    cluster = result.config.ray
    lines = [
        f"use (the best median of {runs} run{'s' * (runs > 1)}):",
        f"    {as_code(best, batch_size)}",
        "or, as YAML for DataLoaderX.from_config:",
        *(f"    {line}" for line in as_yaml(best, batch_size, cluster).splitlines()),
    ]
    startup = result.startup_seconds(best)
    if startup is not None:
        lines.append(
            f"its Ray actors took {startup:.1f} s to start (once per loader: they are kept "
            "between epochs)"
        )
    if answer.runner_up is not None:
        line = f"runner-up: {answer.runner_up.label}, {100 * answer.margin:.1f}% slower"
        if answer.spread is None:
            line += "; one run of one of them: too few to tell from noise (raise --budget)"
        elif answer.within_noise:
            line += f": within noise (their runs spread {100 * answer.spread:.1f}%)"
        else:
            line += f" (their runs spread {100 * answer.spread:.1f}%)"
        lines.append(line)
    ceiling = result.ceiling.rate
    rate = result.rate(best)
    if rate >= ceiling:
        lines.append(f"data loading costs you nothing measurable: {rate:.1f} batches/s reaches "
                     f"the ceiling of {ceiling:.1f}")  # fmt: skip
    else:
        lines.append(
            f"data loading costs you {100 * (1 - rate / ceiling):.0f}% of what your step "
            f"allows ({rate:.1f} of {ceiling:.1f} batches/s)"
        )
    elastic = _elastic(result)
    if elastic:
        lines.append(elastic)
    memory = _memory(result, best, answer.runner_up)
    if memory:
        lines.append(memory)
    noisy = result.noisiest()
    if noisy is not None:
        lines.append(
            f"the step ran {100 * result.step_slowdown(noisy):.0f}% slower with "
            f"{noisy.label} running"
        )
    return lines


def _elastic(result: TuneResult) -> str:
    """Whether ``num_workers="auto"`` beat the best fixed count, where it ran."""
    runs = result.sweep.runs
    elastic = next((setting for setting in runs if setting.elastic), None)
    if elastic is None:
        return ""
    fixed = max((setting for setting in runs if not setting.elastic), key=result.rate)
    rate, against = result.rate(elastic), result.rate(fixed)
    line = (
        f"num_workers='auto' (worker threads): {rate:.1f} batches/s against "
        f"{against:.1f} for the best fixed setting ({fixed.label}): "
    )
    if result.answer().best.elastic:
        return line + "ahead: the setting above"
    return line + (
        "not ahead: keep the fixed count (over a run this short the pool mostly ran at its "
        "start, the cores; it resizes while training runs)"
    )


def _memory(result: TuneResult, best: Setting, runner_up: Setting | None) -> str:
    """The peak memory of the answer and of the runner-up, where it was measured."""
    peak = result.peak_bytes(best)
    if peak is None:
        return ""
    line = f"peak memory: {peak / _MIB:.0f} MiB with it"
    other = None if runner_up is None else result.peak_bytes(runner_up)
    if other is not None:
        line += f", {other / _MIB:.0f} MiB with the runner-up"
    return line


def _header(result: TuneResult) -> list[str]:
    sweep = result.sweep
    config = result.config
    counts = "; ".join(
        f"{', '.join(str(count) for count in tried)} ({WORKER_NAMES[method]})"
        for method, tried in sweep.worker_counts.items()
    )
    lines = [
        f"tune: {len(sweep.runs)} settings in {sweep.seconds:.0f} s of a "
        f"{config.budget_seconds:.0f} s budget; {len(sweep.pruned())} pruned after the first "
        f"round, {len(sweep.leaders)} leaders ran {sweep.rounds} more round"
        f"{'s' * (sweep.rounds != 1)}",
        f"batch_size={config.workload.batch_size}, {config.workload.batches} batches per run; "
        f"num_workers tried: {counts}",
    ]
    if sweep.cut_short:
        lines.append(sweep.cut_short)
    if config.ray is not None:
        lines.append(
            f"{config.ray.describe()}; Ray actors are measured on epochs after the first, "
            "each setting's actors kept between its runs; their start-up (until each "
            "actor made a batch of the first) is in actors start ms"
        )
    ceiling = result.ceiling
    lines.append(
        f"ceiling: {ceiling.rate:.1f} batches/s (your step on cached batches, nothing "
        f"loading; step {1000 * ceiling.step_seconds:.1f} ms)"
    )
    lines.append(
        f"vs DataLoader: against DataLoader with your settings ({result.own.label}); "
        "step: the step's time during the runs against its time alone"
    )
    return lines


def as_table(result: TuneResult) -> str:
    """A fixed-width table, best first, then the verdict."""
    columns: tuple[str, ...] = _COLUMNS
    body: list[tuple[str, ...]] = [
        (
            str(row["loader"]),
            workers_text(row["num_workers"], row["worker_method"]),
            "-" if row["depth"] is None else str(row["depth"]),
            "yes" if row["pin_memory"] else "no",
            f"{row['batches_per_second']:.1f}",
            "-" if row["share_of_ceiling"] is None else f"{100 * row['share_of_ceiling']:.0f}%",
            f"{row['speedup_vs_dataloader']:.2f}x",
            f"{round(100 * row['step_slowdown']):+d}%",
            f"{row['first_batch_ms']:.0f}",
            "-" if row["actors_start_ms"] is None else f"{row['actors_start_ms']:.0f}",
            "-" if row["peak_bytes"] is None else f"{row['peak_bytes'] / _MIB:.0f}",
            f"{len(row['runs_batches_per_second'])}{' (pruned)' * row['pruned']}",
        )
        for row in _rows(result)
    ]
    if len(result.grid.pin_memory) == 1:  # no accelerator: pin_memory is not swept
        columns, body = without_column(columns, body, "pin")
    if result.config.ray is None:
        columns, body = without_column(columns, body, "actors start ms")
    lines = fixed_width(columns, body)
    notes = [] if any(cells[-2] != "-" for cells in body) else [MEMORY_HINT]
    return "\n".join([*_header(result), "", *lines, *notes, "", *verdict(result)])


def as_json(result: TuneResult) -> str:
    """The same figures as :func:`as_table`, machine-readable."""
    answer = result.answer()
    batch_size = result.config.workload.batch_size
    sweep = result.sweep
    cluster = result.config.ray
    document = {
        "config": {
            "batch_size": batch_size,
            "batches_per_run": result.config.workload.batches,
            "num_workers": result.config.num_workers,
            "backends": list(result.config.backends),
            "budget_seconds": result.config.budget_seconds,
        },
        "sweep": {
            "seconds": sweep.seconds,
            "worker_counts": dict(sweep.worker_counts),
            "rounds_after_first": sweep.rounds,
            "cut_short": sweep.cut_short or None,
        },
        "ceiling": {
            "batches_per_second": result.ceiling.rate,
            "step_ms": 1000 * result.ceiling.step_seconds,
        },
        "results": _rows(result),
        "recommendation": {
            "setting": answer.best.label,
            "code": as_code(answer.best, batch_size),
            "yaml": as_yaml(answer.best, batch_size, cluster),
            "num_workers": answer.best.num_workers,
            "worker_method": answer.best.worker_method,
            "peak_bytes": result.peak_bytes(answer.best),
            "actors_start_ms": _row(result, answer.best)["actors_start_ms"],
            "ray_cluster": None if cluster is None else cluster.as_dict(),
            "runner_up": None if answer.runner_up is None else answer.runner_up.label,
            "margin": answer.margin,
            "spread": answer.spread,
            "within_noise": answer.within_noise,
        },
        "verdict": verdict(result),
    }
    return json.dumps(document, indent=2)
