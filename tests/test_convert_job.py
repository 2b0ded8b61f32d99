"""The conversion job end to end on the shared videos (both tiers): round trip, policies, report, errors."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from convert.format.lmdb import LmdbOptions
from convert.job.run import JobOptions, run_job
from convert.job.supervise import ShardOptions
from convert.store.verify import verify
from convert.worker.clips import ClipSpec, cut_clips
from convert.worker.decode import FrameSpec, decode_all
from convert.worker.plan import ConvertConfig
from loaders import open_clips

from .convert_helpers import run_cli

# class folder -> shared files in it
LAYOUT = {
    "kinetics": ["mmaction2__demo.mp4", "mmaction2__part_0.mp4", "decord__corrupted.mp4"],
    "ucf": ["mmaction2__test.avi", "decord__video_90.mov", "torchcodec__h265_video.mp4"],
    "web": ["moviepy__no_duration.webm", "moviepy__big_buck_bunny_432_433.webm", "mmcv__test.mp4"],
}
# video id -> (status, clips) with the default settings (16 frames, skip short, keep damaged); the synthetic
# stand-ins have the real files' frame counts and damage, so the same on both tiers
EXPECTED = {
    "kinetics/mmaction2__demo": ("ok", 17),
    "kinetics/mmaction2__part_0": ("ok", 2),
    "kinetics/decord__corrupted": ("partial", 1),
    "ucf/mmaction2__test": ("ok", 10),
    "ucf/decord__video_90": ("short", 0),
    "ucf/torchcodec__h265_video": ("short", 0),
    "web/moviepy__no_duration": ("ok", 4),
    "web/moviepy__big_buck_bunny_432_433": ("ok", 1),
    "web/mmcv__test": ("ok", 10),
}


@pytest.fixture(scope="module")
def layout_tree(tmp_path_factory, videos) -> str:
    """Class folders (LAYOUT) of symlinks to one tier's shared videos (read in place, never copied)."""
    root = tmp_path_factory.mktemp(f"layout_{videos.tier}")
    for cls, names in LAYOUT.items():
        (root / cls).mkdir()
        for name in names:
            os.symlink(videos.path(name), root / cls / name)
    return str(root)


def _opts(**kw) -> JobOptions:
    shard = kw.pop("shard", ShardOptions())
    return JobOptions(workers=2, progress=False, shard=shard, **kw)


def _reference_clips(path: str, config: ConvertConfig) -> list[np.ndarray]:
    frames, _ = decode_all(path, config.frame_spec())
    return [c.frames for c in cut_clips(iter(frames), config.clip_spec())]


@pytest.mark.parametrize("codec", ["raw", "lz4"])
def test_round_trip_is_bit_exact_on_the_shared_videos(layout_tree, videos, tmp_path, codec):
    config = ConvertConfig(codec=codec)
    result = run_job(layout_tree, str(tmp_path / "out"), config, _opts(shards=3))
    store = open_clips(str(tmp_path / "out"))
    assert store.classes == ["kinetics", "ucf", "web"]
    got: dict[str, list] = {}
    for i in range(len(store)):
        s = store[i]
        got.setdefault(s.video_id, []).append(s)
    assert {v: len(c) for v, c in got.items()} == {v: n for v, (_, n) in EXPECTED.items() if n}
    for vid, samples in got.items():
        cls, name = vid.split("/")
        ref = _reference_clips(videos.path(LAYOUT_EXT[name]), config)
        assert [s.clip_index for s in samples] == list(range(len(samples)))
        for s in samples:
            assert s.label == store.classes.index(cls)
            assert s.clip.shape == (16, 128, 171, 3) and s.clip.dtype == np.uint8
            assert np.array_equal(s.clip, ref[s.clip_index]), (vid, s.clip_index)
    assert result["totals"]["clips"] == sum(n for _, n in EXPECTED.values())
    assert verify(str(tmp_path / "out"))[0] == []


LAYOUT_EXT = {os.path.splitext(n)[0]: n for names in LAYOUT.values() for n in names}


