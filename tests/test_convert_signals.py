"""Ctrl-C, SIGTERM and SIGHUP stop a conversion in one line, leave no process behind, and a rerun completes it
(issue 19, point 9: SIGINT printed tens of lines of KeyboardInterrupt tracebacks, SIGTERM nothing; issue 40:
SIGHUP, from a closed terminal, nothing)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from convert.job.supervise import package_env
from convert.worker import forkserver
from convert.worker.plan import ConvertConfig

from .conftest import ROOT
from .convert_helpers import signal_and_wait
from .test_convert_restart import _committed_videos, _shard_content

INTERRUPTED = "convert: interrupted; rerun the same command to continue\n"
ARGS = ("--workers", "2", "--shards", "3", "--no-progress", "--codec", "lz4")


@contextlib.contextmanager
def _sigint_taken() -> Iterator[None]:
    """A process started within takes SIGINT and SIGHUP as one started from a terminal does, however this test run
    was started.

    A test run started as a background job of a non-interactive shell (``pytest ... &`` in a script) has
    SIGINT ignored, one started under ``nohup`` SIGHUP, and a child inherits that through exec; the job keeps
    a stop signal it was started ignoring (``cli._stop_on_signals``), so a Ctrl-C did nothing and the job ran
    to its end: empty stderr, status 0. A handler of this process's own (SIGINT's), or the default (SIGHUP's:
    the test run ends as it would have without nohup), becomes the default in the child instead.
    """
    ignored = [sig for sig in (signal.SIGINT, signal.SIGHUP) if signal.getsignal(sig) is signal.SIG_IGN]
    for sig in ignored:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    try:
        yield
    finally:
        for sig in ignored:
            signal.signal(sig, signal.SIG_IGN)


def _start(src: str, out: str) -> subprocess.Popen:
    with _sigint_taken():
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


@pytest.mark.parametrize("sig, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGHUP, True)],
                         ids=["ctrl-c", "sigterm-to-the-job", "sighup-to-its-group"])
def test_a_stop_signal_is_one_line_and_a_rerun_completes_the_job(synth_videos, clean_run, tmp_path, sig, to_group):
    """Ctrl-C reaches the job's whole process group (its shard processes and fork server too), and so does a
    closed terminal's SIGHUP (which ends the shard processes as a SIGTERM to the group does, and which the job
    said nothing of: issue 40); ``kill PID`` only the job, which must stop the others itself."""
    out = str(tmp_path / "out")
    proc = _start(synth_videos, out)
    deadline = time.monotonic() + 120
    while proc.poll() is None and _committed_videos(out) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the job ended before it could be interrupted"
    stdout, stderr = signal_and_wait(proc, sig, to_group=to_group, timeout=60, what="the job")
    assert (proc.returncode, stderr, stdout) == (128 + sig, INTERRUPTED, "")
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


@pytest.mark.parametrize("ignored", [signal.SIGINT, signal.SIGHUP], ids=["background-job", "nohup"])
def test_a_stop_signal_the_job_was_started_ignoring_stays_ignored(ignored):
    """``nohup`` (SIGHUP), or a script's background job (its shell ignores SIGINT there): the job keeps ignoring
    it, as every well-behaved program does, while the other stop signals still stop it in one line."""
    from convert.cli import _interrupted, _stop_on_signals
    from convert.signals import STOP_SIGNALS

    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    signal.signal(ignored, signal.SIG_IGN)
    try:
        replaced = _stop_on_signals()
        assert signal.getsignal(ignored) is signal.SIG_IGN
        taken = set(STOP_SIGNALS) - {ignored}
        assert {sig: signal.getsignal(sig) for sig in taken} == dict.fromkeys(taken, _interrupted)
        assert set(replaced) == taken
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


# Runs ``python -m convert`` with the signal sent to itself as convert.cli starts importing: the window
# between the interpreter's start and main's handler, deterministically.
_SIGNAL_WHILE_IMPORTING = """
import importlib.abc, os, runpy, signal, sys

import convert  # the package's own start is before convert/__main__ runs, and not what is tested here


SIG = int(sys.argv[1])


class SignalOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "convert.cli":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), SIG)
        return None


sys.meta_path.insert(0, SignalOnImport())
sys.argv = ["convert", "src", "out"]
runpy.run_module("convert", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["ctrl-c", "sigterm", "sighup"])
def test_a_stop_signal_while_the_command_starts_is_one_line(sig):
    """Before main's handler is in place (importing the command line takes a good part of a second on a busy
    machine): a Ctrl-C printed a KeyboardInterrupt traceback, a SIGTERM ended the job without a word."""
    with _sigint_taken():
        proc = subprocess.Popen([sys.executable, "-c", _SIGNAL_WHILE_IMPORTING, str(int(sig))], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=120)
    assert (proc.returncode, stderr, stdout) == (128 + sig, INTERRUPTED, "")


# The start-up of each command that takes stop signals: (package run with -m, its arguments, its line). Nothing
# of the arguments needs to exist: the signal comes before any of it is read.
STARTS = {"convert": ("convert", ["src", "out"], INTERRUPTED),
          "convert-verify": ("convert", ["verify", "out"], INTERRUPTED),
          "train": ("train", ["--data", "data"], "train: interrupted while starting; nothing was written\n")}

