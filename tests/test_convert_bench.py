"""``python -m benchmarks.conversion``: its rows measure the same frames, and the whole command runs to its tables."""

from __future__ import annotations

import json
import os
import re

import pytest

import benchmarks.conversion as bench


def test_every_conversion_row_stores_exactly_the_frames_decode_only_counts(videos, tmp_path):
    tree = str(tmp_path / "videos")
    paths = bench.build_tree(tree, videos.root, 3)
    frames, _, _ = bench._parallel(bench._pyav_decode, paths, 2)
    assert frames > 0
    for backend, codec in bench.CONVERSIONS.values():
        stored, seconds, cpu = bench._convert(tree, str(tmp_path / f"{backend}-{codec}"), 2, backend, codec)
        assert stored == frames and seconds > 0 and cpu > 0, (backend, codec)


def test_main_prints_every_row_and_the_start_up_table(videos, tmp_path, capsys):
    assert bench.main(["--shared", videos.root, "--videos", "2", "--rounds", "1", "--workers", "2",
                       "--tmp", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = {m.group(1).strip(): float(m.group(2)) for m in re.finditer(r"^\| ([^|]+?) +\| +([\d.]+) \|", out, re.M)}
    for name in [bench.BASE, *bench.CONVERSIONS]:
        assert rows[name] > 0, name
    assert re.search(r"^\| +1 \|", out, re.M) and re.search(r"^\| +2 \|", out, re.M)  # start-up: 1 and 2 videos


def test_the_scale_benchmark_measures_every_stage_at_every_size(tmp_path, capsys):
    from benchmarks.scale import STAGES
    from benchmarks.scale import main as scale_main

    # The smaller size converted by ``python -m convert``, the larger synthesised by the shard writers.
    assert scale_main(["--sizes", "12,24", "--classes", "4", "--missing", "0.25", "--workers", "1",
                       "--synthesise-from", "24", "--shard-starts", "0", "--work", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["videos"] for r in rows] == [12, 24]
    assert [r["conversion"] for r in rows] == ["converted", "synthesised"]
    assert [r["clips"] for r in rows] == [9, 18]  # a quarter of the annotated videos have no file
    assert [r["remote_clips"] for r in rows] == [9, 18]  # the same conversion, opened as a file:// URL
    # ... from the shards' index files alone: no shard's data downloaded at open
    assert all(r["remote_downloaded_mb"] == 0 and r["remote_index_mb"] > 0 for r in rows)
    assert all(r[k] >= 0 for r in rows for k in STAGES)  # a tiny run may grow no RSS measurably
    assert all(r["convert_s"] > 0 and r["plan.json_kb"] > 0 for r in rows)
    assert all(r["trainer_start_s"] > 0 and r["checkpoint_kb"] > 0 and r["checkpoint_load_s"] > 0 for r in rows)
    assert "growth from N=12 to N=24" in out and "| videos |" in out
    assert "Kinetics-400 (240,000 videos): conversion" in out and "Kinetics-700 (650,000 videos)" in out
    assert not os.path.exists(tmp_path / "w" / "out_12")  # each size's conversion removed unless --keep


def test_the_scale_benchmark_starts_real_shard_processes_both_ways(tmp_path, capsys):
    from benchmarks.scale import main as scale_main

    assert scale_main(["--only-shard-starts", "--sizes", "1000,3000", "--classes", "3", "--shard-starts", "1",
                       "--work", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in out.splitlines()
            if re.match(r"^\| \d", line)]
    ways = ["whole plan.json parsed", "own shard sent"]
    assert [(r[0], r[1], r[4], r[5]) for r in rows] == [
        (n, shards, way, limit) for n, shards in (("1000", "1"), ("3000", "3")) for way in ways
        for limit in ("256M", "none")]
    assert all(r[6] == "1/1" and float(r[7]) > 0 and float(r[8]) > 0 and r[10] == "" for r in rows)
    assert rows[0][3] == rows[4][3]  # a shard's plan (its first line) as long in a plan 3 times as large
    assert not os.path.exists(tmp_path / "w" / "starts_1000")  # removed unless --keep


def test_the_forkserver_benchmark_pairs_both_ways_on_the_same_conversion(tmp_path, capsys):
    from benchmarks.forkserver import main as forkserver_main

    # It exits with a message where the two ways wrote different conversions (content fingerprints).
    assert forkserver_main(["--videos", "4", "--rounds", "2", "--work", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    runs = re.findall(r"^\| (\d) \| (fork server|plain) \|", out, re.M)
    assert runs == [("1", "fork server"), ("1", "plain"), ("2", "plain"), ("2", "fork server")]
    for what in ("wall", "CPU"):
        assert re.search(rf"^{what}: fork server / plain [\d.]+; saving [-+][\d.]+ s a job", out, re.M), out
    assert not os.path.exists(tmp_path / "w" / "out")


def test_the_codecs_benchmark_prints_every_codec_in_every_table(videos, tmp_path, capsys):
    import benchmarks.codecs as codecs_bench

    # One clip of each of two videos; one round: the tables' rows and their order, not their figures.
    assert codecs_bench.main(["--shared", videos.root, "--videos", "mmaction2__part_0.mp4,mmcv__test.mp4",
                              "--max-clips", "1", "--rounds", "1", "--tmp", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 clips of 16x128x171" in out
    labels = [codecs_bench.row_label(codecs_bench.get_codec(n, q)) for n, q in codecs_bench.PROJECT_ROWS]
    labels += [codecs_bench.row_label(cls(q)) for cls, q in codecs_bench.OTHER_ROWS]
    default = codecs_bench.get_codec("h264").quality
    assert f"h264 CRF {default} (default)" in labels and "jpeg q90" in labels
    # Each row in the three tables (bytes and PSNR, decoding, the projection); the video codecs' defaults in the
    # fourth too (one encoder per video against one per clip).
    encoded = {codecs_bench.row_label(codecs_bench.get_codec(n)) for n in ("h264", "vp9")}
    assert "one encoder per video" in out and encoded <= set(labels)
    for label in labels:
        lines = [line for line in out.splitlines() if line.startswith(f"| {label} ")]
        assert len(lines) == (4 if label in encoded else 3), (label, lines)
    raw = next(line for line in out.splitlines() if line.startswith("| raw "))
    assert "lossless" in raw
    h264 = next(line for line in out.splitlines() if line.startswith(f"| h264 CRF {default} (default) "))
    assert 30 < float(h264.split("|")[5]) < 60  # a PSNR in dB, against the raw clip