def test_report_records_every_video_that_is_not_ok(layout_tree, tmp_path):
    out = tmp_path / "out"
    result = run_job(layout_tree, str(out), ConvertConfig(), _opts())
    report = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert {r["id"]: r["status"] for r in report} == {v: s for v, (s, _) in EXPECTED.items() if s != "ok"}
    by_id = {r["id"]: r for r in report}
    assert "InvalidDataError after 28 good frames" in by_id["kinetics/decord__corrupted"]["reason"]
    assert by_id["ucf/decord__video_90"]["reason"] == "3 frames, a clip needs 16; skipped by policy"
    assert by_id["ucf/decord__video_90"]["path"].endswith("decord__video_90.mov")
    assert result["status_counts"] == {"ok": 6, "partial": 1, "short": 2}


def test_short_and_damage_policies(layout_tree, videos, tmp_path):
    out = tmp_path / "loop"
    run_job(layout_tree, str(out), ConvertConfig(short="loop", on_damage="skip"), _opts())
    store = open_clips(str(out))
    ids = set(store.video_ids)
    assert "kinetics/decord__corrupted" not in ids
    v90 = [store[i] for i in range(len(store)) if store[i].video_id == "ucf/decord__video_90"]
    assert len(v90) == 1
    frames, _ = decode_all(videos.path("decord__video_90.mov"), FrameSpec())
    assert np.array_equal(v90[0].clip, frames[[i % 3 for i in range(16)]])
    h265 = [store[i] for i in range(len(store)) if store[i].video_id == "ucf/torchcodec__h265_video"][0]
    frames, _ = decode_all(videos.path("torchcodec__h265_video.mp4"), FrameSpec())
    assert np.array_equal(h265.clip, frames[[i % 10 for i in range(16)]])
    report = {json.loads(line)["id"]: json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()}
    assert report["kinetics/decord__corrupted"]["status"] == "failed"
    assert report["kinetics/decord__corrupted"]["reason"].startswith("damaged, skipped by policy")
    assert report["ucf/decord__video_90"]["status"] == "padded"


def test_clip_options_stride_step_max_clips_short_side_fps(layout_tree, videos, tmp_path):
    config = ConvertConfig(size=None, short_side=64, fps=10, clip_len=8, stride=2, step=4, max_clips=3,
                           codec="lz4")
    run_job(layout_tree, str(tmp_path / "o"), config, _opts())
    store = open_clips(str(tmp_path / "o"))
    demo = [store[i] for i in range(len(store)) if store[i].video_id == "kinetics/mmaction2__demo"]
    assert len(demo) == 3
    frames, _ = decode_all(videos.path("mmaction2__demo.mp4"), config.frame_spec())
    assert frames.shape[1:] == (64, 85, 3)
    for s in demo:
        start = 4 * s.clip_index
        assert np.array_equal(s.clip, frames[start:start + 15:2])


def test_tiny_initial_map_size_still_converts_everything(layout_tree, tmp_path):
    opts = _opts(shards=1, shard=ShardOptions(store=LmdbOptions(map_size=64 << 10)))
    result = run_job(layout_tree, str(tmp_path / "tiny"), ConvertConfig(), opts)
    assert result["totals"]["clips"] == sum(n for _, n in EXPECTED.values())
    assert verify(str(tmp_path / "tiny"))[0] == []
    log = (tmp_path / "tiny" / "logs" / "shard-00000.log").read_text()
    assert "growing LMDB map" in log


def test_compact_shrinks_to_the_data(layout_tree, tmp_path):
    opts = _opts(shards=1, shard=ShardOptions(store=LmdbOptions(map_size=1 << 30, compact=True)))
    result = run_job(layout_tree, str(tmp_path / "c"), ConvertConfig(codec="lz4"), opts)
    size = os.path.getsize(tmp_path / "c" / "shards" / "shard-00000" / "data.mdb")
    assert result["totals"]["value_bytes"] <= size < result["totals"]["value_bytes"] * 1.2 + (1 << 20)
    assert verify(str(tmp_path / "c"))[0] == []


