"""Helpers the conversion tests share: running ``python -m convert`` as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from .conftest import ROOT


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m convert ARGS`` from the worktree root, output captured, extra environment merged in."""
    return subprocess.run([sys.executable, "-m", "convert", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def popen_cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    """The same, started in its own session (so a test can kill the job and its shard processes)."""
    return subprocess.Popen([sys.executable, "-m", "convert", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})},
                            start_new_session=True)


def signal_and_wait(proc: subprocess.Popen, sig: int, *, to_group: bool, timeout: float,
                    what: str) -> tuple[str, str]:
    """Send ``sig`` to ``proc`` (or its process group) and wait for its (stdout, stderr); after ``timeout``
    seconds the group is killed and the test fails, saying ``what`` did not stop."""
    (os.killpg if to_group else os.kill)(proc.pid, sig)
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{what} did not stop within {timeout:g} s of the signal")
