"""The TFRecord backend: interop with the tfrecord package and DALI's index format, equivalence with LMDB,
roll-over, kill -9 restart, and one-line errors naming the damaged file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from convert.format import (
    WRITE_CODECS,  # tests run over every registered backend and codec
    FormatError,
    get_backend,
)
from convert.format.tfrecord import TFRecordOptions
from loaders import ClipDataset, open_clips

from .conftest import ROOT
from .loaders_fixtures import converted, copy_conversion, loader_base, raw_root  # noqa: F401


@pytest.fixture(scope="module")
def tf_roots(synth_videos, loader_base):  # noqa: F811
    """TFRecord conversions of the shared synthetic videos with every codec (3 shards each)."""
    return {c: converted(synth_videos, loader_base, f"tf_{c}", codec=c, backend="tfrecord") for c in WRITE_CODECS}


def _lmdb(synth_videos, loader_base, codec):  # noqa: F811
    return converted(synth_videos, loader_base, codec, codec=codec)


def _files(root: str) -> list[tuple[str, str]]:
    manifest = json.load(open(os.path.join(root, "manifest.json")))
    return [(os.path.join(root, s["path"], f["path"]), os.path.join(root, s["path"], f["index"]))
            for s in manifest["shards"] for f in s["files"]]


def test_records_parse_with_the_tfrecord_package_and_indexes_equal_tfrecord2idx(tf_roots, tmp_path):
    import tfrecord
    from tfrecord.tools.tfrecord2idx import create_index

    for codec, root in tf_roots.items():
        store = open_clips(root)
        seen = []
        for data, idx in _files(root):
            fresh = str(tmp_path / "fresh.idx")
            create_index(data, fresh)
            assert open(fresh).read() == open(idx).read()
            for ex in tfrecord.tfrecord_loader(data, None):  # with an index it starts at a random record
                seen.append((bytes(ex["video_id"]).decode(), int(ex["clip_index"][0]), int(ex["label"][0]),
                             ex["shape"].tolist()))
        want = [(store[i].video_id, store[i].clip_index, store[i].label, list(store[i].clip.shape))
                for i in range(len(store))]
        # Files hold each shard's videos in plan (hash) order; reading order sorts them by id.
        assert sorted(seen) == sorted(want) and len(seen) == len(want), codec
        assert seen != want  # not written in id order: a class's videos are not side by side


@pytest.mark.parametrize("codec", list(WRITE_CODECS))
def test_lmdb_and_tfrecord_hold_identical_clips_and_checksums(tf_roots, synth_videos, loader_base, codec):  # noqa: F811
    a, b = open_clips(_lmdb(synth_videos, loader_base, codec)), open_clips(tf_roots[codec])
    assert len(a) == len(b) > 0
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert (x.video_id, x.clip_index, x.label) == (y.video_id, y.clip_index, y.label)
        assert np.array_equal(x.clip, y.clip)
    assert [s.sha256 for s in a.manifest.shards] == [s.sha256 for s in b.manifest.shards]
    # The Dataset (crops, flips) gives equal tensors on both backends.
    da, db = ClipDataset(a.root, train=True, seed=5), ClipDataset(b.root, train=True, seed=5)
    items = [(2, i) for i in range(len(a))]
    assert np.array_equal(da.__getitems__(items).collated["clip"].numpy(),
                          db.__getitems__(items).collated["clip"].numpy())


def test_parts_roll_over_at_the_target_size(synth_videos, tf_roots, tmp_path):
    from convert.job.run import JobOptions, run_job
    from convert.job.supervise import ShardOptions
    from convert.store.verify import verify
    from convert.worker.plan import ConvertConfig

    out = str(tmp_path / "small_parts")
    run_job(synth_videos, out, ConvertConfig(codec="lz4", backend="tfrecord"),
            JobOptions(workers=2, shards=3, progress=False,
                       shard=ShardOptions(store=TFRecordOptions(part_bytes=2 << 20))))
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    for shard in manifest["shards"]:
        sizes = [f["bytes"] for f in shard["files"]]
        assert len(sizes) > 1 and all(s >= 2 << 20 for s in sizes[:-1])
        assert sum(f["records"] for f in shard["files"]) == shard["clips"]
    assert verify(out)[0] == []
    reference, store = open_clips(tf_roots["lz4"]), open_clips(out)  # the same, in one file per shard
    assert [s.sha256 for s in store.manifest.shards] == [s.sha256 for s in reference.manifest.shards]
    assert all(np.array_equal(store[i].clip, reference[i].clip) for i in range(0, len(store), 7))


def _start(src: str, out: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "convert", src, out, "--workers", "2", "--shards", "3", "--no-progress",
         "--backend", "tfrecord", "--codec", "lz4", "--part-size", "1"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _commits(out: str) -> int:
    shards = os.path.join(out, "shards")
    return sum(1 for d in (os.listdir(shards) if os.path.isdir(shards) else [])
               for f in os.listdir(os.path.join(shards, d)) if f.startswith("part-") and f.endswith(".json"))


def _tree(out: str) -> dict[str, bytes]:
    shards = os.path.join(out, "shards")
    return {os.path.join(d, f): open(os.path.join(shards, d, f), "rb").read()
            for d in sorted(os.listdir(shards)) for f in sorted(os.listdir(os.path.join(shards, d)))}


def test_kill_9_then_rerun_gives_identical_files_and_manifest(synth_videos, tmp_path):
    clean = str(tmp_path / "clean")
    assert _start(synth_videos, clean).wait(timeout=300) == 0
    out = str(tmp_path / "killed")
    kills = 0
    for _ in range(4):
        proc = _start(synth_videos, out)
        before = _commits(out)  # with --part-size 1 every video is a committed part
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline and _commits(out) <= before:
            time.sleep(0.01)
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
    assert kills >= 2 and 0 < _commits(out) < 20
    assert _start(synth_videos, out).wait(timeout=300) == 0
    assert _tree(out) == _tree(clean)
    ma, mb = (json.load(open(os.path.join(d, "manifest.json"))) for d in (clean, out))
    for m in (ma, mb):
        m.pop("created")
        m["source"].pop("path")
    assert ma == mb


@pytest.fixture()
def damaged(tf_roots, tmp_path):
    root = copy_conversion(tf_roots["raw"], str(tmp_path / "damaged"))
    data, idx = _files(root)[0]
    return root, data, idx


def _one_line_error(root: str) -> str:
    with pytest.raises(FormatError) as info:
        store = open_clips(root)
        for i in range(len(store)):
            store.get(i, verify=True)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_truncated_record_file_names_the_file(damaged):
    root, data, _ = damaged
    os.truncate(data, os.path.getsize(data) - 100)
    msg = _one_line_error(root)
    assert data in msg and "truncated" in msg


def test_flipped_byte_is_caught_by_the_record_crc(damaged):
    from convert.store.verify import verify

    root, data, _ = damaged
    with open(data, "r+b") as fh:
        fh.seek(os.path.getsize(data) // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0xFF]))
    problems, _ = verify(root)
    assert any(data in p and "CRC mismatch" in p for p in problems), problems
    msg = _one_line_error(root)  # the payload's CRC-32, on a checked read
    assert data.rsplit("/", 1)[1] in msg and "crc32" in msg


def test_missing_or_stale_index_names_the_index_file(damaged):
    root, data, idx = damaged
    lines = open(idx).read().splitlines()
    with open(idx, "w") as fh:  # stale: one record short
        fh.write("\n".join(lines[:-1]) + "\n")
    msg = _one_line_error(root)
    assert idx in msg and "stale" in msg
    with open(idx, "w") as fh:  # stale: offsets of another file
        fh.write("\n".join(f"{int(a) + 1} {b}" for a, b in (line.split() for line in lines)) + "\n")
    assert idx in _one_line_error(root)
    os.remove(idx)
    msg = _one_line_error(root)
    assert idx in msg and "missing" in msg and "tfrecord2idx" in msg


def test_retry_failed_and_a_deleted_shard_on_tfrecord_give_the_clean_checksums(tiny_tree, tmp_path):
    from .convert_helpers import run_cli

    args = ("--workers", "2", "--shards", "2", "--no-progress", "--backend", "tfrecord", "--retries", "0")
    clean = str(tmp_path / "clean")
    assert run_cli(tiny_tree, clean, *args).returncode == 0
    out = str(tmp_path / "out")
    assert run_cli(tiny_tree, out, *args, env={"CONVERT_TEST_FAULT": "crash:a/mmcv__test"}).returncode == 0
    counts = json.load(open(os.path.join(clean, "manifest.json")))["status_counts"]
    broken = json.load(open(os.path.join(out, "manifest.json")))["status_counts"]
    assert broken == {**counts, "ok": counts["ok"] - 1, "failed": 1}
    r = run_cli(tiny_tree, out, *args, "--retry-failed")
    assert r.returncode == 0, r.stderr
    sums = [s["sha256"] for s in json.load(open(os.path.join(clean, "manifest.json")))["shards"]]
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    # The retried video went into a new part file; reading order (and the checksum) do not depend on files.
    assert [s["sha256"] for s in manifest["shards"]] == sums and manifest["status_counts"] == counts
    shutil.rmtree(os.path.join(out, "shards", "shard-00001"))
    r = run_cli(tiny_tree, out, *args)
    assert r.returncode == 0 and "shard-00001" in r.stderr
    assert [s["sha256"] for s in json.load(open(os.path.join(out, "manifest.json")))["shards"]] == sums
    assert run_cli("verify", out).returncode == 0


def test_parts_past_99999_are_read_in_number_order(synth_videos, tmp_path):
    """Part numbers grow past five digits; `part-100000` must come after `part-99999`, not before it."""
    from convert.job.run import JobOptions, run_job
    from convert.job.supervise import ShardOptions
    from convert.store.verify import verify
    from convert.worker.plan import ConvertConfig

    out = str(tmp_path / "renumbered")
    run_job(synth_videos, out, ConvertConfig(codec="raw", backend="tfrecord"),
            JobOptions(workers=2, shards=1, progress=False,
                       shard=ShardOptions(store=TFRecordOptions(part_bytes=2 << 20))))
    before = open_clips(out)
    expected = [(r.video_id, r.clip_index, r.clip.copy()) for r in (before[i] for i in range(len(before)))]
    del before
    manifest_path = os.path.join(out, "manifest.json")
    manifest = json.load(open(manifest_path))
    (shard,) = manifest["shards"]
    folder = os.path.join(out, shard["path"])
    numbers = sorted(int(f[5:-5]) for f in os.listdir(folder) if f.startswith("part-") and f.endswith(".json"))
    assert len(numbers) >= 3
    new = {n: 99998 + n for n in numbers}  # 99998, 99999, 100000, ...: name order is no longer part order
    for n in sorted(numbers, reverse=True):
        for ext in ("tfrecord", "idx", "json"):
            src = os.path.join(folder, f"part-{n:05d}.{ext}")
            if os.path.exists(src):
                os.rename(src, os.path.join(folder, f"part-{new[n]:05d}.{ext}"))
        commit_path = os.path.join(folder, f"part-{new[n]:05d}.json")
        commit = json.load(open(commit_path))
        commit["part"] = new[n]
        json.dump(commit, open(commit_path, "w"))
    renamed = {f"part-{n:05d}.{ext}": f"part-{new[n]:05d}.{ext}" for n in numbers for ext in ("tfrecord", "idx")}
    for f in shard["files"]:
        f["path"], f["index"] = renamed[f["path"]], renamed[f["index"]]
    for name in os.listdir(folder):  # the shard's own copy of its summary lists the files too
        if name.startswith("complete"):
            summary = json.load(open(os.path.join(folder, name)))
            summary["files"] = shard["files"]
            json.dump(summary, open(os.path.join(folder, name), "w"))
    # The manifest's list of the shard's files (names, sizes, checksums) follows the renames and the rewrites.
    manifest["shard_files"][shard["name"]] = [f.to_dict() for f in get_backend("tfrecord").files.describe(folder)]
    json.dump(manifest, open(manifest_path, "w"))
    assert sorted(f for f in os.listdir(folder) if f.startswith("part-"))[0].startswith("part-100000")
    assert verify(out)[0] == []
    store = open_clips(out)
    got = [(r.video_id, r.clip_index, r.clip) for r in (store[i] for i in range(len(store)))]
    assert [g[:2] for g in got] == [e[:2] for e in expected]
    assert all(np.array_equal(g[2], e[2]) for g, e in zip(got, expected))
    # A writer reopening the shard (a retry) starts after the highest part, not after the last name.
    from convert.format.tfrecord import TFRecordWriter

    os.remove(os.path.join(folder, "complete.json"))
    writer = TFRecordWriter(path=folder, codec="raw", meta=json.load(open(os.path.join(folder, "shard.json"))))
    try:
        assert writer._part().number == 99998 + numbers[-1] + 1
    finally:
        writer.close()
