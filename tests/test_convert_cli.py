"""The errors and summaries a user reads: one line, the right exit status, what to do next."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from convert.summary import first_problems, print_summary

from .convert_helpers import run_cli


@pytest.fixture(scope="module")
def converted(tmp_path_factory, videos) -> tuple[str, str, str]:
    """(source tree, OUT, its stdout): a damaged video, an unreadable file, a short one and a good one, at
    --short-side 120."""
    root = tmp_path_factory.mktemp("cli")
    src = root / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    for cls, name in (("a", "decord__corrupted.mp4"), ("a", "mmcv__test.mp4"), ("b", "torchcodec__h265_video.mp4")):
        os.symlink(videos.path(name), src / cls / name)
    (src / "b" / "junk.mp4").write_bytes(b"\0" * 1000)
    out = str(root / "out")
    r = run_cli(str(src), out, "--short-side", "120", "--workers", "2", "--no-progress")
    assert r.returncode == 0, r.stderr
    return str(src), out, r.stdout


def test_summary_names_the_failed_files_and_the_report(converted):
    src, out, stdout = converted
    report = os.path.join(out, "report.jsonl")
    lines = stdout.splitlines()
    i = lines.index(f"not converted, or only partly (2; all in {report}):")
    assert lines[i + 1].startswith(f"  partial: {src}/a/decord__corrupted.mp4: kept 1 clips before the damage: "
                                   f"InvalidDataError after 28 good frames")
    assert lines[i + 2].startswith(f"  failed: {src}/b/junk.mp4: cannot open: ")
    assert lines[i + 3].startswith("shards: ")
    assert "shape 16 x short side 120 x 3, the long side varies with each video's aspect, " in stdout


def test_first_problems_skips_policy_outcomes_and_counts_the_rest(tmp_path):
    recs = [{"id": f"v{k}", "path": f"/v{k}.mp4", "status": s, "reason": "r"}
            for k, s in enumerate(["short", "failed", "padded", "missing", "rejected", "partial", "failed", "failed"])]
    (tmp_path / "report.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    found, total = first_problems(str(tmp_path), n=5)
    assert total == 6 and [r["id"] for r in found] == ["v1", "v3", "v4", "v5", "v6"]


def test_summary_rate_counts_only_this_runs_clips(tmp_path, capsys):
    result = {"status_counts": {"ok": 4}, "totals": {"clips": 20, "value_bytes": 0, "videos": 4}, "shards": [{}],
              "backend": "lmdb", "codec": "raw", "clip_shape": [16, 128, 171, 3], "seconds": 2.0,
              "converted": {"videos": 1, "clips": 5}}
    print_summary(str(tmp_path), result, False)
    out = capsys.readouterr().out
    assert "time:   2.0 s, 5 clips converted in this run, 2.5 clips/s\n" in out
    assert "shape 16 x 128 x 171 x 3, " in out


def test_inspect_describes_a_short_side_shape(converted):
    _, out, _ = converted
    r = run_cli("inspect", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == (f"{out}: 11 clips of shape 16 x short side 120 x 3, the long side varies "
                                        f"with each video's aspect from 2 videos, codec raw")


@pytest.mark.parametrize("args, message", [
    (["SRC", "OUT", "--short-side", "0"], "argument --short-side: must be a whole number of pixels in 2..8192 "
                                          "(the shorter side of every frame; or give --size HxW), got '0'"),
    (["verfy", "OUT"], "convert: error: verfy: no such file or directory, nor a sub-command; "
                       "did you mean 'python -m convert verify OUT'?"),
    (["inspekt"], "did you mean 'python -m convert inspect'?"),
])
def test_user_errors_say_what_to_do(converted, tmp_path, args, message):
    src, _, _ = converted
    new_out = str(tmp_path / "new")
    r = run_cli(*[{"SRC": src, "OUT": new_out}.get(a, a) for a in args])
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message.replace("OUT", new_out) in r.stderr
    assert not os.path.exists(new_out)


@pytest.mark.parametrize("cmd", ["verify", "inspect"])
def test_verify_and_inspect_agree_on_exit_status(converted, tmp_path, cmd):
    _, out, _ = converted
    missing = str(tmp_path / "nope")
    r = run_cli(cmd, missing)
    assert (r.returncode, r.stderr) == (2, f"{cmd}: error: {missing}: does not exist; give the OUT folder of a "
                                           f"conversion\n")
    r = run_cli(cmd, str(tmp_path))
    assert r.returncode == 2 and r.stderr == (f"{cmd}: error: {tmp_path}: no manifest.json; not a finished "
                                              f"conversion (run python -m convert first)\n")
    damaged = str(tmp_path / "damaged")
    shutil.copytree(out, damaged)
    manifest = json.loads(open(os.path.join(damaged, "manifest.json")).read())
    name = next(s["name"] for s in manifest["shards"] if s["clips"])
    os.remove(os.path.join(damaged, "shards", name, "data.mdb"))
    r = run_cli(cmd, damaged)
    assert r.returncode == 1 and name in r.stderr
    assert "Exit status: 0 sound; 1 OUT is a conversion but reading it failed or found problems" in \
        " ".join(run_cli(cmd, "--help").stdout.split())


# (arguments, the flag the one-line error names): every numeric option, hostile values (issue 19, point 10)
HOSTILE = [
    (["--video-timeout", "nan"], "--video-timeout"), (["--video-timeout", "inf"], "--video-timeout"),
    (["--video-timeout", "0"], "--video-timeout"), (["--video-timeout", "1e300"], "--video-timeout"),
    (["--decode-threads", "100000"], "--decode-threads"), (["--decode-threads", "-1"], "--decode-threads"),
    (["--map-size", "0"], "--map-size"), (["--map-size", "1x"], "--map-size"),
    (["--map-size", "9" * 40 + "T"], "--map-size"),
    (["--backend", "tfrecord", "--part-size", "0"], "--part-size"),
    (["--max-memory", "0"], "--max-memory"), (["--max-memory", "9" * 400], "--max-memory"),
    (["--workers", "-1"], "--workers"), (["--workers", "100000"], "--workers"),
    (["--shards", "0"], "--shards"), (["--shards", "10000000000"], "--shards"),
    (["--retries", "-1"], "--retries"), (["--retries", "1e9"], "--retries"),
    (["--clip-len", "0"], "--clip-len"), (["--clip-len", "²"], "--clip-len"), (["--clip-len", "70000"], "--clip-len"),
    (["--stride", "0"], "--stride"), (["--step", "-3"], "--step"), (["--max-clips", "0"], "--max-clips"),
    (["--fps", "nan"], "--fps"), (["--fps", "-inf"], "--fps"), (["--fps", "0"], "--fps"),
    (["--size", "0x0"], "--size"), (["--size", "128x99999"], "--size"),
]


@pytest.mark.parametrize("args, flag", HOSTILE, ids=[" ".join(a) for a, _ in HOSTILE])
def test_every_numeric_option_is_checked_as_it_is_parsed(tmp_path, args, flag):
    new_out = str(tmp_path / "new")
    r = run_cli(str(tmp_path), new_out, "--no-progress", *args)  # refused before SRC is read
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"python -m convert: error: argument {flag}: "), r.stderr
    assert "Traceback" not in r.stderr and not os.path.exists(new_out)


@pytest.mark.parametrize("args, flag", [
    (["inspect", "OUT", "--rows", "0"], "--rows"), (["demo", "--per-class", "-1"], "--per-class"),
    (["demo", "--seconds", "nan"], "--seconds"), (["demo", "--seconds", "inf"], "--seconds"),
    (["demo", "--workers", "-2"], "--workers"), (["demo", "--codec", "zip"], "--codec"),
])
def test_the_sub_commands_check_their_numbers_as_they_are_parsed(tmp_path, args, flag):
    demo_out = str(tmp_path / "demo")
    r = run_cli(*[{"OUT": str(tmp_path)}.get(a, a) for a in args], *(["--out", demo_out] if args[0] == "demo" else []))
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and f"error: argument {flag}: " in r.stderr, r.stderr
    assert not os.path.exists(demo_out)


def test_the_summary_counts_a_partial_video_as_partial_not_failed(tmp_path, capsys):
    result = {"status_counts": {"ok": 4, "partial": 1, "failed": 2, "short": 1}, "shards": [{}], "backend": "lmdb",
              "totals": {"clips": 20, "value_bytes": 0, "videos": 8}, "codec": "raw", "clip_shape": [16, 8, 8, 3]}
    print_summary(str(tmp_path), result, False)
    assert capsys.readouterr().out.splitlines()[0] == (
        "videos: 4 ok, 1 short (0 padded), 1 partial (clips kept up to the damage), 2 failed, 0 missing, 0 rejected")


def test_inspect_says_raw_clips_are_uncompressed_and_a_larger_codec_larger(converted):
    from convert.tools import describe_ratio

    _, out, _ = converted
    r = run_cli("inspect", out)
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("bytes per clip: ")]
    assert line.endswith(", uncompressed") and "smaller" not in line  # before: "1.00x smaller than raw"
    assert describe_ratio("lz4", 1.25) == ", 1.25x smaller than raw"
    assert describe_ratio("jpeg", 0.8) == ", 1.25x larger than raw"


def test_a_job_that_fails_before_writing_anything_leaves_no_out_it_created(tmp_path, stand_in_videos):
    """A device with inodes for OUT and its lock only: the plan cannot be written. The job stops (status 1,
    naming the file) and removes the OUT it created (before: an empty OUT with a lock file and shards/)."""
    import subprocess

    from .conftest import TINY

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    os.symlink(os.path.join(stand_in_videos, TINY["a"][0]), src / "a" / "x.mp4")
    disk = str(tmp_path / "disk")
    os.makedirs(disk)
    # the root, OUT, its lock and shards/: no inode left for the plan
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=10m,nr_inodes=4", "tmpfs", disk], check=True, timeout=30)
    try:
        out = os.path.join(disk, "out")
        r = run_cli(str(src), out, "--no-progress")
        assert r.returncode == 1, r.stderr
        assert r.stderr.startswith(f"convert: error: no space left for {out}/plan.json.tmp.") and \
            r.stderr.count("\n") == 1, r.stderr
        assert not os.path.exists(out)
        assert run_cli(str(src), str(tmp_path / "fine"), "--no-progress").returncode == 0  # the source was fine
    finally:
        subprocess.run(["umount", "-l", disk], capture_output=True)
