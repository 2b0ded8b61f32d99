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
    BACKENDS,
    FormatError,
    StoreError,
    StoreFullError,
)

from .backend_params import ALL, TEST_BACKENDS
from .convert_helpers import run_cli
from .loaders_fixtures import payloads


def _manifest(out: str) -> dict:
    return json.load(open(os.path.join(out, "manifest.json")))


def _statuses(out: str) -> dict:
    return _manifest(out)["status_counts"]


@pytest.mark.parametrize("backend", ALL)
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
    from convert.worker.plan import ConvertConfig

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
    from convert.job import supervise

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(supervise.shutil, "disk_usage", lambda p: usage._replace(free=10 << 20))
    cause = supervise.machine_cause(str(tmp_path), -signal.SIGBUS)
    assert cause is not None and "SIGBUS" in cause
    assert supervise.machine_cause(str(tmp_path), -signal.SIGSEGV) is None
    monkeypatch.setattr(supervise.shutil, "disk_usage", lambda p: usage._replace(free=10 << 30))
    assert supervise.machine_cause(str(tmp_path), -signal.SIGBUS) is None


def test_the_start_warns_when_the_device_looks_too_small(tiny_tree, tmp_path, monkeypatch):
    from convert.job import space
    from convert.job.rerun import HeldRecords
    from convert.job.run import JobOptions, prepare
    from convert.worker.plan import ConvertConfig

    out = str(tmp_path / "out")
    plan = prepare(tiny_tree, out, ConvertConfig(), JobOptions(workers=1, shards=1, progress=False))
    need = space.estimate_bytes_needed(out, plan, [0])
    assert need is not None
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

    from convert.job import run as job
    from convert.job import space
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    shards_started = threading.Event()
    real_run_shards, real_estimate = job.run_shards, space.estimate
    waited: list[bool] = []

    def run_shards(*args, **kwargs):
        shards_started.set()
        return real_run_shards(*args, **kwargs)

    def estimate(plan, pending, **kwargs):
        waited.append(shards_started.wait(timeout=30))  # before the fix: 30 s, then False
        return real_estimate(plan, pending, **kwargs)

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


class _InjectedFaults:
    """Counts every file operation a shard writer makes, and fails the one numbered ``strike`` (from 1).

    The operations: the ``os`` calls that create, open for writing, write, sync, rename, truncate, reserve,
    list, close or remove (and ``shutil.rmtree``), the writes, flushes, truncations and closes of files
    opened for writing, and the LMDB environment's write transactions, syncs, resizes and copies, with their
    puts, deletes and commits. The failure is what the machine gives: an OSError with EIO and no file named
    (a close fails after closing, as on Linux), or an ``lmdb.Error``.
    """

    OS_CALLS = ("open", "close", "fsync", "replace", "rename", "remove", "unlink", "rmdir", "truncate", "ftruncate",
                "posix_fallocate", "mkdir", "listdir", "pwrite", "write")

    def __init__(self, strike: int) -> None:
        self.strike, self.count, self.struck = strike, 0, False
        self._undo: list = []

    def hit(self) -> bool:
        self.count += 1
        if self.count == self.strike:
            self.struck = True
        return self.count == self.strike

    def _patch(self, owner, name: str, new) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def __enter__(self) -> _InjectedFaults:
        import builtins

        import lmdb

        faults = self
        for name in self.OS_CALLS:
            real = getattr(os, name)

            def call(*args, _real=real, _name=name, **kwargs):
                reading = _name == "open" and not args[1] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
                if not reading and faults.hit():
                    if _name == "close":
                        _real(*args, **kwargs)
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
                return _real(*args, **kwargs)

            self._patch(os, name, call)
        real_rmtree = shutil.rmtree

        def rmtree(*args, **kwargs):
            if faults.hit():
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return real_rmtree(*args, **kwargs)

        self._patch(shutil, "rmtree", rmtree)
        real_open = builtins.open

        class File:
            def __init__(self, fh) -> None:
                self._fh = fh

            def __getattr__(self, name):
                attr = getattr(self._fh, name)
                if name not in ("write", "writelines", "flush", "truncate", "close"):
                    return attr

                def op(*args, **kwargs):
                    if faults.hit():
                        if name == "close":
                            attr()
                        raise OSError(errno.EIO, os.strerror(errno.EIO))
                    return attr(*args, **kwargs)
                return op

            def __enter__(self):
                return self

            def __exit__(self, *exc) -> None:
                self.close()

        def open_(file, mode="r", *args, **kwargs):
            fh = real_open(file, mode, *args, **kwargs)
            return File(fh) if any(c in mode for c in "wax+") else fh

        self._patch(builtins, "open", open_)

        def lmdb_fault() -> lmdb.Error:
            return lmdb.Error("mdb: Input/output error (injected)")

        class Txn:
            def __init__(self, txn) -> None:
                self._txn = txn

            def __getattr__(self, name):
                attr = getattr(self._txn, name)
                if name not in ("put", "delete", "commit"):
                    return attr

                def op(*args, **kwargs):
                    if faults.hit():
                        raise lmdb_fault()
                    return attr(*args, **kwargs)
                return op

            def __enter__(self):
                return self

            def __exit__(self, kind, *rest):
                return self._txn.__exit__(kind, *rest)

        class Env:
            def __init__(self, env) -> None:
                self._env = env

            def __getattr__(self, name):
                return getattr(self._env, name)

            def begin(self, *args, write=False, **kwargs):
                if write and faults.hit():
                    raise lmdb_fault()
                txn = self._env.begin(*args, write=write, **kwargs)
                return Txn(txn) if write else txn

            def _counted(self, name, *args, **kwargs):
                if faults.hit():
                    raise lmdb_fault()
                return getattr(self._env, name)(*args, **kwargs)

            def sync(self, *a, **k):
                return self._counted("sync", *a, **k)

            def set_mapsize(self, *a, **k):
                return self._counted("set_mapsize", *a, **k)

            def copy(self, *a, **k):
                return self._counted("copy", *a, **k)

        real_lmdb_open = lmdb.open
        self._patch(lmdb, "open", lambda *a, **k: Env(real_lmdb_open(*a, **k)))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, real in reversed(self._undo):
            setattr(owner, name, real)


