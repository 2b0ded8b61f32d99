"""``python -m convert SRC s3://...``: written locally, verified, uploaded, the manifest last; a rerun after kill -9
mid-upload uploads only what is missing, and the bucket's objects equal a clean run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from convert.store import open_clips

from .conftest import ROOT

ARGS = ["--backend", "tfrecord", "--codec", "raw", "--size", "32x40", "--max-clips", "2", "--shards", "6",
        "--workers", "2", "--no-progress"]


def _convert(src: str, url: str, staging: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "convert", src, url, "--staging", staging, *ARGS], env=env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _objects(fs, bucket: str) -> dict[str, bytes]:
    fs.invalidate_cache()
    out = {}
    for path in fs.find(f"{bucket}/out"):
        data = fs.cat_file(path)
        rel = path[len(f"{bucket}/out/"):]
        if rel == "manifest.json":
            d = json.loads(data)
            d.pop("created")  # the one field a rerun writes anew
            data = json.dumps(d, sort_keys=True).encode()
        out[rel] = data
    return out


def test_convert_to_s3_killed_mid_upload_equals_a_clean_run(s3_server, synth_videos, tmp_path):
    fs = s3_server.fs()
    clean, killed = s3_server.bucket(), s3_server.bucket()
    proc = _convert(synth_videos, f"s3://{clean}/out", str(tmp_path / "clean"))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    reference = _objects(fs, clean)
    assert "manifest.json" in reference and any(k.endswith(".tfrecord") for k in reference)
    store = open_clips(f"s3://{clean}/out")
    assert len(store) == json.loads(reference["manifest.json"])["totals"]["clips"]

    # The same job into another bucket, killed -9 as soon as its first shard object lands.
    url = f"s3://{killed}/out"
    staging = str(tmp_path / "killed")
    proc = _convert(synth_videos, url, staging)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        fs.invalidate_cache()
        if fs.exists(f"{killed}/out/shards"):
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the upload finished before the kill (make it larger)"
    partial = _objects(fs, killed)
    assert "manifest.json" not in partial  # the manifest is uploaded last
    proc = _convert(synth_videos, url, staging)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert _objects(fs, killed) == reference


def test_convert_to_an_unreachable_url_is_one_line(synth_videos, tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
           "AWS_MAX_ATTEMPTS": "1"}
    got = subprocess.run([sys.executable, "-m", "convert", synth_videos, "s3://nowhere/out", "--staging",
                          str(tmp_path / "s"), *ARGS], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert got.returncode == 1
    lines = got.stderr.strip().splitlines()
    assert lines[-1].startswith("convert: error: s3://nowhere/out") and "unreachable" in lines[-1], got.stderr
    # Found before converting (a write check), not after the whole job.
    assert len(lines) == 1 and lines[0].endswith("(nothing was converted)"), got.stderr
    assert not os.path.exists(str(tmp_path / "s" / "manifest.json"))


def test_convert_to_a_missing_bucket_is_one_line_before_converting(s3_server, synth_videos, tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    got = subprocess.run([sys.executable, "-m", "convert", synth_videos, "s3://no-such-bucket-here/out",
                          "--staging", str(tmp_path / "s"), *ARGS], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert got.returncode == 1 and got.stderr.count("\n") == 1, got.stderr
    assert "no such bucket" in got.stderr and "(nothing was converted)" in got.stderr, got.stderr
    assert not os.path.exists(str(tmp_path / "s" / "manifest.json"))