def test_crash_and_hang_cost_one_video_each(synth_videos, tmp_path):
    out = tmp_path / "crash"
    r = run_cli(synth_videos, str(out), "--workers", "2", "--shards", "2", "--no-progress",
             env={"CONVERT_TEST_FAULT": "crash:spin/spin_001"})
    assert r.returncode == 0, r.stderr
    report = {json.loads(line)["id"]: json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()}
    assert report["spin/spin_001"]["status"] == "failed"
    reason = report["spin/spin_001"]["reason"]
    assert "killed by SIGSEGV" in reason and "2 attempts" in reason
    store = open_clips(str(out))
    assert len(set(store.video_ids)) == 19  # every other video is there

    out2 = tmp_path / "hang"
    r = run_cli(synth_videos, str(out2), "--workers", "2", "--no-progress", "--video-timeout", "3", "--retries", "0",
             env={"CONVERT_TEST_FAULT": "hang:move_up/move_up_002"})
    assert r.returncode == 0, r.stderr
    report = {json.loads(line)["id"]: json.loads(line) for line in (out2 / "report.jsonl").read_text().splitlines()}
    assert "per-video timeout" in report["move_up/move_up_002"]["reason"]
    assert len(set(open_clips(str(out2)).video_ids)) == 19


def test_memory_limit_turns_a_huge_allocation_into_one_failed_video(synth_videos, tmp_path):
    out = tmp_path / "mem"
    r = run_cli(synth_videos, str(out), "--workers", "2", "--no-progress", "--max-memory", "2G",
             env={"CONVERT_TEST_FAULT": "alloc:spin/spin_003"})
    assert r.returncode == 0, r.stderr
    report = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert report == [{"id": "spin/spin_003", "path": report[0]["path"], "status": "failed",
                       "reason": "out of memory while decoding (see --max-memory)"}]
    assert len(set(open_clips(str(out)).video_ids)) == 19


def test_crash_once_is_retried_and_converted(synth_videos, tmp_path):
    marker = tmp_path / "crashed-once"
    out = tmp_path / "o"
    r = run_cli(synth_videos, str(out), "--workers", "1", "--no-progress",
             env={"CONVERT_TEST_FAULT": f"crash_once:move_left/move_left_000:{marker}"})
    assert r.returncode == 0, r.stderr
    assert marker.exists()
    assert "move_left/move_left_000" in open_clips(str(out)).video_ids
    assert (out / "report.jsonl").read_text() == ""


@pytest.mark.parametrize("args, message", [
    (["/nonexistent/src", "OUT"], "convert: error: /nonexistent/src: no such file or directory"),
    (["SYNTH", "OUT", "--codec", "zip"], "invalid choice: 'zip'"),
    (["SYNTH", "OUT", "--size", "128"], "size must be HxW"),
    (["BADCSV", "OUT", "--videos", "SYNTH"], "CSV lacks column(s) youtube_id, time_start, time_end"),
    (["SYNTH", "NOTEMPTY"], "not empty and holds no conversion"),
])
def test_unusable_arguments_fail_before_any_work(synth_videos, tmp_path, args, message):
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text("label,video\n")
    (tmp_path / "notempty").mkdir()
    (tmp_path / "notempty" / "x").write_text("x")
    subst = {"SYNTH": synth_videos, "OUT": str(tmp_path / "out"), "BADCSV": str(bad_csv),
             "NOTEMPTY": str(tmp_path / "notempty")}
    r = run_cli(*[subst.get(a, a) for a in args])
    assert r.returncode == 2
    assert message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_rerun_is_a_no_op_and_other_settings_are_refused(synth_videos, tmp_path):
    out = tmp_path / "o"
    assert run_cli(synth_videos, str(out), "--workers", "2", "--no-progress").returncode == 0
    mtimes = {p: os.path.getmtime(p) for p in (out / "shards").glob("*/data.mdb")}
    r = run_cli(synth_videos, str(out), "--workers", "2", "--no-progress")
    assert r.returncode == 0 and "already complete" in r.stdout
    assert mtimes == {p: os.path.getmtime(p) for p in (out / "shards").glob("*/data.mdb")}
    r = run_cli(synth_videos, str(out), "--codec", "lz4")
    assert r.returncode == 2 and "codec 'raw' -> 'lz4'" in r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["backend"] = "tfrecord"
    (out / "manifest.json").write_text(json.dumps(manifest))
    r = run_cli(synth_videos, str(out))
    assert r.returncode == 2 and "holds tfrecord shards, asked for lmdb" in r.stderr


