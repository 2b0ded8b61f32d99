"""Ctrl-C and SIGTERM stop a conversion in one line, leave no process behind, and a rerun completes it
(issue 19, point 9: SIGINT printed tens of lines of KeyboardInterrupt tracebacks, SIGTERM nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from .conftest import ROOT
from .test_convert_restart import _committed_videos, _shard_content

ARGS = ("--workers", "2", "--shards", "3", "--no-progress", "--codec", "lz4")


def _start(src: str, out: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "convert", src, out, *ARGS], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _session(sid: int) -> list[str]:
    """The live processes of session ``sid`` (the job was started as its leader): 'pid command' each."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    command = fh.read().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{name} {command}")
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended while we looked
    return found


@pytest.fixture(scope="module")
def clean_run(synth_videos, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("clean") / "out")
    proc = _start(synth_videos, out)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    return out


@pytest.mark.parametrize("sig, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGTERM, True)],
                         ids=["ctrl-c", "sigterm-to-the-job", "sigterm-to-its-group"])
def test_a_stop_signal_is_one_line_and_a_rerun_completes_the_job(synth_videos, clean_run, tmp_path, sig, to_group):
    """Ctrl-C reaches the job's whole process group (its shard processes and fork server too); ``kill PID``
    only the job, which must stop the others itself."""
    out = str(tmp_path / "out")
    proc = _start(synth_videos, out)
    deadline = time.monotonic() + 120
    while proc.poll() is None and _committed_videos(out) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the job ended before it could be interrupted"
    if to_group:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the job did not stop within 60 s of the signal")
    assert stderr == "convert: interrupted; rerun the same command to continue\n"
    assert proc.returncode == 128 + sig
    assert stdout == ""
    deadline = time.monotonic() + 10
    while _session(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _session(proc.pid) == []  # no shard process, probe or fork server left running
    # Nothing in the logs of the shard processes either (they ignore SIGINT, or die of SIGTERM quietly).
    logs = os.path.join(out, "logs")
    for name in os.listdir(logs) if os.path.isdir(logs) else []:
        assert "Traceback" not in open(os.path.join(logs, name), errors="replace").read(), name
    assert _committed_videos(out) < 20
    rerun = _start(synth_videos, out)
    _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr
    assert _shard_content(out) == _shard_content(clean_run)
