"""A conversion's content fingerprint, and ``inspect --against`` an annotation list (a lab comparing its copy of
Kinetics with another's, and with the list it was meant to hold)."""

from __future__ import annotations

import json
import os
import shutil
import zlib

import pytest

from convert.format import get_backend, read_manifest
from convert.format.base import read_back_summary
from convert.format.layout import file_sha256
from convert.format.manifest import CONTENT_KEY, LEGACY_CONTENT_KEY, DataSpec, content_fingerprint
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
    assert len(read_manifest(b).shards) == 3 and all(CONTENT_KEY in s.extras for s in read_manifest(b).shards)
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
    good = manifest["shards"][1][CONTENT_KEY]
    manifest["shards"][1][CONTENT_KEY] = "f" * 512
    json.dump(manifest, open(path, "w"))
    problems = verify(out)[0]
    name = manifest["shards"][1]["name"]
    assert (f"{name}: content sum {good[:16]}... differs from manifest {'f' * 16}...: its clips are not the bytes "
            f"the conversion wrote") in problems
    manifest["shards"][1][CONTENT_KEY] = "0" * 16
    json.dump(manifest, open(path, "w"))
    assert verify(out)[0] == [f"{path}: shards[1]: content_sum \"{'0' * 16}\" is not 512 lowercase hex digits"]


def test_a_conversion_written_before_the_payloads_counted_keeps_its_fingerprint(tiny_synthetic_tree, tmp_path):
    """A manifest of an earlier release (64-digit sums of clip headers under ``content``): verify follows its
    fingerprint from those sums and recomputes none of them, so an old conversion is never reported damaged."""
    out = _convert(tiny_synthetic_tree, str(tmp_path / "a"), workers=1, shards=2)
    path = os.path.join(out, "manifest.json")
    manifest = json.load(open(path))
    sums = [f"{k + 1:064x}" for k in range(len(manifest["shards"]))]
    for shard, legacy in zip(manifest["shards"], sums):
        del shard[CONTENT_KEY]
        shard[LEGACY_CONTENT_KEY] = legacy
    manifest["fingerprint"] = content_fingerprint(DataSpec.from_dict(manifest, path), sums, bits=256)
    json.dump(manifest, open(path, "w"))
    assert verify(out)[0] == []
    manifest["shards"][0][LEGACY_CONTENT_KEY] = "f" * 64
    json.dump(manifest, open(path, "w"))
    assert verify(out)[0] == [f"manifest: fingerprint {manifest['fingerprint'][:16]}... does not follow from its "
                              f"shards' content sums"]


def _crc_filler(data: bytes, crc: int) -> bytes:
    """The 4 bytes that, after ``data``, make the CRC-32 ``crc``: a CRC is affine in its input over GF(2), so
    the 32 filler bits solve 32 linear equations (Gaussian elimination on each bit's effect)."""
    state = zlib.crc32(data)
    base = zlib.crc32(bytes(4), state)
    basis: dict[int, tuple[int, int]] = {}  # pivot bit -> (effect on the CRC, filler bits that make it)
    for bit in range(32):
        effect, filler = zlib.crc32((1 << bit).to_bytes(4, "little"), state) ^ base, 1 << bit
        for pivot in sorted(basis, reverse=True):
            if effect >> pivot & 1:
                effect, filler = effect ^ basis[pivot][0], filler ^ basis[pivot][1]
        if effect:
            basis[effect.bit_length() - 1] = (effect, filler)
    want, filler = crc ^ base, 0
    for pivot in sorted(basis, reverse=True):
        if want >> pivot & 1:
            want, filler = want ^ basis[pivot][0], filler ^ basis[pivot][1]
    if want:
        raise ValueError("no filler makes that CRC-32")
    return filler.to_bytes(4, "little")