def test_verify_names_what_is_wrong(synth_videos, tmp_path):
    import lmdb

    out = tmp_path / "o"
    assert run_cli(synth_videos, str(out), "--workers", "2", "--shards", "2", "--no-progress").returncode == 0
    r = run_cli("verify", str(out))
    assert r.returncode == 0 and "ok (2 shards, 20 videos" in r.stdout
    env = lmdb.open(str(out / "shards" / "shard-00001"), map_size=1 << 30)
    with env.begin(write=True) as txn:
        key, value = next(iter(txn.cursor()))
        changed = bytearray(value)
        changed[-1] ^= 0xFF
        txn.put(key, bytes(changed))
    env.close()
    r = run_cli("verify", str(out))
    assert r.returncode == 1
    assert f"shard-00001: {key.decode()}: payload crc32" in r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][0]["sha256"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(manifest))
    r = run_cli("verify", str(out))
    assert "shard-00000: checksum" in r.stderr and "differs from manifest 0000000000000000" in r.stderr
    import shutil

    shutil.rmtree(out / "shards" / "shard-00000")
    r = run_cli("verify", str(out))
    assert "shard-00000: missing" in r.stderr


def test_inspect_summary_and_sheet(synth_videos, tmp_path):
    out = tmp_path / "o"
    assert run_cli(synth_videos, str(out), "--workers", "2", "--codec", "lz4", "--no-progress").returncode == 0
    sheet = tmp_path / "sheet.png"
    r = run_cli("inspect", str(out), "--sheet", str(sheet), "--rows", "5")
    assert r.returncode == 0, r.stderr
    store = open_clips(str(out))
    counts = np.bincount(store.labels(), minlength=5)
    for name, k in zip(store.classes, counts):
        assert f"{k:8d}  {name}" in r.stdout
    from PIL import Image

    img = Image.open(sheet)
    assert img.size == (4 * 173, 5 * (128 + 16))


def test_dask_cluster_gives_the_same_shards(synth_videos, tmp_path):
    if importlib.util.find_spec("distributed") is None:
        pytest.skip("distributed not installed")
    a = run_job(synth_videos, str(tmp_path / "joblib"), ConvertConfig(), _opts(shards=3))
    # In a subprocess: importing distributed installs tblib's exception pickling
    # process-wide, which DALI's worker unpickler (used by later tests) refuses.
    r = run_cli(synth_videos, str(tmp_path / "dask"), "--dask", "local", "--workers", "2", "--shards", "3",
             "--no-progress")
    assert r.returncode == 0, r.stderr
    b = json.loads((tmp_path / "dask" / "manifest.json").read_text())
    assert [s["sha256"] for s in a["shards"]] == [s["sha256"] for s in b["shards"]]
    assert a["totals"] == b["totals"] and a["totals"]["videos"] == 20


def test_a_tiny_video_timeout_fails_slow_videos_and_never_blames_the_store(synth_videos, tmp_path):
    """--video-timeout is the decoder's budget: at 0.05 s the videos that decode slower are recorded as timed out
    and the job ends (status 0), rather than stopping with "the store hangs" for the time a process took to wake
    up; a rerun ends the same way."""
    out = tmp_path / "tiny"
    for _ in range(2):
        r = run_cli(synth_videos, str(out), "--workers", "2", "--shards", "2", "--no-progress", "--video-timeout",
                    "0.05", "--retries", "0")
        assert r.returncode == 0, r.stderr
        assert "store hangs" not in r.stderr
    lines = (out / "report.jsonl").read_text().splitlines() if (out / "report.jsonl").exists() else []
    reasons = [json.loads(line)["reason"] for line in lines]
    assert all("per-video timeout" in reason or "clip" in reason for reason in reasons), reasons
