"""``dataloaderx bench``: argument errors, a tiny run, JSON output and the plot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dataloaderx.bench.errors import BenchError
from dataloaderx.cli import main

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
    assert lines[-1].startswith(("use DataLoaderX", "keep DataLoader", "no backend helps"))
    assert any("depth min/med/max" in line and "held MiB" in line for line in lines)


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


def test_plot_writes_a_png(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    pytest.importorskip("matplotlib")
    target = f"{tmp_path}/bench.png"
    code, _, err = run_cli(capsys, *TINY, *FAST, "--backends", "thread", "--plot", target)
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