def test_a_forged_clip_with_the_same_crc_changes_the_fingerprint_and_verify_names_its_shard(
        tiny_synthetic_tree, tmp_path):
    """One video's clip replaced by another video's pictures, 4 filler bytes keeping its CRC-32, and the file
    checksums in the manifest recomputed as a forger would: every CRC-32 and the shard checksum still hold,
    but the content sum and so the fingerprint change, and verify says so in one line naming the shard."""
    out = _convert(tiny_synthetic_tree, str(tmp_path / "a"), workers=1, shards=1)
    manifest = read_manifest(out)
    shard = manifest.shard_path(out, 0)
    reader = get_backend("lmdb").reader(shard)
    try:
        clips = [(bytes(h), head, bytes(p)) for h, head, p in reader.iter_clips()]
    finally:
        reader.close()
    (_, victim, real), (_, _, other) = next(
        (a, b) for a in clips for b in clips if a[1].video_id != b[1].video_id and len(a[2]) == len(b[2]))
    forged = other[:-4] + _crc_filler(other[:-4], victim.crc32)
    assert zlib.crc32(forged) == victim.crc32 and len(forged) == len(real) and forged != real
    data_path = os.path.join(shard, "data.mdb")
    data = open(data_path, "rb").read()
    assert data.count(real) == 1
    open(data_path, "wb").write(data.replace(real, forged))
    path = os.path.join(out, "manifest.json")
    raw = json.load(open(path))
    files = raw["shard_files"][manifest.shards[0].name]
    raw["shard_files"][manifest.shards[0].name] = [
        {**f, "sha256": file_sha256(os.path.join(shard, f["name"]))} for f in files]
    json.dump(raw, open(path, "w"))

    reader = get_backend("lmdb").reader(shard)
    try:
        summary = read_back_summary(reader)
    finally:
        reader.close()
    recorded = manifest.shards[0].extras[CONTENT_KEY]
    assert summary["sha256"] == manifest.shards[0].sha256  # the headers, CRC-32s included, are as written
    assert summary[CONTENT_KEY] != recorded
    assert content_fingerprint(manifest.data, [summary[CONTENT_KEY]]) != manifest.fingerprint
    assert verify(out)[0] == [f"{manifest.shards[0].name}: content sum {summary[CONTENT_KEY][:16]}... differs from "
                              f"manifest {recorded[:16]}...: its clips are not the bytes the conversion wrote"]
    # A forger who rewrites the manifest's content sum and fingerprint too: the copy verifies on its own, and only
    # a fingerprint from elsewhere (--fingerprint, the trusted copy's) tells it apart, in one line.
    trusted = manifest.fingerprint
    assert trusted is not None
    raw = json.load(open(path))
    raw["shards"][0][CONTENT_KEY] = summary[CONTENT_KEY]
    raw["fingerprint"] = content_fingerprint(manifest.data, [summary[CONTENT_KEY]])
    json.dump(raw, open(path, "w"))
    assert verify(out)[0] == []
    assert verify(out, fingerprint=trusted)[0] == [
        f"manifest: fingerprint {raw['fingerprint'][:16]}... is not the expected {trusted[:16]}...: its clips, labels "
        f"or data settings differ from the copy that fingerprint came from"]
    assert verify(out, fingerprint=raw["fingerprint"])[0] == []


def test_verify_fingerprint_on_the_command_line(tiny_synthetic_tree, tmp_path, capsys):
    """--fingerprint HEX (either case): status 0 and said when it is this conversion's, 1 and one line when not;
    not 64 hex digits is a usage error; a conversion whose sums predate the payloads' cannot vouch for them."""
    out = _convert(tiny_synthetic_tree, str(tmp_path / "a"), workers=1, shards=1)
    fingerprint = read_manifest(out).fingerprint
    assert fingerprint is not None
    capsys.readouterr()
    assert tools_main(["verify", out, "--fingerprint", fingerprint.upper()]) == 0
    assert "the fingerprint expected" in capsys.readouterr().out
    assert tools_main(["verify", out, "--fingerprint", "0" * 64]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "is not the expected 0000000000000000..." in err[0], err
    with pytest.raises(SystemExit) as exit_:
        tools_main(["verify", out, "--fingerprint", "abc"])
    assert exit_.value.code == 2 and "a fingerprint is 64 hex digits" in capsys.readouterr().err
    path = os.path.join(out, "manifest.json")
    manifest = json.load(open(path))
    manifest["shards"][0][LEGACY_CONTENT_KEY] = manifest["shards"][0].pop(CONTENT_KEY)[:64]
    manifest["fingerprint"] = content_fingerprint(DataSpec.from_dict(manifest, path),
                                                  [manifest["shards"][0][LEGACY_CONTENT_KEY]], bits=256)
    json.dump(manifest, open(path, "w"))
    assert verify(out)[0] == []
    (line,) = verify(out, fingerprint=manifest["fingerprint"])[0]
    assert "predate the ones over every stored byte" in line, line


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
