"""Readers and a writer written from FORMAT.md alone (they use no project code) must agree with ours.

``spec_read`` follows FORMAT.md version 2 for both backends; a version 1
conversion (retired before the first release) is refused in one line.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import subprocess
import sys
import zlib

import crc32c
import lmdb
import lz4.block
import numpy as np
import pytest
from PIL import Image
from tfrecord import example_pb2

from convert.format import WRITE_CODECS  # tests run over every codec, and every backend FORMAT.md specifies

from .backend_params import SPECIFIED
from .conftest import ROOT


def _video_to_array(codec_id: int, payload: bytes, shape: tuple[int, int, int, int]) -> np.ndarray:
    # FORMAT.md, *Video payloads*: FFmpeg's own demuxers (a raw .h264 file, an IVF file) and decoders, every
    # picture converted by libswscale as the section says, cropped to H x W; exactly T pictures.
    import av
    from av.video.reformatter import Interpolation

    t, h, w, c = shape
    flags = Interpolation.BILINEAR | Interpolation.ACCURATE_RND | Interpolation.FULL_CHR_H_INT
    frames = []
    with av.open(io.BytesIO(payload), format={4: "h264", 5: "ivf"}[codec_id]) as container:
        for picture in container.decode(video=0):
            assert (picture.height, picture.width) == (h + h % 2, w + w % 2)
            yuv = av.VideoFrame.from_ndarray(picture.to_ndarray(), format="yuv420p")  # yuvj420p relabelled
            rgb = yuv.reformat(format="rgb24", src_colorspace="ITU601", src_color_range="JPEG",
                               interpolation=flags).to_ndarray()
            frames.append(rgb[:h, :w])
    assert len(frames) == t
    return np.stack(frames)


def _payload_to_array(codec_id: int, payload: bytes, shape: tuple[int, int, int, int]) -> np.ndarray:
    t, h, w, c = shape
    if codec_id == 0:
        return np.frombuffer(payload, np.uint8).reshape(shape)
    if codec_id in (4, 5):
        return _video_to_array(codec_id, payload, shape)
    (n,) = struct.unpack_from("<I", payload, 0)
    sizes = struct.unpack_from(f"<{n}I", payload, 4)
    pos, frames = 4 + 4 * n, []
    for size in sizes:
        part = payload[pos:pos + size]
        if codec_id == 3:
            frames.append(np.frombuffer(lz4.block.decompress(part, uncompressed_size=h * w * c), np.uint8)
                          .reshape(h, w, c))
        else:
            frames.append(np.asarray(Image.open(io.BytesIO(part)).convert("RGB")))
        pos += size
    assert pos == len(payload)
    return np.stack(frames)


def _parse_value(header: bytes, payload: bytes) -> tuple[str, int, int, np.ndarray]:
    (magic, version, codec, c, _, t, h, w, n, label, index, start, crc, plen) = struct.unpack_from(
        "<4sBBBBHHHHiIIII", header, 0)
    assert magic == b"VCLP" and version == 2 and len(header) == 36 + n and len(payload) == plen
    assert zlib.crc32(payload) == crc
    return header[36:].decode(), index, label, _payload_to_array(codec, payload, (t, h, w, c))


def _masked(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _lmdb_shard(path: str) -> tuple[dict, list[dict], dict[tuple[str, int], tuple[bytes, bytes]]]:
    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin() as txn:
        entries = {bytes(k): bytes(v) for k, v in txn.cursor()}
    env.close()
    meta = json.loads(entries[b"m/shard"])
    records = [json.loads(v) for k, v in sorted(entries.items()) if k.startswith(b"m/done/")]
    clips = {}
    for key, value in entries.items():
        if key.startswith(b"c/"):
            vid, _, idx = key[2:].rpartition(b"/")
            n = struct.unpack_from("<H", value, 14)[0]
            clips[(vid.decode(), int(idx))] = (value[:36 + n], value[36 + n:])
    return meta, records, clips


def _tfrecord_shard(path: str, files: list[dict]) -> tuple[dict, list[dict], dict[tuple[str, int], tuple]]:
    meta = json.load(open(os.path.join(path, "shard.json")))
    parts = sorted((f for f in os.listdir(path) if f.startswith("part-") and f.endswith(".json")),
                   key=lambda f: int(f[len("part-"):-len(".json")]))  # by number: FORMAT.md
    by_id, clips = {}, {}
    listed = []
    for name in parts:
        part = json.load(open(os.path.join(path, name)))
        for rec in part["videos"]:
            by_id[rec["video_id"]] = rec
        if not part["records"]:
            continue
        data = open(os.path.join(path, f"part-{part['part']:05d}.tfrecord"), "rb").read()
        index = [tuple(map(int, line.split())) for line in open(os.path.join(path, f"part-{part['part']:05d}.idx"))]
        listed.append({"path": f"part-{part['part']:05d}.tfrecord", "index": f"part-{part['part']:05d}.idx",
                       "records": part["records"], "bytes": len(data)})
        assert len(data) == part["bytes"] and len(index) == part["records"]
        owners = [(rec["video_id"], c) for rec in part["videos"] for c in range(rec["clips"])]
        pos = 0
        for k, (offset, length) in enumerate(index):
            assert offset == pos
            (n,) = struct.unpack_from("<Q", data, pos)
            assert struct.unpack_from("<I", data, pos + 8)[0] == _masked(data[pos:pos + 8])
            body = data[pos + 12:pos + 12 + n]
            assert struct.unpack_from("<I", data, pos + 12 + n)[0] == _masked(body) and length == 16 + n
            feat = example_pb2.Example.FromString(body).features.feature
            header, payload = feat["header"].bytes_list.value[0], feat["payload"].bytes_list.value[0]
            vid, c = owners[k]
            assert feat["video_id"].bytes_list.value[0].decode() == vid and feat["clip_index"].int64_list.value == [c]
            # part_offsets/part_sizes point at each frame's JPEG / LZ4 block inside the payload
            offs, sizes = list(feat["part_offsets"].int64_list.value), list(feat["part_sizes"].int64_list.value)
            assert offs[-1] + sizes[-1] == len(payload) and len(offs) in (1, list(feat["shape"].int64_list.value)[0])
            clips[(vid, c)] = (header, payload)
            pos += length
        assert pos == len(data)
    assert listed == files
    records = [by_id[k] for k in sorted(by_id, key=lambda v: v.encode())]
    return meta, records, clips


def spec_read(out: str) -> tuple[list[str], list[tuple[str, int, int, np.ndarray]]]:
    """Everything per FORMAT.md version 3 (and 2): manifest, the shards' files, shard metadata, records, values,
    payloads, checksum."""
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    if manifest["format"] != "videoclips" or manifest["format_version"] not in (2, 3):
        raise ValueError("not a videoclips v2 or v3 conversion")
    clips = []
    total = 0  # the content fingerprint's sum over videos (FORMAT.md, *Content fingerprint*)
    for k, shard in enumerate(manifest["shards"]):
        path = os.path.join(out, shard["path"])
        if manifest["format_version"] >= 3:  # every file of the shard, by name, with its size and SHA-256
            assert list(manifest["shard_files"]) == [s["name"] for s in manifest["shards"]]
            names = [f["name"] for f in manifest["shard_files"][shard["name"]]]
            assert names == sorted(names, key=str.encode) and len(set(names)) == len(names)
            for f in manifest["shard_files"][shard["name"]]:
                data = open(os.path.join(path, f["name"]), "rb").read()
                assert len(data) == f["bytes"] and hashlib.sha256(data).hexdigest() == f["sha256"], f["name"]
        if manifest["backend"] == "lmdb":
            meta, records, stored = _lmdb_shard(path)
        else:
            meta, records, stored = _tfrecord_shard(path, shard["files"])
        assert meta["index"] == k and meta["count"] <= len(manifest["shards"])
        for key in ("backend", "codec", "codec_id", "classes", "clip_shape", "frame_size", "fps", "clip",
                    "on_damage"):
            assert meta[key] == manifest[key], key
        assert meta.get("quality") == manifest.get("quality")
        h = hashlib.sha256()
        value_bytes = share = 0
        for rec in records:  # reading order: records by video id bytes, then clip index
            video = hashlib.sha256()
            for c in range(rec["clips"]):
                header, payload = stored[(rec["video_id"], c)]
                h.update(header)
                video.update(header + payload)
                value_bytes += len(header) + len(payload)
                vid, index, label, arr = _parse_value(header, payload)
                assert (vid, index, label) == (rec["video_id"], c, rec["label"])
                clips.append((vid, index, label, arr))
            if rec["clips"]:
                wide = hashlib.shake_256(video.digest()).digest(256)
                share = (share + int.from_bytes(wide, "big")) % 2**2048
        assert h.hexdigest() == shard["sha256"] and value_bytes == shard["value_bytes"]
        assert shard["content_sum"] == f"{share:0512x}"
        total = (total + share) % 2**2048
        assert sum(r["clips"] for r in records) == len(stored) == shard["clips"]
    settings = {k: manifest[k] for k in ("codec", "codec_id", "classes", "clip_shape", "frame_size", "fps", "clip",
                                         "quality") if k in manifest}
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert manifest["fingerprint"] == hashlib.sha256(text.encode() + total.to_bytes(256, "big")).hexdigest()
    return manifest["classes"], clips


@pytest.mark.parametrize("backend", SPECIFIED)  # not the test backends: FORMAT.md has no word of them
@pytest.mark.parametrize("codec", list(WRITE_CODECS))
def test_spec_reader_matches_open_clips(synth_videos, tmp_path, codec, backend):
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig
    from loaders import open_clips

    out = str(tmp_path / codec)
    run_job(synth_videos, out, ConvertConfig(codec=codec, backend=backend, max_clips=1),
            JobOptions(workers=2, progress=False))
    assert json.load(open(os.path.join(out, "manifest.json")))["format_version"] == 3
    classes, clips = spec_read(out)
    store = open_clips(out)
    assert classes == store.classes and len(clips) == len(store)
    # Reading order per FORMAT.md: shards in manifest order, then video id bytes, then clip index; from 0.
    for (vid, index, label, arr), i in zip(clips, range(len(store))):
        s = store[i]
        assert (vid, index, label) == (s.video_id, s.clip_index, s.label)
        assert np.array_equal(arr, s.clip)


@pytest.mark.parametrize("backend", SPECIFIED)  # not the test backends: FORMAT.md has no word of them
def test_a_version_2_conversion_is_still_read_and_verified(synth_videos, tmp_path, backend):
    """A version 2 manifest (no ``shard_files``) reads as its version 3 twin: the same clips, verify passes, and a
    URL's cache takes the shard's files from its folder's listing (what its backend declares)."""
    from convert.job.run import JobOptions, run_job
    from convert.store import CacheSettings, open_clips
    from convert.store.verify import verify
    from convert.worker.plan import ConvertConfig

    out = str(tmp_path / "v2")
    run_job(synth_videos, out, ConvertConfig(codec="lz4", backend=backend, max_clips=1),
            JobOptions(workers=2, progress=False))
    classes, expected = spec_read(out)  # the version 3 conversion, read from FORMAT.md alone
    path = os.path.join(out, "manifest.json")
    manifest = json.load(open(path))
    manifest["format_version"] = 2
    del manifest["shard_files"]
    json.dump(manifest, open(path, "w"))
    assert spec_read(out)[0] == classes
    assert verify(out)[0] == []
    for root, cache in ((out, None), (f"file://{out}", CacheSettings(cache_dir=str(tmp_path / "cache")))):
        store = open_clips(root, cache=cache)
        assert store.manifest.format_version == 2 and all(s.shard_files is None for s in store.manifest.shards)
        assert store.classes == classes
        got = [(s.video_id, s.clip_index, s.label, s.clip) for s in store]
        assert [g[:3] for g in got] == [e[:3] for e in expected]
        assert all(np.array_equal(g[3], e[3]) for g, e in zip(got, expected))
        store.close()


