"""Shard processes forked by the fork server behave as ``python -m convert.worker.shard_worker`` does."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess

import pytest

from convert.job.run import JobOptions, run_job
from convert.job.supervise import ShardOptions, _Child, last_error
from convert.worker import forkserver
from convert.worker.plan import ConvertConfig, Plan, load_plan

pytestmark = pytest.mark.skipif(not forkserver.available(), reason="no fork server on this platform")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, videos) -> tuple[str, dict]:
    """A finished one-shard conversion of one shared video, and its manifest."""
    root = tmp_path_factory.mktemp("fs")
    (root / "videos" / "a").mkdir(parents=True)
    os.symlink(videos.path("mmaction2__part_0.mp4"), root / "videos" / "a" / "v.mp4")
    out = str(root / "out")
    manifest = run_job(str(root / "videos"), out, ConvertConfig(), JobOptions(workers=1, progress=False))
    return out, manifest


def _shard(out: str) -> _Child:
    """A shard process of the first shard of ``out``'s plan (sent its part of the plan)."""
    plan = load_plan(out)
    assert plan is not None
    return _Child(out, plan.shard(0), ShardOptions())


def _read(child: _Child) -> dict:
    """The shard process's next message (None, its end closed, is not one)."""
    msg = child.read(timeout=60)
    assert msg is not None
    return msg


def _server() -> forkserver._Server:
    """The running fork server."""
    server = forkserver._server
    assert server is not None
    return server


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("forked", [True, False])
def test_a_shard_process_answers_and_exits_the_same_forked_or_started(finished, monkeypatch, forked):
    out, manifest = finished
    monkeypatch.setenv("CONVERT_FORKSERVER", "1" if forked else "0")
    child = _shard(out)
    try:
        if forked:
            assert isinstance(child.proc, forkserver.ForkedProcess)
            assert _ppid(child.proc.pid) == _server().proc.pid
        else:
            assert isinstance(child.proc, subprocess.Popen)
        hello = _read(child)
        assert {k: hello[k] for k in ("ready", "done", "complete")} == {"ready": True, "done": [0], "complete": True}
        child.send({"op": "finish"})
        summary = _read(child)
        assert summary["finished"] is True and summary["sha256"] == manifest["shards"][0]["sha256"]
        assert child.read(timeout=60) is None  # it closed its end
        assert child.reap() == 0
    finally:
        child.kill()
        child.close()


def test_a_forked_shard_process_killed_reports_the_signal(finished):
    out, _ = finished
    child = _shard(out)
    try:
        assert isinstance(child.proc, forkserver.ForkedProcess)
        assert _read(child)["ready"] is True
        assert child.proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            child.proc.wait(timeout=0.05)
        assert child.kill() == -signal.SIGKILL
        assert child.proc.poll() == -signal.SIGKILL  # and stays so
    finally:
        child.close()


def test_a_forked_shard_process_that_fails_ends_as_a_started_one_does(tmp_path, monkeypatch):
    """Same exit status, same traceback in the log; a relative OUT is found from the caller's folder."""
    monkeypatch.chdir(tmp_path)
    shard = Plan(ConvertConfig(), ["a"], [[]]).shard(0)
    ends = {}
    for forked in ("0", "1"):
        monkeypatch.setenv("CONVERT_FORKSERVER", forked)
        monkeypatch.setenv("CONVERT_SHARD_HOOK", "tests.faults:no_such_hook")  # the shard process fails on start
        out = f"out-{forked}"
        child = _Child(out, shard, ShardOptions())
        try:
            assert isinstance(child.proc, forkserver.ForkedProcess) == (forked == "1")
            assert child.read(timeout=60) is None
            rc = child.reap()
            with open(os.path.join(out, "logs", "shard-00000.log")) as fh:
                ends[forked] = (rc, last_error(fh.read()), child.failure(rc))
        finally:
            child.close()
        monkeypatch.delenv("CONVERT_SHARD_HOOK")
        child = _Child(out, shard, ShardOptions())
        try:
            assert _read(child)["ready"] is True
            assert os.path.isdir(tmp_path / out / "shards" / "shard-00000")  # its writer, under the relative OUT
        finally:
            child.kill()
            child.close()
    assert ends["1"] == ends["0"]
    rc, error, failure = ends["1"]
    assert rc == 1 and error is not None and failure == error and "no_such_hook" in error


def test_each_forked_process_gets_the_environment_of_its_caller_at_that_moment(videos, tmp_path, monkeypatch):
    """The server is started once per process; a fault set afterwards must still reach the shard processes."""
    tree = tmp_path / "videos"
    (tree / "a").mkdir(parents=True)
    for name in ("mmaction2__part_0.mp4", "mmcv__test.mp4"):
        os.symlink(videos.path(name), tree / "a" / name)
    opts = JobOptions(workers=1, progress=False, shard=ShardOptions(retries=0))
    run_job(str(tree), str(tmp_path / "before"), ConvertConfig(), opts)
    assert forkserver._server is not None and forkserver._server.proc.poll() is None
    monkeypatch.setenv("CONVERT_TEST_FAULT", "crash:a/mmcv__test")
    run_job(str(tree), str(tmp_path / "after"), ConvertConfig(), opts)
    with open(tmp_path / "after" / "report.jsonl") as fh:
        report = [json.loads(line) for line in fh]
    assert [(r["id"], r["status"]) for r in report] == [("a/mmcv__test", "failed")]
    assert report[0]["reason"].startswith("decoder process killed by SIGSEGV")


def test_a_broken_or_dead_server_costs_nothing_but_its_speed(finished):
    """A request the server cannot answer starts that shard process the ordinary way; the next one gets a new server."""
    out, _ = finished

    def one_shard() -> subprocess.Popen | forkserver.ForkedProcess:
        child = _shard(out)
        try:
            assert _read(child)["complete"] is True
            child.send({"op": "finish"})
            assert _read(child)["finished"] is True
            assert child.reap() == 0
            return child.proc
        finally:
            child.kill()
            child.close()

    assert isinstance(one_shard(), forkserver.ForkedProcess)
    broken = _server()
    # The request fails on a socket whose other end is gone, while the server itself is still up (closing its
    # real socket would let it see the close and exit first, and the next spawn would start a new server).
    real = broken.sock
    broken.sock, gone = socket.socketpair()
    gone.close()
    try:
        assert isinstance(one_shard(), subprocess.Popen)  # the server was killed, the shard process started afresh
    finally:
        real.close()
    assert broken.proc.poll() is not None and forkserver._server is None
    assert isinstance(one_shard(), forkserver.ForkedProcess)  # a new server
    dead = _server()
    dead.proc.kill()
    dead.proc.wait()
    assert isinstance(one_shard(), forkserver.ForkedProcess) and forkserver._server is not dead


def test_a_server_closed_while_its_children_run_stays_until_they_end(finished):
    """A job stopping on one shard's error leaves the other shard processes to end as they would have."""
    out, manifest = finished
    child = _shard(out)
    try:
        assert isinstance(child.proc, forkserver.ForkedProcess)
        server = _server()
        assert _read(child)["ready"] is True
        forkserver.stop()  # what the job's exit does: it does not wait, nor kill the running child
        assert forkserver._server is None and server.proc.poll() is None
        child.send({"op": "finish"})
        assert _read(child)["sha256"] == manifest["shards"][0]["sha256"]
        assert child.reap() == 0  # the status still comes from the server ...
        assert server.proc.wait(timeout=10) == 0  # ... which then ends
    finally:
        child.kill()
        child.close()