# Runs ``python -m PACKAGE ARGS`` with the signal sent to itself as the first heavy module (numpy, torch, PyAV)
# starts importing, whoever imports it: the package's own __init__ included, which runs before its __main__.
_SIGNAL_AT_FIRST_HEAVY_IMPORT = """
import importlib.abc, os, runpy, sys

SIG, PACKAGE = int(sys.argv[1]), sys.argv[2]
HEAVY = ("numpy", "torch", "av")
if any(name in sys.modules for name in HEAVY):
    sys.exit("imported before the command started: " + ", ".join(n for n in HEAVY if n in sys.modules))


class SignalOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in HEAVY:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), SIG)
        return None


sys.meta_path.insert(0, SignalOnImport())
sys.argv = [PACKAGE, *sys.argv[3:]]
runpy.run_module(PACKAGE, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("start", list(STARTS))
def test_a_stop_signal_as_a_command_imports_numpy_torch_or_pyav_is_one_line(start, sig):
    """``import convert`` imported numpy before convert/__main__ could take the signal, and ``python -m train``
    took none while importing torch: a KeyboardInterrupt traceback, or no word at all for SIGTERM."""
    package, args, line = STARTS[start]
    with _sigint_taken():
        proc = subprocess.Popen([sys.executable, "-c", _SIGNAL_AT_FIRST_HEAVY_IMPORT, str(int(sig)), package, *args],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=120)
    assert (proc.returncode, stderr, stdout) == (128 + sig, line, "")


def test_the_stop_signals_module_imports_the_standard_library_only():
    """``convert.signals`` holds the one stop-signal pair and is imported before a command's heavy imports, so it
    imports no module of the project (whose ``convert.format`` imports numpy) and nothing outside the standard
    library."""
    probe = ("import sys\nbefore = set(sys.modules)\nimport convert.signals\n"
             "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in sys.stdlib_module_names))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['convert', 'convert.signals']"


def _catches(pid: int, sig: int) -> bool | None:
    """Whether the process ``pid`` has a handler for ``sig`` (``SigCgt`` in /proc/PID/status); None when it has
    ended."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
    except (FileNotFoundError, ProcessLookupError):
        return None
    if fields["State"].split()[0] in ("Z", "X"):
        return None
    return bool(int(fields["SigCgt"], 16) >> (sig - 1) & 1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("start", list(STARTS))
def test_a_stop_signal_at_a_commands_start_is_one_line_each_time(start, sig):
    """The real start, without hooks: the signal is sent the moment the process takes SIGTERM (which Python
    leaves at its default: only the command's own handler takes it), while it goes on to import what it
    needs, a few times over. Sooner, the interpreter has not run a line of the project yet, and the signal's
    default action ends it, as it does any program. ``python -m train`` never took SIGTERM before its run."""
    package, args, line = STARTS[start]
    for _ in range(3):
        with _sigint_taken():
            proc = subprocess.Popen([sys.executable, "-m", package, *args], cwd=ROOT, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        while (taken := _catches(proc.pid, signal.SIGTERM)) is not True:
            if taken is None:
                stdout, stderr = proc.communicate()
                pytest.fail(f"python -m {package} ended (status {proc.returncode}) without taking SIGTERM: "
                            f"{stderr[-2000:]}")
            time.sleep(0.001)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
        assert (proc.returncode, stderr, stdout) == (128 + sig, line, "")


def test_no_signal_goes_to_a_forked_process_whose_status_has_come_back(monkeypatch):
    """The job's stop kills every child from the signal handler while their supervisors reap them: a kill
    that loses that race must send nothing, since the pid, and the number of its closed pidfd, may name
    another process by then (it read the pidfd unlocked, and could also get None and raise TypeError)."""
    from convert.worker import forkserver

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    status_r, status_w = os.pipe()
    with open(os.devnull, "wb") as stdin, open(os.devnull, "rb") as stdout:
        proc = forkserver.ForkedProcess(child.pid, stdin, stdout, status_r, ["child"])
        child.communicate()  # it ends and is reaped, as the fork server reaps its children
        os.write(status_w, forkserver._STATUS.pack(0))
        os.close(status_w)
        sent = []
        monkeypatch.setattr(os, "kill", lambda *a: sent.append(a))
        monkeypatch.setattr(signal, "pidfd_send_signal", lambda *a: sent.append(a), raising=False)
        assert proc.wait(timeout=10) == 0
        proc._signal(signal.SIGKILL)  # what a kill() that checked the status just before it came back does
        proc.kill()
    assert sent == []


@pytest.mark.skipif(not forkserver.available(), reason="no fork server on this platform")
def test_a_job_started_under_nohup_keeps_ignoring_sighup_in_its_forked_children(tmp_path):
    """The fork server ignores the stop signals (the job stops it), and its children took SIGHUP back at its
    default: a job started under ``nohup`` would then stop when its terminal closed, its shard processes
    killed by the SIGHUP it was started ignoring. They keep the job's: ignored."""
    forkserver.stop()  # the next spawn starts a server as this job would be started: under nohup
    before = signal.getsignal(signal.SIGHUP)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with open(os.devnull, "wb") as null:
            child = forkserver.spawn([json.dumps(ConvertConfig().to_dict())], env=package_env(),
                                     stderr=null.fileno(), module="convert.worker.probe")
    finally:
        signal.signal(signal.SIGHUP, before)
    assert child is not None
    try:
        child.stdin.write(json.dumps({"path": str(tmp_path / "none.mp4"), "id": "none"}).encode() + b"\n")
        child.stdin.flush()
        assert b"error" in child.stdout.readline()  # answered: its signals are set
        with open(f"/proc/{child.pid}/status") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        assert int(fields["SigIgn"], 16) >> (signal.SIGHUP - 1) & 1
    finally:
        child.stdin.close()
        child.wait(timeout=60)
        forkserver.stop()  # not left for later tests, which are not under nohup
