"""A problem of the machine is never a property of a video: a full disk stops the job with a clear error,
commits nothing for the video in flight, and a rerun after space is freed gives the uninterrupted result.
Damaged stores never crash a reader: verify reports them, readers name the shard."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import struct
import subprocess

import numpy as np
import pytest

from convert.format import (
    BACKENDS,  # tests run over every registered backend and codec
    FormatError,
    StoreFullError,
)

from .convert_helpers import run_cli
from .loaders_fixtures import payloads


def _manifest(out: str) -> dict:
    return json.load(open(os.path.join(out, "manifest.json")))


def _statuses(out: str) -> dict:
    return _manifest(out)["status_counts"]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_store_full_mid_video_stops_the_job_and_a_rerun_gives_the_clean_result(tiny_tree, tmp_path, backend):
    args = ("--workers", "1", "--shards", "2", "--no-progress", "--backend", backend)
    clean = str(tmp_path / "clean")
    assert run_cli(tiny_tree, clean, *args).returncode == 0
    out = str(tmp_path / "out")
    r = run_cli(tiny_tree, out, *args, env={"CONVERT_TEST_FAULT": "enospc:a/mmcv__test"})
    assert r.returncode == 1
    (line,) = r.stderr.splitlines()
    assert "no space left" in line and "nothing was recorded for a/mmcv__test" in line and out in line
    assert "run the same command again" in line
    assert not os.path.exists(os.path.join(out, "manifest.json"))
    r = run_cli(tiny_tree, out, *args)  # space is back
    assert r.returncode == 0, r.stderr
    assert [s["sha256"] for s in _manifest(out)["shards"]] == [s["sha256"] for s in _manifest(clean)["shards"]]
    assert _statuses(out) == _statuses(clean) and "failed" not in _statuses(out)


def _mount_tmpfs(path: str, size: str) -> bool:
    os.makedirs(path, exist_ok=True)
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_a_really_full_filesystem_then_remounted_larger(tiny_tree, tmp_path):
    """The issue's reproduction: a 20 MB tmpfs fills up; after a remount at 400 MB the rerun completes."""
    disk = str(tmp_path / "disk")
    if not _mount_tmpfs(disk, "20m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        args = ("--workers", "1", "--shards", "2", "--no-progress", "--map-size", "2M")
        clean = str(tmp_path / "clean")
        assert run_cli(tiny_tree, clean, *args).returncode == 0
        out = os.path.join(disk, "out")
        r = run_cli(tiny_tree, out, *args)
        assert r.returncode == 1
        (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("convert: error:")]
        assert "no space left" in line and out in line and "bytes free" in line
        assert subprocess.run(["mount", "-o", "remount,size=400m", disk], capture_output=True).returncode == 0
        r = run_cli(tiny_tree, out, *args)
        assert r.returncode == 0, r.stderr
        assert [s["sha256"] for s in _manifest(out)["shards"]] == [s["sha256"] for s in _manifest(clean)["shards"]]
        assert _statuses(out) == _statuses(clean) and "failed" not in _statuses(out)
        assert run_cli("verify", out).returncode == 0
    finally:
        subprocess.run(["umount", "-l", disk], capture_output=True)


def _meta(index: int = 0, count: int = 1) -> dict:
    from convert.format import shard_meta
    from convert.plan import ConvertConfig

    return shard_meta(ConvertConfig(size=(8, 8), clip_len=2).data_spec(["x"]), index=index, count=count)


def _producer(n_clips: int, video_id: str = "v"):
    from convert.format import VideoRecord

    def produce():
        for k in range(n_clips):
            yield k, 2 * k, np.full((2, 8, 8, 3), k, np.uint8)
        return VideoRecord(video_id, f"/{video_id}.mp4", 0, "ok", n_clips, 2 * n_clips)

    return produce


def test_lmdb_writer_reserves_space_and_a_full_device_commits_nothing(tmp_path, monkeypatch):
    from convert.format.lmdb import LmdbOptions, LmdbReader, LmdbWriter

    path = str(tmp_path / "shard")
    with LmdbWriter(path=path, codec="raw", meta=_meta(), options=LmdbOptions(map_size=1 << 20)) as w:
        assert os.stat(os.path.join(path, "data.mdb")).st_blocks * 512 >= 1 << 20  # reserved, not sparse

        def full(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", full)
        with pytest.raises(StoreFullError, match="no space left for shard .* needs .* bytes"):
            w.write_video("v", 0, _producer(3), estimate_bytes=64 << 20)  # more than the map: it must grow
        assert w.done_records() == {}
        monkeypatch.undo()
        assert w.write_video("v", 0, _producer(3), estimate_bytes=64 << 20).clips == 3
        w.finish()
    assert [r.video_id for r in LmdbReader(path).records()] == ["v"]


def test_tfrecord_writer_full_device_rewinds_the_video(tmp_path, monkeypatch):
    from convert.format.tfrecord import TFRecordOptions, TFRecordWriter

    path = str(tmp_path / "shard")
    w = TFRecordWriter(path=path, codec="raw", meta=_meta(), options=TFRecordOptions())
    assert w.write_video("a", 0, _producer(2, "a"), 0).clips == 2
    part = w._part()
    size = part.size
    real = part.fh.writelines
    calls = []

    def fills_up(pieces):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(pieces)

    monkeypatch.setattr(part.fh, "writelines", fills_up)
    with pytest.raises(StoreFullError, match="no space left"):
        w.write_video("v", 0, _producer(3), 0)
    assert part.size == size and len(part.index) == 2 and set(w.done_records()) == {"a"}
    monkeypatch.undo()
    assert w.write_video("v", 0, _producer(3), 0).clips == 3
    assert w.finish()["clips"] == 5


def test_sigbus_is_the_machines_fault_only_when_the_disk_is_full(tmp_path, monkeypatch):
    from convert import supervise

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(supervise.shutil, "disk_usage", lambda p: usage._replace(free=10 << 20))
    assert "SIGBUS" in supervise.machine_cause(str(tmp_path), -signal.SIGBUS)
    assert supervise.machine_cause(str(tmp_path), -signal.SIGSEGV) is None
    monkeypatch.setattr(supervise.shutil, "disk_usage", lambda p: usage._replace(free=10 << 30))
    assert supervise.machine_cause(str(tmp_path), -signal.SIGBUS) is None


def test_the_start_warns_when_the_device_looks_too_small(tiny_tree, tmp_path, monkeypatch):
    from convert import space
    from convert.job import JobOptions, prepare
    from convert.plan import ConvertConfig
    from convert.rerun import HeldRecords

    out = str(tmp_path / "out")
    plan = prepare(tiny_tree, out, ConvertConfig(), JobOptions(workers=1, shards=1, progress=False))
    need = space.estimate_bytes_needed(out, plan, [0])
    # 4 shared videos (either tier: the same frame counts), 128x171 raw: clips of 1 MB each
    assert 20 << 20 < need < 400 << 20
    said: list[str] = []
    usage = shutil.disk_usage(out)
    pending = space.pending_videos(plan, [0], HeldRecords(out=out, plan=plan))
    check = space.SpaceCheck(out=out, plan=plan, pending=pending, say=said.append)
    monkeypatch.setattr(space.shutil, "disk_usage", lambda p: usage._replace(free=need // 2))
    check.run()
    assert len(said) == 1 and "needs about" in said[0] and "MiB free" in said[0]
    monkeypatch.setattr(space.shutil, "disk_usage", lambda p: usage._replace(free=need * 2))
    check.run()
    assert len(said) == 1


def _flip_leaf_size(shard: str, key: bytes, value_len: int, *, past_the_end: bool) -> None:
    """Corrupt the data size of ``key``'s leaf nodes: the 8-byte node header before the key holds the size's
    low and high 16 bits, then flags and the key's length (copies in free pages get it too, harmlessly)."""
    data = os.path.join(shard, "data.mdb")
    raw = bytearray(open(data, "rb").read())
    hits = 0
    pos = raw.find(key)
    while pos != -1:
        lo, hi, _flags, ksize = struct.unpack_from("<HHHH", raw, pos - 8)
        if ksize == len(key) and lo | hi << 16 == value_len:
            # mn_hi's high byte: a gigabyte more, past the end of the file; its low byte: a few MB more
            raw[pos - 5 if past_the_end else pos - 6] ^= 0x40
            hits += 1
        pos = raw.find(key, pos + 1)
    assert hits
    open(data, "wb").write(bytes(raw))


def _damaged(tiny_tree, tmp_path, past_the_end: bool) -> tuple[str, str, bytes]:
    from convert.format.lmdb import clip_key
    from loaders import open_clips

    out = str(tmp_path / "out")
    assert run_cli(tiny_tree, out, "--workers", "1", "--shards", "1", "--no-progress").returncode == 0
    store = open_clips(out)
    _, refs = store.refs([3])
    ((header, _),) = payloads(store, [3])
    del store
    shard = os.path.join(out, "shards", "shard-00000")
    key = clip_key(*refs[0])
    _flip_leaf_size(shard, key, header.value_len, past_the_end=past_the_end)
    return out, shard, key


def test_a_damaged_leaf_size_is_a_one_line_error_in_verify_and_the_readers(tiny_tree, tmp_path):
    from loaders import ClipDataset

    out, shard, key = _damaged(tiny_tree, tmp_path, past_the_end=False)
    r = run_cli("verify", out)
    assert r.returncode == 1
    assert r.stderr.startswith(f"verify: shard-00000: {shard}: {key.decode()}: value is ")
    with pytest.raises(FormatError) as info:
        ClipDataset(out, train=False).__getitems__([2, 3, 4])
    assert str(info.value).startswith(f"{shard}: {key.decode()}: value is ") and "\n" not in str(info.value)


def test_a_size_pointing_past_the_file_is_reported_by_verify_not_a_crash(tiny_tree, tmp_path):
    # LMDB itself faults on such a node (in mdb_get, before any check of ours can run): verify checks each
    # shard in a child process and reports the crash as a corrupted shard.
    out, shard, key = _damaged(tiny_tree, tmp_path, past_the_end=True)
    r = run_cli("verify", out)
    assert r.returncode == 1 and "Bus error" not in r.stderr and "Segmentation" not in r.stderr
    assert re.fullmatch(r"verify: shard-00000: corrupted: reading it crashed the checker \(killed by SIG(SEGV|BUS)\); "
                        r"the shard must be converted again\n", r.stderr), r.stderr


def test_the_space_check_runs_beside_the_shards_and_still_warns(tiny_tree, tmp_path, monkeypatch):
    """The probe must not hold back the shards: here it waits until they have started, then warns."""
    import threading

    from convert import job, space
    from convert.job import JobOptions, run_job
    from convert.plan import ConvertConfig

    shards_started = threading.Event()
    real_run_shards, real_estimate = job.run_shards, space.estimate
    waited: list[bool] = []

    def run_shards(*args, **kwargs):
        shards_started.set()
        return real_run_shards(*args, **kwargs)

    def estimate(plan, pending):
        waited.append(shards_started.wait(timeout=30))  # before the fix: 30 s, then False
        return real_estimate(plan, pending)

    monkeypatch.setattr(job, "run_shards", run_shards)
    monkeypatch.setattr(space, "estimate", estimate)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(space.shutil, "disk_usage", lambda p: usage._replace(free=1 << 20))
    said: list[str] = []
    out = str(tmp_path / "out")
    result = run_job(tiny_tree, out, ConvertConfig(), JobOptions(workers=2, shards=2, progress=False),
                     say=said.append)
    assert waited == [True]
    (warning,) = [s for s in said if "needs about" in s]
    assert warning.startswith(f"{out}: this run needs about ") and "the device has 1 MiB free" in warning
    assert result["totals"]["videos"] == 4
