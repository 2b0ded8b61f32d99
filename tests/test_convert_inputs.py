"""Inputs that hang or loop FFmpeg end the job all the same (issue 19, points 5 and 6).

A FIFO named like a video blocks whoever opens it (no writer ever comes); an
ffconcat file named like a video made FFmpeg open the files it lists, itself
included. Every job here runs as a user runs it, in a subprocess with a
timeout: before the fixes these jobs never ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from fractions import Fraction

import numpy as np
import pytest

from convert.job.run import JobOptions, prepare
from convert.job.space import Prober
from convert.synth import render, write_mp4
from convert.worker.plan import ConvertConfig
from convert.worker.sources import VideoItem
from loaders import open_clips

from .convert_helpers import popen_cli

JOB_TIMEOUT = 120  # seconds: each job here takes a few; a hang is a failure, not a stuck suite


def _good_videos(root, names: list[str]) -> None:
    for k, name in enumerate(names):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_mp4(str(path), render("spin", np.random.default_rng(k), 20, 64, 80), Fraction(25))


def _run(*args: str, env: dict | None = None) -> tuple[int, str, str]:
    """``python -m convert ARGS`` to its end; the test fails (the job and its children killed) if it hangs."""
    proc = popen_cli(*args, "--no-progress", "--workers", "2", env=env)
    try:
        stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the job did not end within {JOB_TIMEOUT} s")
    return proc.returncode, stdout, stderr


def _report(out: str) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, open(os.path.join(out, "report.jsonl")))}


def _assert_only_it_failed(out: str, stdout: str, video_id: str, path, reason: str) -> None:
    """``video_id`` (at ``path``) recorded failed for ``reason`` and said so; the good videos converted."""
    assert _report(out)[video_id] == {"id": video_id, "path": str(path), "status": "failed", "reason": reason}
    assert f"  failed: {path}: {reason}\n" in stdout
    assert sorted(set(open_clips(out).video_ids)) == ["a/good0", "a/good1", "b/good2"]


def _source(tmp_path, kind: str) -> str:
    """Good videos in class folders a/ and b/, with a/x.mp4 beside them; SRC for ``kind``."""
    root = tmp_path / "src"
    _good_videos(root, ["a/good0.mp4", "a/good1.mp4", "b/good2.mp4"])
    if kind == "folders":
        return str(root)
    lst = root / "list.txt"
    lst.write_text("a/good0.mp4 a\na/x.mp4 a\na/good1.mp4 a\nb/good2.mp4 b\n")
    return str(lst)


@pytest.mark.parametrize("kind", ["folders", "list"])
def test_a_fifo_named_like_a_video_is_rejected_at_planning(tmp_path, kind):
    src = _source(tmp_path, kind)
    fifo = tmp_path / "src" / "a" / "x.mp4"
    os.mkfifo(fifo)
    out = str(tmp_path / "out")
    rc, stdout, stderr = _run(src, out)
    assert rc == 0, stderr
    assert _report(out)["a/x"] == {"id": "a/x", "path": str(fifo), "status": "rejected",
                                   "reason": "not a regular file (a FIFO): never opened as a video"}
    assert f"  rejected: {fifo}: not a regular file (a FIFO): never opened as a video\n" in stdout
    assert sorted(set(open_clips(out).video_ids)) == ["a/good0", "a/good1", "b/good2"]


@pytest.mark.parametrize("kind", ["folders", "list"])
def test_a_video_replaced_by_a_fifo_after_planning_fails_and_the_job_ends(tmp_path, kind):
    """The plan names x.mp4 (a video at the first run); by the rerun it is a FIFO. Before the fix the space
    check opened it in the job process and the job waited on that thread forever."""
    src = _source(tmp_path, kind)
    fifo = tmp_path / "src" / "a" / "x.mp4"
    _good_videos(tmp_path / "src", ["a/x.mp4"])
    out = str(tmp_path / "out")
    plan = prepare(src, out, ConvertConfig(), JobOptions(workers=2, progress=False))
    assert "a/x" in {it.id for shard in plan.shards for it in shard}
    fifo.unlink()
    os.mkfifo(fifo)
    rc, stdout, stderr = _run(src, out, "--video-timeout", "20")
    assert rc == 0, stderr
    reason = ("cannot open: not a regular file (a FIFO, a device or a socket would block or never end): never "
              "opened as a video")
    _assert_only_it_failed(out, stdout, "a/x", fifo, reason)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_probe_that_hangs_is_killed_after_its_timeout(tmp_path, monkeypatch):
    """The space check's probes run in a child process; one that hangs costs its timeout, then the process is
    killed and the next probe gets a fresh one."""
    _good_videos(tmp_path, ["a.mp4", "b.mp4"])
    monkeypatch.setenv("CONVERT_TEST_FAULT", "hang_probe:a")
    with Prober(config=ConvertConfig(), timeout=2.0) as prober:
        t0 = time.monotonic()
        assert prober.size(VideoItem("a", str(tmp_path / "a.mp4"), 0)) is None
        assert 2.0 <= time.monotonic() - t0 < 15
        first = prober._child
        assert first is None  # killed and forgotten
        assert prober.size(VideoItem("b", str(tmp_path / "b.mp4"), 0)) == 16 * 128 * 171 * 3 + 256
        assert prober._child is not None
        pid = prober._child.proc.pid
    assert not _alive(pid)


def test_the_job_ends_when_a_probe_hangs(tmp_path):
    src = _source(tmp_path, "folders")
    out = str(tmp_path / "out")
    t0 = time.monotonic()
    rc, _, stderr = _run(src, out, "--video-timeout", "3", env={"CONVERT_TEST_FAULT": "hang_probe:a/good0"})
    assert rc == 0, stderr
    assert time.monotonic() - t0 < 60
    assert sorted(set(open_clips(out).video_ids)) == ["a/good0", "a/good1", "b/good2"]


@pytest.mark.parametrize("names", ["itself", "another video"])
def test_an_ffconcat_file_named_like_a_video_fails_in_one_line_and_the_job_ends(tmp_path, names):
    """Issue 19, point 6: FFmpeg's concat demuxer opened the file it lists; naming itself, until about 20,000
    descriptors were open. Now it is refused as a format that opens other files."""
    src = _source(tmp_path, "folders")
    bad = tmp_path / "src" / "a" / "self.mp4"
    target = "self.mp4" if names == "itself" else str(tmp_path / "src" / "b" / "good2.mp4")
    bad.write_text(f"ffconcat version 1.0\nfile '{target}'\n")
    out = str(tmp_path / "out")
    rc, stdout, stderr = _run(src, out)
    assert rc == 0, stderr
    reason = ("cannot open: FFmpeg reads it as 'concat', not as a video file (a concat list, a playlist or an "
              "image sequence would open other files); refused")
    _assert_only_it_failed(out, stdout, "a/self", bad, reason)


def test_complete_videos_with_long_audio_or_cover_art_are_kept_whole_under_on_damage_skip(tmp_path):
    """Issue 19, point 2: such videos were reported truncated, so --on-damage skip dropped them. Each is 'ok'
    now, its clips those of the same video without the extra track."""
    from .test_convert_decode import _cover_first, _write_av

    root = tmp_path / "src"
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
    made = {
        "a/plain": _write_av(str(root / "a" / "plain.mkv"), video="libx264", audio=None),
        "a/long_audio": _write_av(str(root / "a" / "long_audio.mkv"), video="libx264", audio="aac"),
        "b/plain": _write_av(str(root / "b" / "plain.webm"), video="libvpx-vp9", audio=None),
        "b/long_audio": _write_av(str(root / "b" / "long_audio.webm"), video="libvpx-vp9", audio="libopus"),
        "b/cover_first": _write_av(str(root / "b" / "cover_first.mp4"), video="libx264", audio="aac",
                                   audio_s=1.0, cover=True),
    }
    _cover_first(made["b/cover_first"])
    out = str(tmp_path / "out")
    rc, _, stderr = _run(str(root), out, "--on-damage", "skip", "--clip-len", "8")
    assert rc == 0, stderr
    assert open(os.path.join(out, "report.jsonl")).read() == ""  # every video ok: nothing to report
    store = open_clips(out)
    clips: dict[str, list[np.ndarray]] = {}
    for i in range(len(store)):
        sample = store[i]
        clips.setdefault(sample.video_id, []).append(sample.clip)
    assert {v: len(c) for v, c in clips.items()} == {v: 3 for v in made}  # 25 frames: 3 clips of 8
    for video, like in (("a/long_audio", "a/plain"), ("b/long_audio", "b/plain"), ("b/cover_first", "a/plain")):
        assert all(np.array_equal(x, y) for x, y in zip(clips[video], clips[like], strict=True)), video
