"""The ``dataloaderx`` command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dataloaderx.cli import main


def test_backends_lists_every_backend_with_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "thread\n" in out
    assert "background (aliases: prefetch_generator)" in out
    assert "sync (aliases: none)" in out
    assert (
        "options: depth: int | Literal['auto'] = 2, max_depth: int | None = None, "
        "max_bytes: int | str | None = None, adaptive: bool = True"
    ) in out
    assert (
        'Prefetch up to ``depth`` batches (or ``"auto"``) in a background thread, while that pays.'
        in out
    )
    assert "on unless adaptive=False" in out


def test_module_entry_point_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dataloaderx", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "backends" in result.stdout


def test_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err
