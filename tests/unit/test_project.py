"""Project hygiene that CI must keep: lint and format (the docs: test_docs.py)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_ruff_lint_is_clean() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_ruff_format_is_clean() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
