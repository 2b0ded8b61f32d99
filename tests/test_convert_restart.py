"""Kill -9 in the middle of a conversion, rerun, and compare with a clean run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import lmdb
import pytest

from convert.format import BACKENDS, FormatError
from loaders import open_clips

from .backend_params import with_test_backends
from .conftest import ROOT


def _start(src: str, out: str, backend: str, codec: str = "lz4") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "convert", src, out, "--workers", "2", "--shards", "3", "--no-progress",
         "--codec", codec, "--backend", backend],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


def _committed_videos(out: str, backend: str = "lmdb") -> int:
    """Videos already committed, counted from the shards' own done records."""
    n = 0
    shards = os.path.join(out, "shards")
    if backend != "lmdb":
        for name in sorted(os.listdir(shards)) if os.path.isdir(shards) else []:
            try:
                reader = BACKENDS[backend].reader(os.path.join(shards, name))
            except (FormatError, OSError):
                continue  # not started, or its first files being written this moment: the next poll sees them
            try:
                n += len(reader.records())
            finally:
                reader.close()
        return n
    for name in sorted(os.listdir(shards)) if os.path.isdir(shards) else []:
        if not os.path.exists(os.path.join(shards, name, "data.mdb")):
            continue
        try:
            # The writer may be creating the environment this very moment (its file there, its meta pages
            # not yet): opening it can fail as reading it can; the next poll sees it whole.
            env = lmdb.open(os.path.join(shards, name), readonly=True, lock=False)
        except lmdb.Error:
            continue
        try:
            with env.begin() as txn:
                cur = txn.cursor()
                ok = cur.set_range(b"m/done/")
                while ok and cur.key().startswith(b"m/done/"):
                    n += 1
                    ok = cur.next()
        except lmdb.Error:
            # Lock-free, this poll races the writer (it may reuse pages the poll
            # is reading): count the shard as nothing new this time.
            pass
        finally:
            env.close()
    return n


def _shard_content(out: str, backend: str = "lmdb") -> dict:
    """Every clip key and value, shard by shard (the checksum would hide which differ); another backend's clips
    by identity, as its reader reads them."""
    result: dict[str, list[tuple[object, bytes]]] = {}  # a clip's key: its LMDB key, or (video id, clip index)
    for meta in json.load(open(os.path.join(out, "manifest.json")))["shards"]:
        if backend != "lmdb":
            reader = BACKENDS[backend].reader(os.path.join(out, meta["path"]))
            result[meta["name"]] = [((head.video_id, head.clip_index), bytes(header) + bytes(payload))
                                    for header, head, payload in reader.iter_clips()]
            reader.close()
            continue
        env = lmdb.open(os.path.join(out, meta["path"]), readonly=True, lock=False)
        with env.begin() as txn:
            result[meta["name"]] = [(bytes(k), bytes(v)) for k, v in txn.cursor() if k.startswith(b"c/")]
        env.close()
    return result


# h264: the encoder must write the same bytes in a rerun's fresh shard processes as in the clean run's (x264's
# macroblock-tree rate control did not, now and then: convert/format/video.py).
@pytest.mark.parametrize(("backend", "codec"), [*((b, "lz4") for b in with_test_backends("lmdb")), ("lmdb", "h264")])
def test_kill_9_then_rerun_equals_a_clean_run(synth_videos, tmp_path, backend, codec):
    clean = str(tmp_path / "clean")
    assert _start(synth_videos, clean, backend, codec).wait(timeout=300) == 0

    out = str(tmp_path / "killed")
    kills_mid_job = 0
    for _ in range(4):
        proc = _start(synth_videos, out, backend, codec)
        # Kill as soon as this run has committed something new, so every kill
        # lands while shard processes are inside a video's transaction or close.
        before = _committed_videos(out, backend)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if _committed_videos(out, backend) > before:
                break
            time.sleep(0.01)
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kills_mid_job += 1
    assert kills_mid_job >= 2
    killed_at = _committed_videos(out, backend)
    assert 0 < killed_at < 20
    assert _start(synth_videos, out, backend, codec).wait(timeout=300) == 0
    assert 0 < _committed_videos(out, backend)

    a, b = _shard_content(clean, backend), _shard_content(out, backend)
    assert a.keys() == b.keys()
    for name in a:
        assert [k for k, _ in a[name]] == [k for k, _ in b[name]], name
        assert a[name] == b[name], name
    ma = json.load(open(os.path.join(clean, "manifest.json")))
    mb = json.load(open(os.path.join(out, "manifest.json")))
    assert [s["sha256"] for s in ma["shards"]] == [s["sha256"] for s in mb["shards"]]
    assert ma["totals"] == mb["totals"]
    assert len(open_clips(out)) == ma["totals"]["clips"]
