"""Helpers shared by the benchmark scripts (imported as a sibling module: the scripts run as
``python benchmarks/<script>.py``, which puts this folder on sys.path)."""

from __future__ import annotations

import os
import subprocess


def run_commit() -> str:
    """The commit a report describes: OPENKDA_COMMIT when set (scripts/gpu_check.sh sets it, and
    the device machine's copy of .git can be stale), else ``git rev-parse --short HEAD``."""
    commit = os.environ.get("OPENKDA_COMMIT")
    if commit:
        return commit
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return subprocess.check_output(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                                       stderr=subprocess.DEVNULL, text=True).strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
