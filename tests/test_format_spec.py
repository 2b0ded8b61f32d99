"""Readers and a writer written from FORMAT.md alone (they use no project code) must agree with ours.

``spec_read`` follows FORMAT.md version 2 for both backends; ``spec_write_v1``
follows version 1 to make a folder the project's readers must still read.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import zlib

import crc32c
import lmdb
import lz4.block
import numpy as np
import pytest
from PIL import Image
from tfrecord import example_pb2

from convert.format import BACKENDS, WRITE_CODECS  # tests run over every registered backend and codec


def _payload_to_array(codec_id: int, payload: bytes, shape: tuple[int, int, int, int]) -> np.ndarray:
    t, h, w, c = shape
    if codec_id == 0:
        return np.frombuffer(payload, np.uint8).reshape(shape)
    if codec_id == 1:
        return np.frombuffer(lz4.block.decompress(payload, uncompressed_size=t * h * w * c), np.uint8).reshape(shape)
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
    assert magic == b"VCLP" and version in (1, 2) and len(header) == 36 + n and len(payload) == plen
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
    """Everything per FORMAT.md version 2: manifest, shard metadata, records, values, payloads, checksum."""
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    if manifest["format"] != "videoclips" or manifest["format_version"] != 2:
        raise ValueError("not a videoclips v2 conversion")
    clips = []
    for k, shard in enumerate(manifest["shards"]):
        path = os.path.join(out, shard["path"])
        if manifest["backend"] == "lmdb":
            meta, records, stored = _lmdb_shard(path)
        else:
            meta, records, stored = _tfrecord_shard(path, shard["files"])
        assert meta["index"] == k and meta["count"] <= len(manifest["shards"])
        for key in ("backend", "codec", "codec_id", "classes", "clip_shape", "frame_size", "fps", "clip",
                    "on_damage"):
            assert meta[key] == manifest[key], key
        h = hashlib.sha256()
        value_bytes = 0
        for rec in records:  # reading order: records by video id bytes, then clip index
            for c in range(rec["clips"]):
                header, payload = stored[(rec["video_id"], c)]
                h.update(header)
                value_bytes += len(header) + len(payload)
                vid, index, label, arr = _parse_value(header, payload)
                assert (vid, index, label) == (rec["video_id"], c, rec["label"])
                clips.append((vid, index, label, arr))
        assert h.hexdigest() == shard["sha256"] and value_bytes == shard["value_bytes"]
        assert sum(r["clips"] for r in records) == len(stored) == shard["clips"]
    return manifest["classes"], clips


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("codec", list(WRITE_CODECS))
def test_spec_reader_matches_open_clips(synth_videos, tmp_path, codec, backend):
    from convert.job import JobOptions, run_job
    from convert.plan import ConvertConfig
    from loaders import open_clips

    out = str(tmp_path / codec)
    run_job(synth_videos, out, ConvertConfig(codec=codec, backend=backend, max_clips=1),
            JobOptions(workers=2, progress=False))
    classes, clips = spec_read(out)
    store = open_clips(out)
    assert classes == store.classes and len(clips) == len(store)
    # Reading order per FORMAT.md: shards in manifest order, then video id bytes, then clip index; from 0.
    for (vid, index, label, arr), i in zip(clips, range(len(store))):
        s = store[i]
        assert (vid, index, label) == (s.video_id, s.clip_index, s.label)
        assert np.array_equal(arr, s.clip)


# -- version 1, written from its spec ---------------------------------------
def _v1_payload(codec: str, clip: np.ndarray) -> tuple[int, bytes]:
    if codec == "raw":
        return 0, clip.tobytes()
    if codec == "lz4":
        return 1, lz4.block.compress(clip.tobytes(), store_size=False)
    frames = []
    for frame in clip:
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="JPEG", quality=90)
        frames.append(buf.getvalue())
    return 2, struct.pack(f"<I{len(frames)}I", len(frames), *map(len, frames)) + b"".join(frames)


def spec_write_v1(out: str, codec: str, videos: dict[str, tuple[int, np.ndarray]], classes: list[str],
                  shards: int = 2) -> None:
    """A version 1 conversion: videos {id: (label, clips (K, T, H, W, 3))} dealt over LMDB shards."""
    os.makedirs(os.path.join(out, "shards"))
    entries = []
    ids = sorted(videos)
    for s in range(shards):
        name = f"shard-{s:05d}"
        env = lmdb.open(os.path.join(out, "shards", name), map_size=1 << 28)
        h = hashlib.sha256()
        n_clips = n_bytes = n_videos = 0
        with env.begin(write=True) as txn:
            txn.put(b"m/shard", json.dumps({"codec": codec}).encode())
            for vid in ids[s::shards]:
                label, clips = videos[vid]
                for k, clip in enumerate(clips):
                    cid, payload = _v1_payload(codec, clip)
                    t, hh, w, c = clip.shape
                    head = struct.pack("<4sBBBBHHHHiIIII", b"VCLP", 1, cid, c, 0, t, hh, w, len(vid.encode()),
                                       label, k, k * t, zlib.crc32(payload), len(payload)) + vid.encode()
                    txn.put(b"c/" + vid.encode() + b"/%06d" % k, head + payload)
                    n_clips += 1
                    n_bytes += len(head) + len(payload)
                rec = {"video_id": vid, "path": f"/v/{vid}.mp4", "label": label, "status": "ok",
                       "clips": len(clips), "frames": len(clips) * clips.shape[1], "reason": ""}
                txn.put(b"m/done/" + vid.encode(), json.dumps(rec).encode())
                n_videos += 1
            cur = txn.cursor()
            cur.set_range(b"c/")
            for key, value in cur:
                if not key.startswith(b"c/"):
                    break
                n = struct.unpack_from("<H", value, 14)[0]
                h.update(struct.pack("<I", len(key)) + key + struct.pack("<Q", len(value)) + value[:36 + n])
        env.close()
        entries.append({"name": name, "path": f"shards/{name}", "videos": n_videos, "clips": n_clips,
                        "value_bytes": n_bytes, "sha256": h.hexdigest()})
    t, hh, w, _ = next(iter(videos.values()))[1].shape[1:]
    manifest = {"format": "videoclips", "format_version": 1, "backend": "lmdb", "codec": codec,
                "clip_shape": [t, hh, w, 3], "frame_size": {"size": [hh, w], "short_side": None}, "fps": None,
                "clip": {"clip_len": t, "stride": 1, "step": t, "max_clips": None, "short": "skip"},
                "on_damage": "keep", "classes": classes, "num_classes": len(classes), "shards": entries,
                "totals": {k: sum(e[k] for e in entries) for k in ("videos", "clips", "value_bytes")},
                "status_counts": {"ok": len(videos)}, "source": {}, "created": "2025-01-01T00:00:00Z"}
    json.dump(manifest, open(os.path.join(out, "manifest.json"), "w"))


@pytest.mark.parametrize("codec", ["raw", "lz4", "jpeg"])
def test_version_1_folders_still_read_and_verify(tmp_path, codec):
    from convert.format.verify import verify
    from loaders import ClipDataset, open_clips

    rng = np.random.default_rng(3)
    # ids whose bytes sort differently in c/ keys and m/done/ keys ("a" vs "a!x")
    ids = ["a", "a!x", "walk/x", "walk-x", "zz"]
    videos = {vid: (i % 2, np.cumsum(rng.integers(0, 9, (1 + i % 3, 4, 24, 32, 3)), axis=3).astype(np.uint8))
              for i, vid in enumerate(ids)}
    out = str(tmp_path / "v1")
    spec_write_v1(out, codec, videos, ["one", "two"])
    assert verify(out) == ([], {"shards": 2, "clips": sum(len(v[1]) for v in videos.values()), "videos": 5})
    store = open_clips(out)
    dealt = sorted(videos)  # spec_write_v1 deals sorted ids round-robin over the shards
    expect = [(vid, k) for s in range(2) for vid in sorted(dealt[s::2], key=str.encode)
              for k in range(len(videos[vid][1]))]
    assert [(store[i].video_id, store[i].clip_index) for i in range(len(store))] == expect
    for i, (vid, k) in enumerate(expect):
        got = store[i].clip
        if codec == "jpeg":
            assert got.shape == videos[vid][1][k].shape
        else:
            assert np.array_equal(got, videos[vid][1][k])
    ds = ClipDataset(out, train=False, crop_size=16)
    assert ds[0]["clip"].shape == (4, 16, 16, 3) and ds.verify() == {"shards": 2, "clips": len(store)}
