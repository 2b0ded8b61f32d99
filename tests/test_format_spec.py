"""A reader written from FORMAT.md alone (no project imports) must agree with ours."""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import zlib

import lmdb
import lz4.block
import numpy as np
import pytest
from PIL import Image


def spec_read(out: str) -> tuple[list[str], list[tuple[str, int, int, np.ndarray]]]:
    """Everything per FORMAT.md: manifest, keys, header, payloads, checksum."""
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    if manifest["format"] != "videoclips" or manifest["format_version"] != 1:
        raise ValueError("not a videoclips v1 conversion")
    clips = []
    for shard in manifest["shards"]:
        env = lmdb.open(os.path.join(out, shard["path"]), readonly=True, lock=False)
        h = hashlib.sha256()
        with env.begin() as txn:
            entries = {k: v for k, v in txn.cursor()}
        env.close()
        clip_keys = sorted(k for k in entries if k.startswith(b"c/"))
        for key in clip_keys:
            value = entries[key]
            (magic, version, codec, c, _, t, hh, w, n, label, index, start, crc, plen) = struct.unpack_from(
                "<4sBBBBHHHHiIIII", value, 0)
            assert magic == b"VCLP" and version == 1 and len(value) == 36 + n + plen
            vid = value[36:36 + n].decode()
            payload = value[36 + n:]
            assert zlib.crc32(payload) == crc
            if codec == 0:
                arr = np.frombuffer(payload, np.uint8).reshape(t, hh, w, c)
            elif codec == 1:
                arr = np.frombuffer(lz4.block.decompress(payload, uncompressed_size=t * hh * w * c),
                                    np.uint8).reshape(t, hh, w, c)
            else:
                (count,) = struct.unpack_from("<I", payload, 0)
                lengths = struct.unpack_from(f"<{count}I", payload, 4)
                pos, frames = 4 + 4 * count, []
                for ln in lengths:
                    frames.append(np.asarray(Image.open(io.BytesIO(payload[pos:pos + ln])).convert("RGB")))
                    pos += ln
                arr = np.stack(frames)
            assert key == b"c/" + vid.encode() + b"/%06d" % index
            h.update(struct.pack("<I", len(key)) + key + struct.pack("<Q", len(value)) + value[:36 + n])
            clips.append((vid, index, label, arr))
        assert h.hexdigest() == shard["sha256"]
        records = [json.loads(v) for k, v in entries.items() if k.startswith(b"m/done/")]
        assert sum(r["clips"] for r in records) == len(clip_keys) == shard["clips"]
    return manifest["classes"], clips


@pytest.mark.parametrize("codec", ["raw", "lz4", "jpeg"])
def test_spec_reader_matches_open_clips(synth_videos, tmp_path, codec):
    from convert.job import JobOptions, run_job
    from convert.plan import ConvertConfig
    from loaders import open_clips

    out = str(tmp_path / codec)
    run_job(synth_videos, out, ConvertConfig(codec=codec, max_clips=1), JobOptions(workers=2, progress=False))
    classes, clips = spec_read(out)
    store = open_clips(out)
    assert classes == store.classes and len(clips) == len(store)
    # Reading order per FORMAT.md: shards in manifest order, then key order.
    for (vid, index, label, arr), i in zip(clips, range(len(store))):
        s = store[i]
        assert (vid, index, label) == (s.video_id, s.clip_index, s.label)
        assert np.array_equal(arr, s.clip)