@pytest.mark.parametrize("compact", [False, True])
def test_an_lmdb_shards_index_file_says_what_its_data_says_and_is_rewritten_the_same(tmp_path, compact):
    """index.json (what the shard cache indexes a remote shard by) gives exactly the reader's metadata, records
    and storage order; a finish after a kill that left the shard summarised but without it (or a rerun's) writes
    the same bytes; forgetting a video (--retry-failed) removes it first; verify's storage check finds one that
    differs from the data."""
    from convert.format.lmdb import LmdbOptions, LmdbReader, LmdbWriter
    from convert.format.lmdb.common import FILES, INDEX_FILE

    opts = LmdbOptions(map_size=1 << 20, compact=compact)
    videos = {"b": 2, "a": 1, "c": 0, "a!x": 1}
    path = str(tmp_path / "shard")
    summary = _write_shard(path, "lmdb", opts, videos)
    index = os.path.join(path, INDEX_FILE)
    first = open(index, "rb").read()
    reader = LmdbReader(path)
    try:
        assert FILES.is_index(INDEX_FILE) and FILES.indexer is not None
        assert FILES.indexer(path) == (reader.meta, reader.records(), reader.storage_order())
        assert reader.check_storage() == []
    finally:
        reader.close()
    os.remove(index)
    assert _write_shard(path, "lmdb", opts, videos) == summary
    assert open(index, "rb").read() == first
    assert _write_shard(str(tmp_path / "again"), "lmdb", opts, videos) == summary
    assert open(os.path.join(tmp_path, "again", INDEX_FILE), "rb").read() == first
    with LmdbWriter(path=path, codec="raw", meta=_meta(), options=opts) as w:
        w.forget_video("c")
        assert not os.path.exists(index)
    assert _write_shard(path, "lmdb", opts, videos) == summary
    assert open(index, "rb").read() == first
    d = json.loads(first)
    d["records"] = d["records"][1:]
    with open(index, "w") as f:
        json.dump(d, f)
    reader = LmdbReader(path)
    try:
        (problem,) = reader.check_storage()
    finally:
        reader.close()
    assert problem.startswith(f"{index}: the shard's index file differs from what data.mdb holds")
    with open(index, "w") as f:
        f.write("[]")
    with pytest.raises(FormatError, match=f"{index}: not a shard index"):
        FILES.indexer(path)


def _write_shard(path: str, backend: str, options, videos: dict[str, int]) -> dict:
    """Open (or reopen) a shard, write the ``videos`` (id -> clips) it does not hold yet, finish it."""
    writer = BACKENDS[backend].writer(path=path, codec="raw", meta=_meta(), options=options)
    try:
        done = writer.done_records()
        for vid, clips in videos.items():
            if vid not in done:
                writer.write_video(vid, 0, _producer(clips, vid), 4096)
        summary = writer.finish()
    except BaseException:
        writer.close()
        raise
    writer.close()
    return summary


