"""A conversion's content fingerprint, and ``inspect --against`` an annotation list (a lab comparing its copy of
Kinetics with another's, and with the list it was meant to hold)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from convert.format import read_manifest
from convert.job.run import JobOptions, run_job
from convert.store.verify import verify
from convert.tools import main as tools_main
from convert.worker.plan import ConvertConfig

from .train_fixtures import tiny_data  # noqa: F401
from .videos import VideoSet

SIZE = (32, 40)


def _convert(src: str, out: str, *, workers: int, shards: int, backend: str = "lmdb", size=SIZE) -> str:
    run_job(src, out, ConvertConfig(size=size, backend=backend, max_clips=2),
            JobOptions(workers=workers, shards=shards, progress=False))
    return out


def test_the_fingerprint_depends_on_the_clips_only(tiny_synthetic_tree, tmp_path, capsys):
    """The same videos from two folders, on another backend, shard count and worker count: one fingerprint;
    a video fewer or another frame size: another one."""
    moved = str(tmp_path / "elsewhere" / "copy")
    shutil.copytree(tiny_synthetic_tree, moved, symlinks=True)
    a = _convert(tiny_synthetic_tree, str(tmp_path / "a"), workers=1, shards=1)
    b = _convert(moved, str(tmp_path / "b"), workers=2, shards=3, backend="tfrecord")
    fa, fb = read_manifest(a).fingerprint, read_manifest(b).fingerprint
    assert fa is not None and len(fa) == 64 and fa == fb
    assert len(read_manifest(b).shards) == 3 and all("content" in s.extras for s in read_manifest(b).shards)
    assert verify(a)[0] == [] and verify(b)[0] == []
    capsys.readouterr()
    assert tools_main(["inspect", a]) == 0
    assert f"content fingerprint: {fa}" in capsys.readouterr().out

    os.remove(os.path.join(moved, sorted(os.listdir(moved))[0], sorted(os.listdir(os.path.join(
        moved, sorted(os.listdir(moved))[0])))[0]))
    fewer = _convert(moved, str(tmp_path / "fewer"), workers=1, shards=1)
    other_size = _convert(tiny_synthetic_tree, str(tmp_path / "size"), workers=1, shards=1, size=(32, 48))
    assert len({fa, read_manifest(fewer).fingerprint, read_manifest(other_size).fingerprint}) == 3


def test_verify_says_when_a_fingerprint_or_a_content_sum_does_not_fit(tiny_synthetic_tree, tmp_path):
    out = _convert(tiny_synthetic_tree, str(tmp_path / "a"), workers=1, shards=2)
    path = os.path.join(out, "manifest.json")
    manifest = json.load(open(path))
    manifest["fingerprint"] = "0" * 64
    json.dump(manifest, open(path, "w"))
    assert verify(out)[0] == [f"manifest: fingerprint {'0' * 16}... does not follow from its shards' content sums"]
    manifest = json.load(open(path))
    good = manifest["shards"][1]["content"]
    manifest["shards"][1]["content"] = "f" * 64
    json.dump(manifest, open(path, "w"))
    problems = verify(out)[0]
    name = manifest["shards"][1]["name"]
    assert f"{name}: content sum {good[:16]}... differs from manifest {'f' * 16}..." in problems
    manifest["shards"][1]["content"] = "not hex"
    json.dump(manifest, open(path, "w"))
    assert verify(out)[0] == [f"{path}: shards[1]: content \"not hex\" is not 64 lowercase hex digits"]


CSV_HEAD = "label,youtube_id,time_start,time_end,split\n"


@pytest.fixture()
def kinetics(stand_in_videos, tmp_path):
    """A Kinetics-style copy: videos named by the CSV, one annotated video absent, one undecodable, one too
    short for a clip, and one video the CSV of the 'val' split names."""
    videos = VideoSet("synthetic", stand_in_videos)
    root = tmp_path / "videos"
    root.mkdir()
    rows = []
    for k, (label, name) in enumerate([("jump", "mmaction2__part_0.mp4"), ("jump", "mmcv__test.mp4"),
                                       ("run", "mmaction2__demo.mp4"), ("run", "decord__video_90.mov")]):
        yid = f"vid{k:08d}"
        shutil.copyfile(videos.path(name), root / f"{yid}_000000_000010{os.path.splitext(name)[1]}")
        rows.append(f"{label},{yid},0,10,train\n")
    (root / "vidbroken_000000_000010.mp4").write_bytes(b"not a video at all" * 100)
    rows.append("run,vidbroken,0,10,train\n")
    rows.append("jump,vidabsent,0,10,train\n")  # no file: missing
    rows.append("swim,vidabsent2,0,10,train\n")  # a class whose every video is missing
    rows.append("jump,vidval,0,10,val\n")  # another split
    csv = tmp_path / "k400.csv"
    csv.write_text(CSV_HEAD + "".join(rows))
    out = str(tmp_path / "out")
    run_job(str(csv), out, ConvertConfig(size=SIZE, max_clips=2), JobOptions(workers=1, shards=1, progress=False),
            videos=str(root), split="train")
    return out, str(csv)


def test_inspect_against_the_annotation_list_counts_every_class(kinetics, capsys):
    out, csv = kinetics
    capsys.readouterr()
    assert tools_main(["inspect", out, "--against", csv, "--split", "train", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["against"]
    assert got["classes"] == {
        "jump": {"annotated": 3, "converted": 2, "missing": 1, "failed": 0, "short": 0},
        "run": {"annotated": 3, "converted": 1, "missing": 0, "failed": 1, "short": 1},
        "swim": {"annotated": 1, "converted": 0, "missing": 1, "failed": 0, "short": 0},
    }
    assert got["totals"] == {"annotated": 7, "converted": 3, "missing": 2, "failed": 1, "short": 1}
    assert got["not_annotated"] == 0
    # Without --split every row counts: the val row's video is not in this conversion.
    assert tools_main(["inspect", out, "--against", csv]) == 0
    text = capsys.readouterr().out
    assert f"against {csv}:" in text and "(all classes)" in text
    table = text[text.index(f"against {csv}:"):]
    assert [line.split() for line in table.splitlines() if line.strip().endswith("jump")] == \
        [["4", "2", "2", "0", "0", "jump"]]


def test_inspect_against_refuses_what_is_no_annotation_list_in_one_line(kinetics, tmp_path, capsys):
    out, _ = kinetics
    bad = tmp_path / "list.csv"
    bad.write_text("name,label\nx,y\n")
    capsys.readouterr()
    assert tools_main(["inspect", out, "--against", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == (f"inspect: error: {bad}: CSV lacks column(s) youtube_id, time_start, time_end; needs "
                   f"label,youtube_id,time_start,time_end[,split][,is_cc], has name,label\n")
    with pytest.raises(SystemExit):
        tools_main(["inspect", out, "--split", "train"])
    assert "--split compares with an annotation list: give --against CSV" in capsys.readouterr().err


def test_the_trainer_logs_the_fingerprint_and_keeps_it_in_its_checkpoints(tiny_data, tmp_path, capsys):
    from train import checkpoint as ckpt_io
    from train.main import run_argv

    from .train_fixtures import common

    fingerprint = read_manifest(tiny_data).fingerprint
    assert fingerprint is not None
    run_argv(common(tiny_data, tmp_path / "run") + ["--epochs", "1", "--max-steps", "1", "--batch-size", "8"])
    assert f"data {tiny_data}: content fingerprint {fingerprint}" in capsys.readouterr().out
    assert ckpt_io.load(ckpt_io.latest_path(str(tmp_path / "run")))["data_fingerprint"] == fingerprint
