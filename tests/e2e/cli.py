"""Running the `lmedge` CLI in-process from a test, as a user would from a shell."""

from __future__ import annotations

import pytest

from lmedge.cli import main


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run `lmedge ARGS` in-process; returns (exit code, stdout, stderr)."""
    code = 0
    try:
        main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
