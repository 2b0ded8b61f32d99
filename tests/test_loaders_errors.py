"""Broken conversions give one-line FormatErrors naming the file and the reason."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from convert.format.layout import pack_header, unpack_header
from convert.format.lmdb import clip_key
from loaders import ClipDataset, FormatError, open_clips

from .loaders_fixtures import copy_conversion, jpeg_root, loader_base, lz4_root, raw_root, rewrite_value  # noqa: F401


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def _shard_and_key(root: str, i: int) -> tuple[str, bytes]:
    """Where clip ``i`` lives, read from the intact original (a damaged copy must not be opened first)."""
    store = open_clips(root)
    shards, refs = store.refs([i])
    return store.manifest.shards[int(shards[0])].path, clip_key(*refs[0])


def pack_value(*, payload: bytes, **fields) -> bytes:
    return pack_header(payload=payload, **fields) + payload


def test_manifest_missing(raw_root, tmp_path):
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    os.remove(os.path.join(root, "manifest.json"))
    with pytest.raises(FormatError) as exc:
        ClipDataset(root, train=True)
    msg = _one_line(exc)
    assert root in msg and "manifest.json" in msg and "not a finished conversion" in msg


def test_shard_directory_deleted(raw_root, tmp_path):
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    shard = os.path.join(root, "shards", "shard-00001")
    shutil.rmtree(shard)
    with pytest.raises(FormatError) as exc:
        ClipDataset(root, train=True)
    msg = _one_line(exc)
    assert shard in msg and "shard missing" in msg


def test_shard_truncated(raw_root, tmp_path):
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    data = os.path.join(root, "shards", "shard-00002", "data.mdb")
    os.truncate(data, os.path.getsize(data) // 2)
    with pytest.raises(FormatError) as exc:
        ClipDataset(root, train=True)
    msg = _one_line(exc)
    assert data in msg and "truncated" in msg


def test_corrupt_payload_byte_fails_the_checksum(raw_root, tmp_path):
    rel, key = _shard_and_key(raw_root, 5)
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    shard = os.path.join(root, rel)

    def flip_a_pixel(value: bytes) -> bytes:
        b = bytearray(value)
        b[-1000] ^= 0xFF  # inside the payload; the header's CRC still describes the old bytes
        return bytes(b)

    rewrite_value(shard, key, flip_a_pixel)
    with pytest.raises(FormatError) as exc:
        ClipDataset(root, train=True, verify_checksums=True)
    msg = _one_line(exc)
    assert shard in msg and key.decode() in msg and "checksum mismatch" in msg and "crc32" in msg
    # .verify() finds it on demand; a raw crop checks its clip's CRC-32 even unasked (RawCodec.crc_on_crop:
    # the CRC pass is how a raw crop reads fastest), and names the shard and the key
    ds = ClipDataset(root, train=True)
    with pytest.raises(FormatError, match="checksum mismatch"):
        ds.verify()
    for verify in (False, True):
        ds.verify_checksums = verify
        with pytest.raises(FormatError) as exc:
            ds[5]
        msg = _one_line(exc)
        assert shard in msg and key.decode() in msg and "crc32" in msg
        assert ds[4]["index"] == 4  # the other clips are fine
    # the plain reader returns the stored bytes unchecked (it is the caller's choice)
    assert open_clips(root).get(5).clip.shape == (16, 128, 171, 3)


@pytest.mark.parametrize("codec", ["lz4", "jpeg"])
def test_a_wrong_crc_is_checked_only_when_asked_for_lz4_and_jpeg(codec, lz4_root, jpeg_root, tmp_path):
    """Decoding codecs read their payload in order anyway: their CRC check stays the caller's choice."""
    src = {"lz4": lz4_root, "jpeg": jpeg_root}[codec]
    rel, key = _shard_and_key(src, 5)
    root = copy_conversion(src, str(tmp_path / "c"))
    shard = os.path.join(root, rel)

    def wrong_crc(value: bytes) -> bytes:
        h = unpack_header(value)
        payload = value[h.offset:]
        header = pack_header(codec_id=h.codec_id, shape=h.shape, label=h.label, clip_index=h.clip_index,
                             start_frame=h.start_frame, video_id=h.video_id, payload=payload)
        crc_at = 28  # FORMAT.md: the payload's CRC-32 is bytes 28-31 of the header
        return header[:crc_at] + bytes(b ^ 0xFF for b in header[crc_at:crc_at + 4]) + header[crc_at + 4:] + payload

    rewrite_value(shard, key, wrong_crc)
    ds = ClipDataset(root, train=False)
    want = ClipDataset(src, train=False)[5]["clip"]
    assert (ds[5]["clip"] == want).all()  # the pixels are intact, only the stored CRC is wrong
    ds.verify_checksums = True
    with pytest.raises(FormatError) as exc:
        ds[5]
    msg = _one_line(exc)
    assert shard in msg and key.decode() in msg and "crc32" in msg


def test_value_replaced_consistently_still_differs_from_the_manifest(raw_root, tmp_path):
    rel, key = _shard_and_key(raw_root, 2)
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    shard = os.path.join(root, rel)

    def repack(value: bytes) -> bytes:
        h = unpack_header(value)
        payload = bytearray(value[h.offset:])
        payload[0] ^= 0x01
        return pack_value(codec_id=h.codec_id, shape=h.shape, label=h.label, clip_index=h.clip_index,
                          start_frame=h.start_frame, video_id=h.video_id, payload=bytes(payload))

    rewrite_value(shard, key, repack)  # a valid value with its own CRC: only the manifest knows
    with pytest.raises(FormatError) as exc:
        ClipDataset(root, train=True, verify_checksums=True)
    msg = _one_line(exc)
    assert shard in msg and "checksum mismatch" in msg and "manifest" in msg
    assert ClipDataset(raw_root, train=True).verify() == {"shards": 3, "clips": len(open_clips(raw_root))}


def test_label_outside_the_class_list(raw_root, tmp_path):
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    path = os.path.join(root, "manifest.json")
    with open(path) as fh:
        manifest = json.load(fh)
    manifest["classes"] = manifest["classes"][:-1]  # the last class's videos now have no name
    manifest["num_classes"] = len(manifest["classes"])
    with open(path, "w") as fh:
        json.dump(manifest, fh)
    with pytest.raises(FormatError) as exc:
        ClipDataset(root, train=True)
    msg = _one_line(exc)
    # Every shard stores the class list: the edited manifest disagrees with the first shard.
    assert os.path.join(root, "shards", "shard-00000") in msg and "shard says classes" in msg


def test_stored_label_outside_the_class_list_is_caught_on_read(raw_root, tmp_path):
    rel, key = _shard_and_key(raw_root, 7)
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    shard = os.path.join(root, rel)

    def relabel(value: bytes) -> bytes:
        h = unpack_header(value)
        return pack_value(codec_id=h.codec_id, shape=h.shape, label=99, clip_index=h.clip_index,
                          start_frame=h.start_frame, video_id=h.video_id, payload=value[h.offset:])

    rewrite_value(shard, key, relabel)
    ds = ClipDataset(root, train=False)
    with pytest.raises(FormatError) as exc:
        ds.__getitems__([6, 7, 8])
    msg = _one_line(exc)
    assert shard in msg and key.decode() in msg and "label 99 outside the 5 classes" in msg
