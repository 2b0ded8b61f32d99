"""Reruns and concurrency on one OUT: the lock, missing shards, new source entries, retrying failures."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from .convert_helpers import popen_cli, run_cli


# class folder -> shared files in it: a few seconds to convert in all
def test_two_jobs_at_once_one_runs_the_other_names_it(tiny_tree, tmp_path):
    out = str(tmp_path / "out")
    # The hang keeps the winner busy for the timeout, so the two surely overlap.
    env = {"CONVERT_TEST_FAULT": "hang:a/mmcv__test"}
    args = (tiny_tree, out, "--workers", "2", "--shards", "2", "--video-timeout", "3", "--retries", "0",
            "--no-progress")
    procs = [popen_cli(*args, env=env) for _ in range(2)]
    results = [(p, *p.communicate(timeout=120)) for p in procs]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 2], [(p.returncode, err) for p, _, err in results]
    winner = next(p for p, _, _ in results if p.returncode == 0)
    _, _, err = next(r for r in results if r[0].returncode == 2)
    assert err.count("\n") == 1
    assert f"{out}: another conversion is writing it (host {socket.gethostname()}, pid {winner.pid}, since " in err
    manifest = json.loads(open(os.path.join(out, "manifest.json")).read())
    assert manifest["status_counts"] == {"failed": 1, "ok": 3}
    assert run_cli("verify", out).returncode == 0
    assert not [n for n in os.listdir(out) if ".tmp" in n]


def test_a_killed_jobs_lock_is_taken_over(tiny_tree, tmp_path):
    out = str(tmp_path / "out")
    proc = popen_cli(tiny_tree, out, "--workers", "1", "--video-timeout", "60", "--no-progress",
                  env={"CONVERT_TEST_FAULT": "hang:a/mmcv__test"})
    lock = os.path.join(out, ".lock")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (os.path.exists(lock) and f'"pid": {proc.pid}' in open(lock).read()):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert json.loads(open(lock).read())["pid"] == proc.pid  # the dead job's name is still in the file
    r = run_cli(tiny_tree, out, "--workers", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert json.loads(open(os.path.join(out, "manifest.json")).read())["status_counts"] == {"ok": 4}
    assert run_cli("verify", out).returncode == 0


def _files(out: str) -> dict:
    """Bytes and mtime of every file under OUT/shards."""
    found = {}
    for dirpath, _, names in os.walk(os.path.join(out, "shards")):
        for name in names:
            p = os.path.join(dirpath, name)
            found[os.path.relpath(p, out)] = (open(p, "rb").read(), os.stat(p).st_mtime_ns)
    return found


def _manifest(out: str) -> dict:
    m = json.loads(open(os.path.join(out, "manifest.json")).read())
    m.pop("created")
    return m


def test_finished_out_with_a_deleted_shard_redoes_only_that_shard(tiny_tree, tmp_path):
    import shutil

    out = str(tmp_path / "out")
    assert run_cli(tiny_tree, out, "--workers", "2", "--shards", "2", "--no-progress").returncode == 0
    first, before = _manifest(out), _files(out)
    shutil.rmtree(os.path.join(out, "shards", "shard-00001"))
    r = run_cli(tiny_tree, out, "--workers", "2", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert f"convert: {out}: 1 shard(s) missing (shard-00001); converting them again" in r.stderr
    assert f", {first['shards'][1]['clips']} clips converted in this run, " in r.stdout  # not all the clips
    assert "already complete" not in r.stdout
    after = _files(out)
    assert {k: v for k, v in after.items() if "shard-00000" in k} == {k: v for k, v in before.items()
                                                                      if "shard-00000" in k}
    assert _manifest(out) == first
    # A shard folder whose data file alone is gone counts as missing too.
    os.remove(os.path.join(out, "shards", "shard-00000", "data.mdb"))
    r = run_cli(tiny_tree, out, "--workers", "2", "--no-progress")
    assert r.returncode == 0 and "(shard-00000)" in r.stderr, r.stderr
    assert {k: v for k, v in _files(out).items() if "shard-00001" in k} == {k: v for k, v in after.items()
                                                                            if "shard-00001" in k}
    assert _manifest(out) == first
    assert run_cli("verify", out).returncode == 0
    r = run_cli(tiny_tree, out, "--no-progress")
    assert r.returncode == 0 and "already complete" in r.stdout


def test_repairing_a_tfrecord_out_keeps_the_kept_shards_file_lists(tiny_tree, tmp_path):
    # The manifest's "files" of a kept shard is what DALI's native reader opens; a repair once dropped it.
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    out, config = str(tmp_path / "out"), ConvertConfig(backend="tfrecord")
    run_job(tiny_tree, out, config, JobOptions(workers=2, shards=2, progress=False))
    first = _manifest(out)
    assert all(s["files"] for s in first["shards"])
    shutil.rmtree(os.path.join(out, "shards", "shard-00001"))
    run_job(tiny_tree, out, config, JobOptions(workers=2, progress=False))
    assert _manifest(out) == first


def test_videos_added_to_the_source_are_counted_and_added_as_new_shards(tiny_tree, tmp_path, videos):
    from loaders import open_clips

    out = str(tmp_path / "out")
    assert run_cli(tiny_tree, out, "--workers", "2", "--shards", "2", "--no-progress").returncode == 0
    first, before = _manifest(out), _files(out)
    for cls, name in (("a", "mmaction2__demo.mp4"), ("b", "moviepy__no_duration.webm")):
        os.symlink(videos.path(name), os.path.join(tiny_tree, cls, name))
    r = run_cli(tiny_tree, out, "--no-progress")
    assert r.returncode == 0 and "already complete" in r.stdout
    assert (f"convert: {out}: 2 video(s) in the source are not in the plan; rerun with --add-new "
            f"to convert them into new shards\n") in r.stderr
    assert _files(out) == before

    r = run_cli(tiny_tree, out, "--workers", "2", "--add-new", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "adding 2 new video(s) as 2 new shard(s), shard-00002 to shard-00003" in r.stderr
    assert _files(out).items() >= before.items()  # every old shard file, byte for byte and untouched
    plan = json.loads(open(os.path.join(out, "plan.json")).read())
    assert [s["name"] for s in plan["shards"]] == [f"shard-0000{i}" for i in range(4)]
    assert plan["added"] == [{"first_shard": 2, "shards": 2, "videos": 2}]
    assert sorted(it[0] for s in plan["shards"][2:] for it in s["items"]) == ["a/mmaction2__demo",
                                                                            "b/moviepy__no_duration"]
    m = _manifest(out)
    assert [s["name"] for s in m["shards"]] == [s["name"] for s in plan["shards"]]
    assert m["shards"][:2] == first["shards"]
    assert m["totals"]["videos"] == 6 and m["totals"]["clips"] == first["totals"]["clips"] + 17 + 4
    assert m["status_counts"] == {"ok": 6}
    assert {"a/mmaction2__demo", "b/moviepy__no_duration"} <= set(open_clips(out).video_ids)
    assert run_cli("verify", out).returncode == 0
    r = run_cli(tiny_tree, out, "--add-new", "--no-progress")
    assert r.returncode == 0 and "already complete" in r.stdout and "not in the plan" not in r.stderr
    # A new class would shift the labels already stored: refused, nothing touched.
    os.makedirs(os.path.join(tiny_tree, "c"))
    os.symlink(videos.path("torchcodec__h265_video.mp4"), os.path.join(tiny_tree, "c", "h.mp4"))
    done = _files(out)
    r = run_cli(tiny_tree, out, "--add-new", "--no-progress")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"{out}: the source's class list differs from the plan's (new: c); adding videos cannot relabel" in r.stderr
    assert _files(out) == done


def test_a_shard_that_cannot_start_reports_the_cause_from_its_log(tiny_tree, tmp_path):
    out = str(tmp_path / "out")
    assert run_cli(tiny_tree, out, "--workers", "2", "--shards", "2", "--no-progress").returncode == 0
    os.remove(os.path.join(out, "manifest.json"))  # unfinished again
    shard = os.path.join(out, "shards", "shard-00001")
    shutil.rmtree(shard)
    open(shard, "w").close()  # a file where the shard's folder belongs: nothing a rerun may delete
    r = run_cli(tiny_tree, out, "--workers", "2", "--no-progress")
    assert r.returncode == 1
    log = os.path.join(out, "logs", "shard-00001.log")
    assert r.stderr == (f"convert: error: shard-00001: shard process died while starting: FileExistsError: "
                        f"[Errno 17] File exists: '{shard}'; see {log}\n")
    assert "FileExistsError" in open(log).read().splitlines()[-1]


def test_an_unfinished_shard_that_cannot_be_opened_is_moved_aside_and_converted_again(tiny_tree, tmp_path):
    out = str(tmp_path / "out")
    assert run_cli(tiny_tree, out, "--workers", "2", "--shards", "2", "--no-progress").returncode == 0
    before = _manifest(out)
    os.remove(os.path.join(out, "manifest.json"))  # unfinished again
    data = os.path.join(out, "shards", "shard-00001", "data.mdb")
    os.truncate(data, 4096)  # the first meta page only: LMDB refuses the file
    r = run_cli(tiny_tree, out, "--workers", "2", "--no-progress")
    assert r.returncode == 0, r.stderr
    (aside,) = os.listdir(os.path.join(out, "damaged"))
    assert aside.startswith("shard-00001-") and os.path.getsize(os.path.join(out, "damaged", aside, "data.mdb")) == 4096
    assert "MDB_INVALID" in r.stderr and f"moved aside to {os.path.join(out, 'damaged', aside)}" in r.stderr
    after = _manifest(out)
    assert [s["sha256"] for s in after["shards"]] == [s["sha256"] for s in before["shards"]]
    assert after["totals"] == before["totals"] and run_cli("verify", out).returncode == 0


def test_last_error_takes_the_final_exception_of_the_last_traceback():
    from convert.job.supervise import describe_exit, last_error

    log = ("2024 shard 1 growing LMDB map\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
           "ValueError: old run\nTraceback (most recent call last):\n  File \"w.py\", line 9, in main\n"
           "    env = lmdb.open(path)\n          ^^^^^^^^^^^^^^^\n"
           "lmdb.CorruptedError: mdb_txn_begin: MDB_CORRUPTED: Located page was wrong type\n")
    assert last_error(log) == "lmdb.CorruptedError: mdb_txn_begin: MDB_CORRUPTED: Located page was wrong type"
    assert last_error("2024 shard 1 growing LMDB map\n") is None
    assert describe_exit(-9, "shard process") == "shard process killed by SIGKILL (out of memory?)"
    assert describe_exit(-11) == "decoder process killed by SIGSEGV"


def _report(out: str) -> dict:
    return {json.loads(line)["id"]: json.loads(line) for line in open(os.path.join(out, "report.jsonl"))}


def test_retry_failed_converts_failed_videos_again_and_keeps_the_rest(tiny_tree, tmp_path):
    from loaders import open_clips

    out = str(tmp_path / "out")
    crash = {"CONVERT_TEST_FAULT": "crash:a/mmcv__test"}
    args = ("--workers", "2", "--shards", "2", "--no-progress")
    assert run_cli(tiny_tree, out, *args, env=crash).returncode == 0
    assert _report(out)["a/mmcv__test"]["reason"] == "decoder process killed by SIGSEGV; 2 attempts"
    clean = str(tmp_path / "clean")
    assert run_cli(tiny_tree, clean, *args).returncode == 0
    before = _files(out)
    failed_shard = next(s["name"] for s in json.loads(open(os.path.join(out, "plan.json")).read())["shards"]
                        if any(it[0] == "a/mmcv__test" for it in s["items"]))

    # Still crashing: the record is replaced by the new attempt's, nothing else changes.
    r = run_cli(tiny_tree, out, "--retry-failed", "--no-progress", env=crash)
    assert r.returncode == 0, r.stderr
    assert f"convert: {out}: retrying 1 video(s) recorded as failed, in 1 shard(s)" in r.stderr
    assert _report(out)["a/mmcv__test"]["reason"] == "decoder process killed by SIGSEGV; 2 attempts"
    assert {k: v for k, v in _files(out).items() if failed_shard not in k} == \
        {k: v for k, v in before.items() if failed_shard not in k}

    r = run_cli(tiny_tree, out, "--retry-failed", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert _report(out) == {}
    assert {k: v for k, v in _files(out).items() if failed_shard not in k} == \
        {k: v for k, v in before.items() if failed_shard not in k}
    a, b = _manifest(out), _manifest(clean)
    assert a["shards"] == b["shards"] and a["status_counts"] == {"ok": 4}  # same checksums as a clean run
    assert "a/mmcv__test" in open_clips(out).video_ids
    assert run_cli("verify", out).returncode == 0
    r = run_cli(tiny_tree, out, "--retry-failed", "--no-progress")
    assert "retrying 0 video(s)" in r.stderr and "already complete" in r.stdout


def test_retry_failed_in_an_unfinished_out_and_a_kill_during_the_retry_records_nothing(tiny_tree, tmp_path):
    out = str(tmp_path / "out")
    args = ("--workers", "1", "--shards", "1", "--no-progress")
    assert run_cli(tiny_tree, out, *args, env={"CONVERT_TEST_FAULT": "crash:b/mmaction2__test"}).returncode == 0
    os.remove(os.path.join(out, "manifest.json"))  # unfinished
    # The retry hangs; the job is killed in the middle of it.
    proc = popen_cli(tiny_tree, out, "--retry-failed", *args, env={"CONVERT_TEST_FAULT": "hang:b/mmaction2__test"})
    from convert.format import FormatError
    from convert.format.lmdb import LmdbReader

    def read_done(shard: str) -> list:
        reader = LmdbReader(shard)
        try:
            return reader.records()
        finally:
            reader.close()

    def polled(shard: str) -> set[str]:
        try:
            return {r.video_id for r in read_done(shard)}
        except FormatError:  # lock-free, a poll can race the writer: look again
            return {"b/mmaction2__test"}

    shard = os.path.join(out, "shards", "shard-00000")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "b/mmaction2__test" in polled(shard):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    records = {r.video_id: r.status for r in read_done(shard)}
    assert records == {"a/mmaction2__part_0": "ok", "a/mmcv__test": "ok", "b/moviepy__big_buck_bunny_432_433": "ok"}
    r = run_cli(tiny_tree, out, *args)  # a plain rerun converts the video the retry left pending
    assert r.returncode == 0, r.stderr
    assert _report(out) == {} and _manifest(out)["status_counts"] == {"ok": 4}


def test_a_repair_with_retry_failed_reads_each_shards_records_once(tiny_tree, tmp_path, monkeypatch):
    """Missing shards, --retry-failed and the space estimate all ask for the records: one read per shard."""
    from convert.job import rerun
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    out = str(tmp_path / "out")
    opts = JobOptions(workers=2, shards=3, progress=False)
    run_job(tiny_tree, out, ConvertConfig(), opts)
    shutil.rmtree(os.path.join(out, "shards", "shard-00001"))
    reads: list[int] = []
    real = rerun.shard_records

    def counted(out_: str, plan, index: int):
        reads.append(index)
        return real(out_, plan, index)

    monkeypatch.setattr(rerun, "shard_records", counted)
    said: list[str] = []
    result = run_job(tiny_tree, out, ConvertConfig(), opts, retry_failed=True, say=said.append)
    assert sorted(reads) == [0, 1, 2]  # before the fix: 0, 0, 1, 1, 1, 2, 2
    assert result["missing_shards"] == ["shard-00001"] and result["retried"] == 0
    assert result["converted"]["videos"] == len(json.load(open(os.path.join(out, "plan.json")))["shards"][1]["items"])


def _convert_in(cwd: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m convert ARGS`` run from the folder ``cwd`` (this package still first on its path)."""
    from .conftest import ROOT

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "convert", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.parametrize("first_relative", [True, False], ids=["relative-then-absolute", "absolute-then-relative"])
def test_a_rerun_from_another_working_directory_finds_every_video(tiny_synthetic_tree, tmp_path, first_relative):
    """Issue 19, point 3: the plan held the videos' paths as the first run's working directory saw them, so a
    rerun from elsewhere (the same source by another path) was accepted and failed every video it converted
    ("No such file or directory"). The plan now holds absolute paths; a source elsewhere is refused."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    os.symlink(tiny_synthetic_tree, here / "src")
    os.symlink(tiny_synthetic_tree, there / "data")
    out = str(tmp_path / "out")
    args = ("--workers", "2", "--shards", "2", "--no-progress")
    first = ("src", str(here)) if first_relative else (str(here / "src"), str(there))
    again = (str(here / "src"), str(there)) if first_relative else ("src", str(here))
    r = _convert_in(first[1], first[0], out, *args)
    assert r.returncode == 0, r.stderr
    plan = json.loads(open(os.path.join(out, "plan.json")).read())
    assert all(os.path.isabs(path) for s in plan["shards"] for _, path, _ in s["items"])
    before = _manifest(out)
    shutil.rmtree(os.path.join(out, "shards", "shard-00001"))
    r = _convert_in(again[1], again[0], out, *args)
    assert r.returncode == 0, r.stderr
    assert _manifest(out) == before and before["status_counts"] == {"ok": 4}
    # The same tree by another name (a symlink to it) is the same source; another tree is not.
    os.remove(os.path.join(out, "manifest.json"))
    assert _convert_in(str(there), "data", out, *args).returncode == 0
    other = tmp_path / "other"
    shutil.copytree(tiny_synthetic_tree, other, symlinks=True)
    r = _convert_in(str(tmp_path), "other", out, *args)
    assert r.returncode == 2 and r.stderr == (f"convert: error: {out}: was converted from SRC {here / 'src'}, not "
                                              f"{other}; run it with the same source, or use another OUT\n")
