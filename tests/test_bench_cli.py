"""``dataloaderx bench``: argument errors, a tiny run, JSON output and the plot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dataloaderx.bench.errors import BenchError
from dataloaderx.bench.loading import load_dataset
from dataloaderx.bench.report import as_json, as_table
from dataloaderx.bench.runner import (
    BASELINE,
    BenchConfig,
    BenchResult,
    Contestant,
    RunResult,
    baseline_workers,
    run_bench,
)
from dataloaderx.cli import main
from dataloaderx.workers.method import MULTIPROCESSING, THREAD
from tests import bench_fixtures

pytestmark = pytest.mark.timeout(60)

TINY = ["--dataset", "tests.bench_fixtures:tiny", "--step", "tests.bench_fixtures:noop"]
FAST = ["--batches", "2", "--rounds", "1", "--no-progress"]


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["bench", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_parses(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, *TINY, *FAST, "--json", "--backends", "thread,sync")
    assert code == 0
    document = json.loads(out)
    assert [row["loader"] for row in document["results"]] == ["DataLoader", "thread", "sync"]
    assert all(row["batches"] == 2 for row in document["results"])
    assert document["config"]["batches"] == 2
    assert document["best"] in {"DataLoader", "thread", "sync"}
    assert document["recommendation"]
    modes = {row["loader"]: row["mode"] for row in document["results"]}
    assert modes["DataLoader"] is None
    assert modes["sync"] is None
    assert modes["thread"].startswith(("prefetch (", "inline ("))
    assert modes["thread"].endswith(" of 2 batches prefetched")


def test_default_workload_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, *FAST, "--batch-size", "2")
    assert code == 0
    lines = out.splitlines()
    assert any(line.startswith("loader ") and "stall %" in line for line in lines)
    assert any(line.startswith("DataLoader ") for line in lines)
    assert any(line.startswith("thread ") for line in lines)
    assert any(line.startswith(("thread ran prefetch (", "thread ran inline (")) for line in lines)
    # the verdict ends the output, or its one line of buffer advice follows it
    if not lines[-1].startswith(("use DataLoaderX", "keep DataLoader", "no backend helps")):
        assert lines[-1].startswith(("the producer idled", "depth='auto' used", "the buffer held"))
        assert lines[-2].startswith("use DataLoaderX")
    assert any("depth min/med/max" in line and "held MiB" in line for line in lines)
    header = next(line for line in lines if line.startswith("loader "))
    assert header.split()[:3] == ["loader", "epoch", "s"]  # no workers: no worker column
    assert not any("(threads)" in line or "worker_method" in line for line in lines)


def test_with_workers_each_backend_runs_with_processes_and_with_threads() -> None:
    config = BenchConfig(
        dataset=load_dataset("tests.bench_fixtures:tiny"),
        step=bench_fixtures.noop,
        batch_size=4,
        num_workers=2,
        batches=2,
        backends=("thread", "sync"),
        rounds=1,
    )
    result = run_bench(config, progress=False)
    document = json.loads(as_json(result))
    rows = [(row["loader"], row["worker_method"]) for row in document["results"]]
    assert rows == [
        (BASELINE, MULTIPROCESSING),  # DataLoader has worker processes only
        ("thread", MULTIPROCESSING),
        ("thread", THREAD),
        ("sync", MULTIPROCESSING),
        ("sync", THREAD),
    ]
    assert all(row["batches"] == 2 for row in document["results"])
    assert document["results"][0]["speedup_vs_dataloader"] == 1.0
    best = (document["best"], document["best_worker_method"])
    assert best in rows
    lines = as_table(result).splitlines()
    assert lines[2].split()[:2] == ["loader", "workers"]
    cells = [line.split()[:3] for line in lines[4:9]]
    assert cells == [
        [BASELINE, "2", "processes"],
        ["thread", "2", "processes"],
        ["thread", "2", "threads"],
        ["sync", "2", "processes"],
        ["sync", "2", "threads"],
    ]
    assert any(line.startswith("thread (threads) ran ") for line in lines)
    assert any(line.startswith("thread (processes) ran ") for line in lines)


def made_bench(seconds: dict[Contestant, float]) -> BenchResult:
    """A comparison whose runs took ``seconds`` (no stats), without running anything."""
    config = BenchConfig(bench_fixtures.tiny(), bench_fixtures.noop, 4, 2, 10, ("thread",))
    runs = {who: [RunResult(who.label, time, 10, 0.0, 0.01)] for who, time in seconds.items()}
    return BenchResult(config, runs)


def test_the_recommendation_names_worker_threads_when_they_win() -> None:
    baseline = Contestant(BASELINE, 2)
    processes, threads = Contestant("thread", 2), Contestant("thread", 2, THREAD)
    result = made_bench({baseline: 2.0, processes: 1.5, threads: 1.0})
    assert result.recommendation() == (
        "use DataLoaderX(backend='thread', worker_method='thread'): 2.00x DataLoader's throughput"
    )
    assert threads.label == "thread (threads)"
    assert json.loads(as_json(result))["best_worker_method"] == THREAD
    processes_win = made_bench({baseline: 2.0, processes: 1.0, threads: 1.5})
    assert processes_win.recommendation() == (
        "use DataLoaderX(backend='thread'): 2.00x DataLoader's throughput"
    )


def test_depth_and_max_bytes_reach_every_backend_that_takes_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(
        capsys, *TINY, *FAST, "--json", "--backends", "thread,sync", "--depth", "auto",
        "--max-bytes", "1KiB",
    )  # fmt: skip
    assert code == 0
    document = json.loads(out)
    assert document["config"]["depth"] == "auto"
    assert document["config"]["max_bytes"] == 1024
    rows = {row["loader"]: row for row in document["results"]}
    assert rows["thread"]["depth_min"] == 2  # depth='auto' starts at 2
    assert 0 < rows["thread"]["peak_bytes_held"] <= 1024
    assert rows["sync"]["depth_min"] is None  # sync has no buffer
    assert rows["DataLoader"]["peak_bytes_held"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backends", "thraed"], "'thraed' is not a backend; available: "),
        (["--backends", ","], "--backends needs at least one backend name"),
        (["--dataset", "no_such_module_xyz:make"], "cannot import module 'no_such_module_xyz'"),
        (["--dataset", "tests.bench_fixtures"], "--dataset must look like MODULE:NAME"),
        (["--dataset", "tests.bench_fixtures:missing"], "has no attribute 'missing'"),
        (["--dataset", "tests.bench_fixtures:NOT_CALLABLE"], "42, which is not callable"),
        (["--dataset", "tests.bench_fixtures:empty"], "returned an empty dataset"),
        (["--dataset", "tests.bench_fixtures:not_a_dataset"], "returned int, not a Dataset"),
        (["--dataset", "tests.bench_fixtures:broken"], "the data directory is missing"),
        ([*TINY[:2], "--step", "tests.bench_fixtures:nope"], "has no attribute 'nope'"),
    ],
)
def test_bad_input_is_a_clear_error_with_exit_code_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, *args, *FAST)
    assert code == 2
    assert out == ""
    assert err.startswith("dataloaderx bench: error: ")
    assert message in err
    assert "Traceback" not in err


def test_debug_shows_the_exception() -> None:
    with pytest.raises(BenchError, match="empty dataset"):
        main(["bench", "--dataset", "tests.bench_fixtures:empty", "--debug", *FAST])


@pytest.mark.parametrize(
    "args",
    [
        ["--batch-size", "0"],
        ["--num-workers", "-1"],
        ["--num-workers", "atuo"],
        ["--batches", "x"],
        ["--depth", "0"],
        ["--depth", "deep"],
        ["--max-bytes", "2 lots"],
        ["--max-bytes", "0"],
    ],
)
def test_bad_numbers_are_rejected_by_the_parser(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *args])
    assert exit_info.value.code == 2
    assert "expected " in capsys.readouterr().err


def test_auto_runs_each_backend_with_elastic_threads_against_a_process_per_core() -> None:
    config = BenchConfig(
        dataset=load_dataset("tests.bench_fixtures:tiny"),
        step=bench_fixtures.noop,
        batch_size=4,
        num_workers="auto",
        batches=2,
        backends=("thread", "sync"),
        rounds=1,
    )
    result = run_bench(config, progress=False)
    document = json.loads(as_json(result))
    rows = [
        (row["loader"], row["num_workers"], row["worker_method"]) for row in document["results"]
    ]
    cores = baseline_workers("auto")
    assert rows == [
        (BASELINE, cores, MULTIPROCESSING),
        ("thread", "auto", THREAD),
        ("sync", "auto", THREAD),
    ]
    lines = as_table(result).splitlines()
    cells = [line.split()[:3] for line in lines[4:7]]
    assert cells == [
        [BASELINE, str(cores), "processes" if cores > 1 else "process"],
        ["thread", "auto", "threads"],
        ["sync", "auto", "threads"],
    ]
    assert any(
        line.startswith("thread (auto threads) ran ") and "threads over the epoch" in line
        for line in lines
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tune", "--num-workers", "auto"], "--tune tries num_workers='auto' itself"),
        (["--worker-method", "ray", "--num-workers", "0"], "--num-workers 0 has none"),
    ],
)
def test_auto_where_it_does_not_apply_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, *TINY, "--no-progress", *args)
    assert code == 2
    assert out == ""
    assert message in err


@pytest.mark.parametrize("workers", ["0", "2", "auto"])
def test_plot_writes_a_png(
    capsys: pytest.CaptureFixture[str], tmp_path: object, workers: str
) -> None:
    pytest.importorskip("matplotlib")
    target = f"{tmp_path}/bench.png"
    code, _, err = run_cli(
        capsys, *TINY, *FAST, "--backends", "thread", "--num-workers", workers, "--plot", target
    )
    assert code == 0, err
    with open(target, "rb") as file:
        assert file.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run_cli(capsys, *TINY, *FAST, "--plot", "x.png")
    assert code == 2
    assert "pip install 'dataloaderx[plot]'" in err
    assert out == ""  # it fails before running


def test_progress_falls_back_to_plain_text_without_tqdm(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    code = main(["bench", *TINY, "--batches", "1", "--rounds", "1", "--backends", "sync"])
    err = capsys.readouterr().err
    assert code == 0
    assert "running DataLoader (round 1/1) ..." in err
    assert "running sync (round 1/1) ..." in err


def test_python_dash_m_entry_point() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "dataloaderx", "bench", "--backends", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2
    assert "dataloaderx bench: error: --backends: 'nope' is not a backend" in completed.stderr
    assert "Traceback" not in completed.stderr