# -- version 1: retired before the first release -----------------------------
RECONVERT = "was written by an earlier release of this project; reconvert the videos with this one (python -m convert)"


def test_a_version_1_conversion_is_refused_in_one_line_saying_to_reconvert(tmp_path):
    from convert.format import FormatError
    from convert.format.layout import unpack_header
    from loaders import ClipDataset, open_clips

    out = tmp_path / "v1"
    (out / "shards").mkdir(parents=True)
    manifest = {"format": "videoclips", "format_version": 1, "backend": "lmdb", "codec": "raw", "classes": ["a"],
                "num_classes": 1, "shards": [], "totals": {"videos": 0, "clips": 0, "value_bytes": 0}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    expected = f"{out / 'manifest.json'}: format version 1 {RECONVERT}"
    for read in (lambda: open_clips(str(out)), lambda: ClipDataset(str(out), train=False, crop_size=16)):
        with pytest.raises(FormatError) as info:
            read()
        assert str(info.value) == expected
    got = subprocess.run([sys.executable, "-m", "convert", "verify", str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert got.returncode == 2 and got.stderr.strip().endswith(expected) and "\n" not in got.stderr.strip()
    # A value whose header says version 1 (inside a shard of this version: damage, or a copied value).
    vid = b"v"
    head = struct.pack("<4sBBBBHHHHiIIII", b"VCLP", 1, 0, 3, 0, 1, 1, 1, len(vid), 0, 0, 0, 0, 3) + vid
    with pytest.raises(FormatError, match=re.escape(f"clip format version 1 {RECONVERT}")):
        unpack_header(head + b"\0\0\0")
