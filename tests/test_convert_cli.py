"""The errors and summaries a user reads: one line, the right exit status, what to do next."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from convert.job.summary import first_problems, print_summary

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
    # Every video not converted whole, as the counts above show them: the problems, then the short one skipped.
    assert lines[0] == ("videos: 1 ok, 1 short (0 padded), 1 partial (clips kept up to the damage), 1 failed, "
                        "0 missing, 0 rejected")
    i = lines.index(f"not converted, or only partly (3; all in {report}):")
    assert lines[i + 1].startswith(f"  partial: {src}/a/decord__corrupted.mp4: kept 1 clips before the damage: "
                                   f"InvalidDataError after 28 good frames")
    assert lines[i + 2].startswith(f"  failed: {src}/b/junk.mp4: cannot open: ")
    assert lines[i + 3] == (f"  short: {src}/b/torchcodec__h265_video.mp4: 10 frames, a clip needs 16; "
                            f"skipped by policy")
    assert lines[i + 4].startswith("shards: ")
    assert "shape 16 x short side 120 x 3, the long side varies with each video's aspect, " in stdout


def test_first_problems_lists_problems_then_skipped_short_videos_and_counts_them_all(tmp_path):
    recs = [{"id": f"v{k}", "path": f"/v{k}.mp4", "status": s, "reason": "r"}
            for k, s in enumerate(["short", "failed", "padded", "missing", "rejected", "partial", "failed", "failed"])]
    (tmp_path / "report.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    found, total = first_problems(str(tmp_path), n=5)
    # A skipped short video is not converted either (a padded one is): counted, and listed after the problems.
    assert total == 7 and [r["id"] for r in found] == ["v1", "v3", "v4", "v5", "v6"]
    found, total = first_problems(str(tmp_path), n=10)
    assert total == 7 and [r["id"] for r in found] == ["v1", "v3", "v4", "v5", "v6", "v7", "v0"]


def _summary_lines(folder, statuses: list[str], capsys, out: str | None = None, **result) -> list[str]:
    """What ``print_summary`` prints for a conversion written at ``folder`` (OUT itself, unless ``out`` is given)
    whose report holds one video of each status."""
    recs = [{"id": f"v{k}", "path": f"/src/v{k}.mp4", "status": s, "reason": f"why {k}"}
            for k, s in enumerate(statuses)]
    (folder / "report.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    counts: dict[str, int] = {"ok": 3}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    print_summary(out or str(folder), {"status_counts": counts, "shards": [{}], "backend": "lmdb", "codec": "raw",
                                       "totals": {"clips": 20, "value_bytes": 0, "videos": 3 + len(statuses)},
                                       "clip_shape": [16, 8, 8, 3], **result}, False)
    return capsys.readouterr().out.splitlines()


def test_the_summary_lists_every_video_its_counts_show_as_not_converted(tmp_path, capsys):
    """One partial video and two skipped short ones (the case a user met: the counts said 2 short, the list
    named the partial one alone); a padded video is converted, so it is not listed."""
    lines = _summary_lines(tmp_path, ["short", "partial", "padded", "short"], capsys)
    assert lines[0] == ("videos: 3 ok, 3 short (1 padded), 1 partial (clips kept up to the damage), 0 failed, "
                        "0 missing, 0 rejected")
    i = lines.index(f"not converted, or only partly (3; all in {tmp_path}/report.jsonl):")
    assert lines[i + 1:i + 5] == ["  partial: /src/v1.mp4: why 1", "  short: /src/v0.mp4: why 0",
                                  "  short: /src/v3.mp4: why 3", f"shards: {tmp_path}/shards  manifest: "
                                  f"{tmp_path}/manifest.json  report: {tmp_path}/report.jsonl"]


def test_the_summary_says_how_many_more_are_not_listed(tmp_path, capsys):
    lines = _summary_lines(tmp_path, ["short"] * 4 + ["failed"] * 3, capsys)
    i = lines.index(f"not converted, or only partly (7; all in {tmp_path}/report.jsonl):")
    assert [ln.split(":")[0] for ln in lines[i + 1:i + 6]] == ["  failed"] * 3 + ["  short"] * 2
    assert lines[i + 6] == "  ... and 2 more"


def test_the_summary_of_a_conversion_to_a_url_lists_from_the_staging_report(tmp_path, capsys):
    """OUT a URL: the report is read where the job wrote it, the staging folder (before: nothing was listed)."""
    url = "s3://bucket/out"
    lines = _summary_lines(tmp_path, ["short", "failed"], capsys, out=url, staging=str(tmp_path), uploaded=1,
                           already_there=6, removed=0)
    assert "upload: 1 file(s) uploaded, 6 already there with the same content, 0 object(s) removed" in lines
    i = lines.index(f"not converted, or only partly (2; all in {url}/report.jsonl):")
    assert lines[i + 1:i + 3] == ["  failed: /src/v1.mp4: why 1", "  short: /src/v0.mp4: why 0"]


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


@pytest.mark.parametrize("kind, what", [("folders", "a folder of class folders"), ("list", "a list file")])
def test_split_with_a_source_that_is_no_csv_is_a_one_line_usage_error(tmp_path, kind, what):
    """--split selects rows of a Kinetics CSV; with any other SRC it would select nothing (it was ignored: the
    conversion held every video while its user believed it held one split)."""
    if kind == "folders":
        (tmp_path / "src" / "a").mkdir(parents=True)
        src = str(tmp_path / "src")
    else:
        src = str(tmp_path / "list.txt")
        (tmp_path / "list.txt").write_text("a/x.mp4 0\n")
    new_out = str(tmp_path / "new")
    r = run_cli(src, new_out, "--split", "train", "--no-progress")
    assert r.returncode == 2, r.stderr
    assert r.stderr == (f"python -m convert: error: argument --split: only a Kinetics CSV source has a split column; "
                        f"SRC {src} is {what}: drop --split, or give the CSV (see python -m convert --help)\n")
    assert not os.path.exists(new_out)


def test_load_source_refuses_a_split_for_a_folder_of_class_folders(tmp_path):
    from convert.worker.sources import SourceError, load_source

    (tmp_path / "a").mkdir()
    with pytest.raises(SourceError, match=r"argument --split: only a Kinetics CSV source has a split column; SRC .* "
                                          r"is a folder of class folders"):
        load_source(str(tmp_path), split="val")


def test_a_plan_that_recorded_a_split_for_a_folder_source_reruns_without_it(tmp_path):
    """An OUT written when --split was still ignored for class folders: its rerun, now without --split (which
    is refused), is the same source, not another split."""
    from convert.worker.plan import ConvertConfig, Plan, PlanError, check_same

    config = ConvertConfig()
    info = {"path": str(tmp_path / "src"), "videos": None, "split": None}
    folders = Plan(config, [], [], source={**info, "split": "train", "kind": "folders"})
    check_same(folders, config, info, str(tmp_path))
    csv = Plan(config, [], [], source={**info, "split": "train", "kind": "csv"})
    with pytest.raises(PlanError, match="was converted with --split train, not None; use another OUT or the same"):
        check_same(csv, config, info, str(tmp_path))


PROGRESS_LINE = re.compile(r"progress: \d+ of 4 videos, \d+ clips, \d+\.\d clips/s, "
                           r"(about (\d+ s|\d+ min \d\d s|\d+ h \d\d min) left|time left not known yet|finishing)")


def test_a_job_not_on_a_terminal_prints_progress_lines_and_no_progress_turns_them_off(tiny_synthetic_tree, tmp_path):
    """Written to a pipe (as here: the output is captured), there is no bar: a progress line comes at a fixed
    interval (every minute; CONVERT_PROGRESS_INTERVAL makes it short enough to see in a short job)."""
    args = ("--size", "32x40", "--max-clips", "1", "--workers", "2")
    fast = {"CONVERT_PROGRESS_INTERVAL": "0.02"}
    r = run_cli(tiny_synthetic_tree, str(tmp_path / "lines"), *args, env=fast)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("progress: ")]
    assert lines, r.stderr
    assert all(PROGRESS_LINE.fullmatch(ln) for ln in lines), lines
    assert "progress: " not in r.stdout  # stdout stays the summary (with --json, the JSON alone)

    r = run_cli(tiny_synthetic_tree, str(tmp_path / "quiet"), *args, "--no-progress", env=fast)
    assert r.returncode == 0, r.stderr
    assert "progress" not in r.stderr, r.stderr

    r = run_cli(tiny_synthetic_tree, str(tmp_path / "bad"), *args, env={"CONVERT_PROGRESS_INTERVAL": "soon"})
    assert r.returncode == 2
    assert r.stderr == ("convert: error: CONVERT_PROGRESS_INTERVAL='soon': the seconds between progress lines must "
                        "be a number above 0, at most 604800\n")
    assert not os.path.exists(tmp_path / "bad")


def test_progress_line_says_videos_of_total_clips_rate_and_time_left():
    from convert.job.progress import progress_line

    # 20 of 200 done, 10 of them by this run in 30 s: 180 left at 3 s each.
    state = {"done": 20, "new": 10, "clips": 45}
    assert progress_line(state, 200, 30.0) == "progress: 20 of 200 videos, 45 clips, 1.5 clips/s, about 9 min 00 s left"
    assert progress_line({}, 200, 5.0) == "progress: 0 of 200 videos, 0 clips, 0.0 clips/s, time left not known yet"
    assert progress_line({"done": 4, "new": 4, "clips": 8}, 4, 2.0).endswith(", 4.0 clips/s, finishing")


def test_the_progress_thread_prints_a_line_each_interval_and_forgets_an_earlier_runs_files(tmp_path, monkeypatch):
    import io
    import time

    from convert.format import PROGRESS_DIR
    from convert.job import progress

    folder = tmp_path / PROGRESS_DIR
    folder.mkdir()
    (folder / "shard-00000.json").write_text(json.dumps({"done": 3, "new": 3, "clips": 99}))  # a killed run's
    monkeypatch.setattr(progress, "PROGRESS_LINE_S", 0.02)
    stream = io.StringIO()
    bar = progress.ProgressBar(str(tmp_path), 10, False, every=progress.line_interval(), stream=stream)
    assert not (folder / "shard-00000.json").exists()
    (folder / "shard-00001.json").write_text(json.dumps({"done": 2, "new": 1, "clips": 4}))
    bar.start()
    deadline = time.monotonic() + 30
    while stream.getvalue().count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    bar.stop.set()
    bar.join()
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 2 and all(ln.startswith("progress: 2 of 10 videos, 4 clips, ") for ln in lines), lines
    # Off: neither a bar nor lines, and nothing removed.
    quiet = progress.ProgressBar(str(tmp_path), 10, False)
    quiet.start()
    quiet.stop.set()
    quiet.join()
    assert (folder / "shard-00001.json").exists()
