"""``python -m benchmarks.sampling``: the whole command runs to its tables on a few tiny synthetic videos."""

from __future__ import annotations

import argparse
import re

import pytest

import benchmarks.sampling as bench


def test_main_prints_the_rates_the_bytes_and_the_profile(tmp_path, capsys):
    # 16x1 and TSN both read the timeline's own clip settings: one conversion in all, so the run stays short.
    assert bench.main(["--synthetic", "--videos", "5", "--synth-seconds", "1", "--short-side", "48",
                       "--geometries", "16x1@32,tsn4@32", "--codecs", "jpeg", "--readers", "pyav",
                       "--seconds", "0.05", "--rounds", "1", "--batch-size", "2", "--threads", "1",
                       "--workers", "1", "--profile", "16x1@32", "--profile-samples", "2",
                       "--tmp", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = {m.group(1): m.group(2).split(" | ") for m in re.finditer(r"^\| ([^|]+?) \| (.+) \|$", out, re.M)}
    for geometry in ("16x1 @32", "TSN 4 segments @32"):
        jpeg, pyav, ratio = rows[geometry]
        assert float(jpeg) > 0 and float(pyav) > 0 and re.fullmatch(r"[\d.]+x \([\d.]+\)", ratio), geometry
    assert rows["one timeline (every geometry)"][0] == "--clip-len 16"
    assert "(1.00x the one)" in out  # both geometries' own conversions are the timeline's settings
    assert re.search(r"^- jpeg \(.+\): .+%", out, re.M) and re.search(r"^- pyav \(.+\): .+%", out, re.M)
    assert bench.parse_geometry("32x2a4@224").spec.alpha == 4
    with pytest.raises(argparse.ArgumentTypeError, match="alpha 3 must divide frames 32"):
        bench.parse_geometry("32x2a3@224")
