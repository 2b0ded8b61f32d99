"""``python -m convert SRC URL`` as its user reads it: what each shard's line says on a rerun that finds the
shards already there, and the advice when the staging folder cannot take the job. On ``file://`` URLs: no
network."""

from __future__ import annotations

import json
import os
import re

import pytest

from convert.job.outdir import check_out, hold_out
from convert.store.upload import shard_note
from convert.worker.plan import ConvertConfig, PlanError

from .backend_params import with_test_backends
from .convert_helpers import run_cli

ARGS = ("--size", "32x40", "--max-clips", "1", "--workers", "2", "--shards", "3", "--no-progress")


def _shard_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if re.search(r"\bshard-\d{5} \(\d of 3\)", ln)]


@pytest.mark.parametrize("backend", with_test_backends("lmdb"))
def test_a_rerun_to_a_url_says_already_uploaded_for_the_shards_it_skipped(tiny_synthetic_tree, tmp_path, backend):
    bucket = tmp_path / "bucket"
    url, staging = f"file://{bucket}/out", str(tmp_path / "staging")
    args = (*ARGS, "--backend", backend)
    r = run_cli(tiny_synthetic_tree, url, "--staging", staging, *args)
    assert r.returncode == 0, r.stderr
    assert _shard_lines(r.stderr) == [f"convert: uploaded shard-0000{i} ({i + 1} of 3)" for i in range(3)]
    files = json.load(open(bucket / "out" / "manifest.json"))["shard_files"]
    count = len(files["shard-00000"])

    # Everything is there with the same content: nothing is sent, and the lines say so (before: "uploaded").
    r = run_cli(tiny_synthetic_tree, url, "--staging", staging, *args)
    assert r.returncode == 0, r.stderr
    assert _shard_lines(r.stderr) == [f"convert: already uploaded shard-0000{i} ({i + 1} of 3): its {count} file(s) "
                                      f"are there with the same content" for i in range(3)]
    assert re.search(r"^upload: 0 file\(s\) uploaded, \d+ already there with the same content, 0 object\(s\) "
                     r"removed$", r.stdout, re.M), r.stdout

    # One shard's object gone from the URL: that shard is uploaded again, the others are said to be there.
    bulk = max(files["shard-00001"], key=lambda f: f["bytes"])["name"]  # LMDB: data.mdb
    os.remove(bucket / "out" / "shards" / "shard-00001" / bulk)
    r = run_cli(tiny_synthetic_tree, url, "--staging", staging, *args)
    assert r.returncode == 0, r.stderr
    lines = _shard_lines(r.stderr)
    kept = f": 1 file(s); {count - 1} already there with the same content" if count > 1 else ""  # the shard's others
    assert lines[1] == "convert: uploaded shard-00001 (2 of 3)" + kept
    assert lines[0].startswith("convert: already uploaded shard-00000 (1 of 3)")
    assert lines[2].startswith("convert: already uploaded shard-00002 (3 of 3)")

    # Other settings into the same staging folder: the advice is another --staging folder (another OUT URL given
    # with this --staging would meet the same folder), and another --staging folder is indeed the fix.
    r = run_cli(tiny_synthetic_tree, url, "--staging", staging, *args[:-3], "--size", "32x48", *args[-3:])
    assert r.returncode == 2
    assert r.stderr == (f"convert: error: {staging}: was converted with other settings (size [32, 40] -> [32, 48]); "
                        f"use another --staging folder (this one stages {url}) or the same options\n")
    r = run_cli(tiny_synthetic_tree, url, "--staging", str(tmp_path / "staging2"), *args[:-3], "--size", "32x48",
                *args[-3:])
    assert r.returncode == 0, r.stderr


def test_a_staging_folder_held_or_holding_something_else_advises_another_staging_folder(tmp_path):
    staging, url = str(tmp_path / "staging"), "s3://bucket/out"
    with hold_out(staging):
        with pytest.raises(PlanError, match=r"another conversion is writing it \(.*\); wait for it to end, or use "
                                            r"another --staging folder \(this one stages s3://bucket/out\)$"):
            with hold_out(staging, staging_of=url):
                pass
        # A folder OUT keeps its advice.
        with pytest.raises(PlanError, match=r"; wait for it to end, or use another OUT$"):
            with hold_out(staging):
                pass
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(PlanError, match=r"other: not empty and holds no conversion; use an empty or new --staging "
                                        r"folder for s3://bucket/out$"):
        check_out(str(tmp_path / "other"), ConvertConfig(), staging_of=url)


def test_shard_note_says_what_was_sent_kept_and_removed():
    assert shard_note("shard-00002", 2, 4, sent=1, kept=0, removed=0) == "uploaded shard-00002 (3 of 4)"
    assert shard_note("shard-00002", 2, 4, sent=0, kept=3, removed=0) == (
        "already uploaded shard-00002 (3 of 4): its 3 file(s) are there with the same content")
    assert shard_note("shard-00002", 2, 4, sent=2, kept=1, removed=1) == (
        "uploaded shard-00002 (3 of 4): 2 file(s); 1 already there with the same content; removed 1 object(s) "
        "under it that are not its files")