@pytest.mark.parametrize("backend, options", [
    ("lmdb", {"map_size": 1 << 20}), ("lmdb", {"map_size": 1 << 20, "compact": True}),
    ("tfrecord", {"part_bytes": 1500}), *((name, {}) for name in TEST_BACKENDS),
], ids=["lmdb", "lmdb-compact", "tfrecord", *TEST_BACKENDS])
def test_every_file_operation_of_a_writer_that_fails_is_a_store_error_and_the_redo_equals_a_clean_write(
        tmp_path, backend, options):
    """Issue 19, point 1: each write, sync, rename, close... of a shard writer fails in turn (EIO). Every one
    is a StoreError naming the shard's file (the shard process then stops the job and records nothing for the
    video); reopening the shard and writing what it lacks gives the bytes of a write that never failed."""
    opts = BACKENDS[backend].make_options(options)
    videos = {"a": 2, "b": 0, "c": 3, "d": 1}  # b: a record without clips; a small map and parts roll over
    clean = _write_shard(str(tmp_path / "clean"), backend, opts, videos)
    strike = 0
    while True:
        strike += 1
        path = str(tmp_path / f"s{strike}")
        with _InjectedFaults(strike) as faults:
            try:
                _write_shard(path, backend, opts, videos)
                error = None
            except Exception as exc:  # noqa: BLE001 - the test is about which exceptions come out
                error = exc
        if not faults.struck:
            break
        assert isinstance(error, StoreError), (strike, repr(error))
        assert path in str(error) and "\n" not in str(error) and "[Errno" not in str(error), (strike, str(error))
        assert _write_shard(path, backend, opts, videos) == clean, strike
    assert strike > 30  # every operation of the scenario was failed once


def _shard_records(out: str, backend: str) -> dict:
    """Every video record the shards of OUT hold (finished or not), by id: what a rerun would go on from."""
    records = {}
    shards = os.path.join(out, "shards")
    for name in sorted(os.listdir(shards)) if os.path.isdir(shards) else []:
        try:
            reader = BACKENDS[backend].reader(os.path.join(shards, name))
        except FormatError:
            continue  # not started
        try:
            records.update({r.video_id: (r.status, r.reason) for r in reader.records()})
        finally:
            reader.close()
    return records


def _clean(tree: str, tmp_path, args: tuple) -> dict:
    clean = str(tmp_path / "clean")
    r = run_cli(tree, clean, *args)
    assert r.returncode == 0, r.stderr
    return _manifest(clean)


def _same_as_clean(out: str, clean: dict) -> None:
    got = _manifest(out)
    assert [s["sha256"] for s in got["shards"]] == [s["sha256"] for s in clean["shards"]]
    assert got["status_counts"] == clean["status_counts"] and "failed" not in got["status_counts"]


@pytest.mark.parametrize("fault, backend, stops", [
    ("raise:a/mmcv__test", "lmdb", "not in its decoder: RuntimeError: injected fault while converting a/mmcv__test"),
    ("crash_storing:a/mmcv__test", "lmdb", "not in its decoder: shard process killed by SIGSEGV"),
    ("crash_storing:a/mmcv__test", "tfrecord", "not in its decoder: shard process killed by SIGSEGV"),
], ids=["python-exception", "signal-while-storing-lmdb", "signal-while-storing-tfrecord"])
def test_a_shard_process_that_dies_outside_its_decoder_stops_the_job_and_blames_no_video(
        tiny_synthetic_tree, tmp_path, fault, backend, stops):
    """Issue 19, point 1: only a signal death in the decode step is a decoder crash. A Python exception
    escaping the shard process (status 1, a traceback) or a crash while storing says nothing about the
    video: the job stops (status 1) naming the shard, the cause and the log, records nothing, and the rerun
    gives the clean result (before: "failed: decoder process exited with status 1; 2 attempts", status 0)."""
    args = ("--workers", "1", "--shards", "1", "--no-progress", "--backend", backend)
    clean = _clean(tiny_synthetic_tree, tmp_path, args)
    out = str(tmp_path / "out")
    r = run_cli(tiny_synthetic_tree, out, *args, env={"CONVERT_TEST_FAULT": fault})
    assert r.returncode == 1, r.stderr
    (line,) = r.stderr.splitlines()
    log = os.path.join(out, "logs", "shard-00000.log")
    assert line.startswith("convert: error: shard-00000: shard process died while converting video number ")
    assert stops in line and line.endswith(f"; nothing was recorded for it; see {log}"), line
    assert not os.path.exists(os.path.join(out, "report.jsonl"))
    assert all(status != "failed" for status, _ in _shard_records(out, backend).values())
    r = run_cli(tiny_synthetic_tree, out, *args)
    assert r.returncode == 0, r.stderr
    _same_as_clean(out, clean)


@pytest.mark.parametrize("backend, name", [("tfrecord", ".idx.tmp"), ("tfrecord", ".json.tmp"),
                                           ("lmdb", "data.mdb")])
