"""``python -m benchmarks.conversion``: its rows measure the same frames, and the whole command runs to its tables."""

from __future__ import annotations

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
