"""The job's pool of supervisor threads: results, and a failing shard stops the job at once."""

from __future__ import annotations

import threading
import time

import pytest

from convert.job import _in_threads


def test_every_call_runs_once_on_at_most_n_threads():
    lock, running, peak, seen = threading.Lock(), [0], [0], []

    def call(i: int):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
            seen.append(i)
        return {"index": i}

    results = _in_threads([lambda i=i: call(i) for i in range(7)], 3)
    assert sorted(r["index"] for r in results) == list(range(7)) == sorted(seen)
    assert peak[0] == 3


def test_the_first_failure_is_raised_without_waiting_and_stops_the_rest():
    release, started = threading.Event(), []

    def slow():
        started.append("slow")
        release.wait(10)
        return {}

    def fail():
        started.append("fail")
        raise RuntimeError("shard-00001: shard process died while starting")

    def never():
        started.append("never")
        return {}

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="shard-00001: shard process died while starting"):
        _in_threads([slow, fail, never], 2)
    assert time.monotonic() - t0 < 5  # raised while `slow` still runs
    release.set()
    time.sleep(0.05)
    assert sorted(started) == ["fail", "slow"]


def test_shards_run_largest_first_when_workers_take_several(tmp_path, monkeypatch):
    """Weighed by their videos' file sizes (hand-made files of known sizes), heaviest shard first."""
    import convert.job as job
    from convert.plan import ConvertConfig, Plan
    from convert.sources import VideoItem

    def video(name: str, size: int) -> VideoItem:
        path = tmp_path / name
        path.write_bytes(b"x" * size)
        return VideoItem(name, str(path), 0)

    shards = [[video("a", 10), video("b", 10)],            # 20 bytes
              [video("c", 300)],                           # 300
              [video("d", 50), video("e", 70)],            # 120
              [video("gone", 0), VideoItem("missing", str(tmp_path / "missing"), 0)]]  # 0: a missing file weighs 0
    assert [job._source_bytes(s) for s in shards] == [20, 300, 120, 0]
    plan = Plan(ConvertConfig(), ["c"], shards)
    order = []
    monkeypatch.setattr(job, "run_shard", lambda out, i, *a: order.append(i) or {"index": i})
    job.run_shards(str(tmp_path), plan, job.JobOptions(workers=1, progress=False))
    assert order == [1, 2, 0, 3]
    order.clear()
    job.run_shards(str(tmp_path), plan, job.JobOptions(workers=4, progress=False))
    assert sorted(order) == [0, 1, 2, 3]  # as many workers as shards: no order to choose