def test_transient_io_errors_while_committing_stop_the_job_each_time_and_lose_no_video(
        tiny_synthetic_tree, tmp_path, backend, name):
    """Two EIOs in a row on a part's index or commit file (or LMDB's reservation): each run stops with one
    line naming the file (status 1), records nothing; the run after them equals a clean run (before, two
    EIOs ended a job with status 0 and a good video recorded as failed)."""
    args = ("--workers", "1", "--shards", "1", "--no-progress", "--backend", backend, "--part-size", "1")
    if backend == "lmdb":
        args = args[:-2] + ("--map-size", "1M")
    clean = _clean(tiny_synthetic_tree, tmp_path, args)
    out = str(tmp_path / "out")
    env = {"CONVERT_TEST_FAULT": f"eio:{name}:2:{tmp_path / 'eio-count'}"}
    for _ in range(2):
        r = run_cli(tiny_synthetic_tree, out, *args, env=env)
        assert r.returncode == 1, r.stderr
        (line,) = r.stderr.splitlines()
        assert re.search(rf" {re.escape(out)}/shards/shard-00000/\S*{re.escape(name)}\S* failed: Input/output error;",
                         line), line
        assert "run the same command again" in line and "[Errno" not in line
        assert all(status != "failed" for status, _ in _shard_records(out, backend).values())
    r = run_cli(tiny_synthetic_tree, out, *args, env=env)
    assert r.returncode == 0, r.stderr
    _same_as_clean(out, clean)


def _mount(path: str, options: str) -> None:
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], check=True, capture_output=True,
                   timeout=30)


def _inodes_used(path: str) -> int:
    st = os.statvfs(path)
    return st.f_files - st.f_ffree


def test_inode_exhaustion_anywhere_in_a_job_is_a_machine_error_and_the_rerun_is_clean(tiny_synthetic_tree, tmp_path):
    """Issue 19, point 1, with real files: a tmpfs whose inodes run out at each step of a TFRecord job in
    turn (a part's record, index or commit file, the shard's summary, the job's progress file, its
    manifest). Every run stops with status 1 and one line naming the file and saying no inodes are left
    (before: status 2 where the job process hit it, as an argument error); nothing is recorded as failed;
    after a remount with room the rerun equals a clean run."""
    args = ("--workers", "1", "--shards", "1", "--no-progress", "--backend", "tfrecord", "--part-size", "1")
    clean = _clean(tiny_synthetic_tree, tmp_path, args)
    disk = str(tmp_path / "disk")
    _mount(disk, "size=200m,nr_inodes=1000")
    try:
        assert run_cli(tiny_synthetic_tree, os.path.join(disk, "probe"), *args).returncode == 0
        needed = _inodes_used(disk)  # the root, and what a job leaves plus the files it has open at once
    finally:
        subprocess.run(["umount", "-l", disk], capture_output=True)
    named = []
    for short in range(1, 9):
        _mount(disk, f"size=200m,nr_inodes={needed - short}")
        try:
            out = os.path.join(disk, "out")
            r = run_cli(tiny_synthetic_tree, out, *args)
            assert r.returncode == 1, (short, r.stderr)
            (line,) = r.stderr.splitlines()
            assert line.startswith("convert: error: ") and f"no space left for {out}/" in line, line
            assert "no free inodes" in line and "[Errno" not in line, line
            named.append(line.split(f"no space left for {out}/")[1].split(":")[0])
            assert all(status != "failed" for status, _ in _shard_records(out, "tfrecord").values())
            assert not os.path.exists(os.path.join(out, "manifest.json"))
            subprocess.run(["mount", "-o", "remount,nr_inodes=1000", disk], check=True, capture_output=True)
            r = run_cli(tiny_synthetic_tree, out, *args)
            assert r.returncode == 0, r.stderr
            _same_as_clean(out, clean)
        finally:
            subprocess.run(["umount", "-l", disk], capture_output=True)
    # the steps the issue names were among those hit
    assert any(n.endswith(".idx.tmp") for n in named) and any(".json.tmp" in n and "/part-" in n for n in named)
    assert any(n.startswith(".progress/") for n in named) and any(n.startswith("manifest.json") for n in named)


def test_an_io_error_of_the_job_process_names_its_file_and_exits_1(tiny_synthetic_tree, tmp_path, monkeypatch,
                                                                  capsys):
    """The report's write failing (EIO, which the kernel reports without a file): one line naming the file,
    status 1 (before: "convert: error: [Errno 5] Input/output error", status 2)."""
    import builtins

    from convert import cli
    from convert.job import finalize

    def failing_open(file, mode="r", *args, **kwargs):
        if str(file).endswith("report.jsonl.tmp"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return builtins.open(file, mode, *args, **kwargs)

    monkeypatch.setattr(finalize, "open", failing_open, raising=False)
    out = str(tmp_path / "out")
    assert cli.main([tiny_synthetic_tree, out, "--workers", "1", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err == f"convert: error: writing {out}/report.jsonl.tmp failed: Input/output error\n"
