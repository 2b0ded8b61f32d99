"""The video codecs write the same bytes on every run (issue 25): their encoders run one thread with fixed
settings, so a conversion run again, or resumed after kill -9 (tests/test_convert_restart.py, lmdb-h264), equals
the first byte for byte, and a clip encoded in any process, with any number of cores, gives one payload."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from convert.job.run import JobOptions, run_job
from convert.worker.plan import ConvertConfig

from .conftest import ROOT
from .test_convert_restart import _shard_content

CODECS = ("h264", "vp9")


@pytest.fixture(scope="module")
def video_src(tmp_path_factory) -> str:
    from convert.synth import make_dataset

    root = str(tmp_path_factory.mktemp("video_src"))
    make_dataset(root, per_class=1, seconds=2.0, seed=5, classes=("spin", "move_up", "move_left"))
    return root


def _files(out: str) -> dict[str, str]:
    """SHA-256 of every file of every shard, by path (TFRecord files are FORMAT.md's bytes throughout)."""
    got = {}
    for folder, _, names in os.walk(os.path.join(out, "shards")):
        for name in names:
            with open(os.path.join(folder, name), "rb") as fh:
                got[os.path.relpath(os.path.join(folder, name), out)] = hashlib.sha256(fh.read()).hexdigest()
    return got


def _shard_sums(out: str) -> list[tuple[str, str, int]]:
    with open(os.path.join(out, "manifest.json")) as fh:
        return [(s["name"], s["sha256"], s["value_bytes"]) for s in json.load(fh)["shards"]]


@pytest.mark.parametrize("codec", CODECS)
def test_a_conversion_run_twice_writes_the_same_bytes(video_src, tmp_path, codec):
    runs = []
    for k, backend in enumerate(("tfrecord", "tfrecord", "lmdb", "lmdb")):
        out = str(tmp_path / f"run{k}")
        run_job(video_src, out, ConvertConfig(codec=codec, backend=backend), JobOptions(workers=2, shards=2,
                                                                                         progress=False))
        runs.append(out)
    assert _files(runs[0]) == _files(runs[1]) and len(_files(runs[0])) >= 4
    assert _shard_content(runs[2]) == _shard_content(runs[3])  # every LMDB key and value
    assert _shard_sums(runs[0]) == _shard_sums(runs[1]) == _shard_sums(runs[2]) == _shard_sums(runs[3])
    assert sum(s[2] for s in _shard_sums(runs[0])) > 0


_ENCODE = """
import hashlib, os, sys
import numpy as np
from convert.format.codecs import get_codec
if sys.argv[2] == "one-core":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
y, x = np.mgrid[0:63, 0:95]
video = np.stack([np.stack([(x * 3 + t * 5) % 256, (y * 4 + t * 2) % 256, (x + y + t * 7) % 256], -1)
                  for t in range(48)]).astype(np.uint8)
digest = hashlib.sha256(bytes(get_codec(sys.argv[1]).encode(video[:16])))
with get_codec(sys.argv[1]).encoder() as encoder:  # a video's clips through one encoder, as a conversion codes them
    for k in range(0, 48, 16):
        digest.update(bytes(encoder.encode(video[k:k + 16])))
print(digest.hexdigest())
"""


@pytest.mark.parametrize("codec", CODECS)
def test_a_clip_and_a_video_encode_to_the_same_payloads_in_any_process_on_any_number_of_cores(codec):
    digests = [subprocess.run([sys.executable, "-c", _ENCODE, codec, cores], cwd=ROOT, capture_output=True,
                              text=True, timeout=120, check=True).stdout.strip()
               for cores in ("all", "one-core", "all")]
    assert len(set(digests)) == 1 and len(digests[0]) == 64, digests
