"""Damaged video bitstreams (issue 25): ``verify`` names the shard and the clip in one line and never dies or hangs
with its checker; the readers refuse the clip in one line and read the others.

Each damaged payload is written back with a CRC-32 and a length that match it (as a hostile or buggy writer
would), so only decoding can find it; the shard-level checksums then differ too, and ``verify`` says so on lines
of their own. A crash and a hang of the decoder are made by a decode patched in the parent before ``verify``
forks its checkers.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import struct
import time
from typing import Any, cast

import numpy as np
import pytest

from convert.format import FormatError
from convert.format.bitstreams import IVF_FRAME_HEADER, IVF_HEADER
from convert.format.layout import ClipHeader, pack_header, unpack_header
from convert.format.lmdb import clip_key
from convert.format.video import H264Codec, VideoCodec, Vp9Codec
from convert.store import open_clips
from convert.store import verify as verify_module
from convert.store.verify import verify

from .convert_helpers import run_cli
from .loaders_fixtures import copy_conversion, rewrite_value

CODECS = {"h264": H264Codec(), "vp9": Vp9Codec()}
DAMAGED = 1  # the clip damaged: the second of the shard's first video


@pytest.fixture(scope="module")
def video_src(tmp_path_factory) -> str:
    from convert.synth import make_dataset

    root = str(tmp_path_factory.mktemp("video_src"))
    make_dataset(root, per_class=1, seconds=2.0, seed=3, classes=("spin", "move_up"))
    return root


_CONVERTED: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def conversion(video_src, tmp_path_factory):
    """``conversion(codec, backend)``: ``video_src`` converted at 16x32 into one shard, once per module."""
    def get(codec: str, backend: str = "lmdb") -> str:
        if (codec, backend) not in _CONVERTED:
            out = str(tmp_path_factory.mktemp(f"{codec}_{backend}") / "out")
            r = run_cli(video_src, out, "--codec", codec, "--backend", backend, "--size", "16x32", "--workers", "1",
                        "--shards", "1", "--no-progress")
            assert r.returncode == 0, r.stderr
            _CONVERTED[codec, backend] = out
        return _CONVERTED[codec, backend]
    return get


def _clip(out: str, i: int) -> tuple[str, ClipHeader, bytes]:
    """Clip ``i``'s shard folder, header and payload (a copy)."""
    store = open_clips(out)
    got = [(clip.header, bytes(clip.payload)) for clip in store.read([i])]
    shard = store.shard_paths[int(store.shards_of([i])[0])]
    store.close()
    return shard, got[0][0], got[0][1]


def _flipped_keyframe(codec: str, payload: bytes) -> bytes:
    """16 bytes inverted early in the keyframe's coded data, past its container framing (h264: its IDR slice's
    NAL header; vp9: its IVF frame header and first bytes), so the decoder meets them.

    Early, not anywhere: bytes flipped deep in a picture's coded residual can decode to T (wrong) pictures without
    a decoder error (VP9 has no way to see it). Only the payload's CRC-32 catches those, which is why readers
    check it on every read of a video payload (the next test).
    """
    if codec == "vp9":
        start = IVF_HEADER + IVF_FRAME_HEADER + 4
    else:
        start = next(i + 4 for i in range(len(payload) - 3)
                     if payload[i:i + 3] == b"\x00\x00\x01" and payload[i + 3] & 0x1F == 5)  # NAL type 5: IDR
    out = bytearray(payload)
    out[start:start + 16] = bytes(b ^ 0xFF for b in out[start:start + 16])
    return bytes(out)


def _garbage(codec: str, payload: bytes) -> bytes:
    # Noise in the codec's own framing, so it reaches the decoder: after a start code, or as IVF frames.
    noise = np.random.default_rng(0).integers(0, 256, len(payload), dtype=np.uint8).tobytes()
    if codec == "h264":
        return b"\x00\x00\x00\x01" + noise
    n = 16
    size = len(noise) // n
    return payload[:IVF_HEADER] + b"".join(struct.pack("<IQ", size, i) + noise[i * size:(i + 1) * size]
                                           for i in range(n))


def _fewer_frames(codec: str, payload: bytes, shape: tuple[int, ...]) -> bytes:
    # A valid bitstream of the clip's first T - 1 frames, under a header that says T.
    return bytes(CODECS[codec].encode(CODECS[codec].decode(payload, shape)[:-1]))


DAMAGES = {
    "truncated": lambda codec, payload, shape: payload[:len(payload) // 2],
    "flipped": lambda codec, payload, shape: _flipped_keyframe(codec, payload),
    "other-codec": lambda codec, payload, shape: CODECS["vp9" if codec == "h264" else "h264"].encode(
        CODECS[codec].decode(payload, shape)),
    "garbage": lambda codec, payload, shape: _garbage(codec, payload),
    "fewer-frames": lambda codec, payload, shape: _fewer_frames(codec, payload, shape),
}


def _damage(out: str, i: int, new_payload, *, crc_follows: bool = True) -> str:
    """Clip ``i``'s payload of the LMDB conversion ``out`` replaced by ``new_payload(payload, shape)``, its
    header's CRC-32 and length following it (or kept, ``crc_follows=False``); the clip's ``where``."""
    shard, header, payload = _clip(out, i)
    key = clip_key(header.video_id, header.clip_index)

    def change(old: bytes) -> bytes:
        h = unpack_header(old, value_len=len(old))
        new = new_payload(old[h.offset:], h.shape)
        if not crc_follows:
            return old[:h.offset] + new
        return pack_header(codec_id=h.codec_id, shape=h.shape, label=h.label, clip_index=h.clip_index,
                           start_frame=h.start_frame, video_id=h.video_id, payload=new) + new

    rewrite_value(shard, key, change)
    return f"{shard}: {key.decode()}"


def _one_line(info: pytest.ExceptionInfo) -> str:
    msg = str(info.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("codec", sorted(CODECS))
def test_a_damaged_bitstream_is_one_line_naming_the_clip_in_verify_and_the_readers(conversion, tmp_path, codec,
                                                                                  damage):
    from loaders import ClipDataset

    out = copy_conversion(conversion(codec), str(tmp_path / "out"))
    where = _damage(out, DAMAGED, lambda payload, shape: DAMAGES[damage](codec, payload, shape))
    r = run_cli("verify", out)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    (line,) = [x for x in lines if where in x]
    assert re.match(f"verify: {re.escape(where)}: {codec} payload[ :]", line), line
    # Besides the clip, only the shard's sums and file sizes say anything (the header changed under them).
    assert all(x.startswith("verify: shard-00000: ") for x in lines if x != line), lines
    store = open_clips(out)
    with pytest.raises(FormatError) as info:
        store.get(DAMAGED)
    assert _one_line(info) == line.removeprefix("verify: ")  # the readers and verify say the same
    others = [store.get(i) for i in range(len(store)) if i != DAMAGED]
    assert len(others) == len(store) - 1 >= 2
    ds = ClipDataset(out, train=False, crop_size=16)
    with pytest.raises(FormatError) as info:
        ds.__getitems__([DAMAGED - 1, DAMAGED])
    assert _one_line(info) == line.removeprefix("verify: ")
    assert len(ds.__getitems__([i for i in range(len(store)) if i != DAMAGED])) == len(store) - 1


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_a_flipped_byte_under_the_written_crc_never_reaches_ffmpeg_even_unverified(conversion, tmp_path,
                                                                                  monkeypatch, codec):
    """Readers check a video payload's CRC-32 on every read, ``verify`` off, before decoding it."""
    from loaders import ClipDataset

    out = copy_conversion(conversion(codec), str(tmp_path / "out"))
    where = _damage(out, DAMAGED, lambda payload, shape: _flipped_keyframe(codec, payload), crc_follows=False)
    decoded: list[int] = []
    real = VideoCodec.window

    def window(self, payload, shape, t0, t, out=None):
        decoded.append(len(payload))
        return real(self, payload, shape, t0, t, out)

    monkeypatch.setattr(VideoCodec, "window", window)
    store = open_clips(out)
    with pytest.raises(FormatError) as info:
        store.get(DAMAGED)
    assert _one_line(info).startswith(f"{where}: payload crc32 ") and decoded == []
    ds = ClipDataset(out, train=False, crop_size=16, verify_checksums=False)
    with pytest.raises(FormatError) as info:
        ds.__getitems__([DAMAGED])
    assert _one_line(info).startswith(f"{where}: payload crc32 ") and decoded == []
    store.get(DAMAGED - 1)
    assert len(decoded) == 1  # the check passes a sound clip on to the decoder


def _patched_decode(monkeypatch, target: bytes, act) -> None:
    """``act()`` in place of decoding the payload ``target`` (in the checker, which is forked after this)."""
    real = VideoCodec.decode

    def decode(self, payload, shape):
        if bytes(payload) == target:
            act()
        return real(self, payload, shape)

    monkeypatch.setattr(VideoCodec, "decode", decode)


def _segfault() -> None:
    # pytest's faulthandler, inherited by the forked checker, would print every thread's stack and the loaded
    # modules into the test log: a crash this test means to cause says nothing there.
    faulthandler.disable()
    os.kill(os.getpid(), signal.SIGSEGV)


@pytest.mark.parametrize("backend", ["lmdb", "tfrecord"])
def test_a_decoder_crash_is_one_line_naming_the_clip_and_what_was_left_unchecked(conversion, monkeypatch,
                                                                                backend):
    out = conversion("h264", backend)
    store = open_clips(out)
    where = store.where(DAMAGED)
    shard, _, payload = _clip(out, DAMAGED)
    _patched_decode(monkeypatch, payload, _segfault)
    problems, _ = verify(out, workers=1)
    assert problems == [f"{where}: corrupted: decoding it crashed the checker (killed by SIGSEGV); the clips after "
                        f"it in shard-00000 were not checked; the shard must be converted again"]
    assert shard in where


def test_a_hung_decode_is_stopped_and_named(conversion, monkeypatch):
    out = conversion("h264")
    where = open_clips(out).where(DAMAGED)
    _, header, payload = _clip(out, DAMAGED)
    CODECS["h264"].decode(payload, header.shape)  # PyAV imported and warm before the checker forks
    monkeypatch.setattr(verify_module, "DECODE_TIMEOUT", 2.0)
    _patched_decode(monkeypatch, payload, lambda: time.sleep(3600))
    problems, _ = verify(out, workers=1)
    assert problems == [f"{where}: corrupted: decoding hung (no answer in 2 s), so the checker was stopped; the "
                        f"clips after it in shard-00000 were not checked; the shard must be converted again"]


def test_a_checker_forked_after_its_parent_decoded_decodes(conversion):
    """libswscale's thread pool, started by a conversion in the parent, is not in a forked child: with it, the
    checker's first conversion waited for ever (reported as a hung decode, here after the default timeout)."""
    out = conversion("vp9")
    _, header, payload = _clip(out, 0)
    CODECS["vp9"].decode(payload, header.shape)
    assert verify(out, workers=1)[0] == []


def test_a_checker_killed_from_outside_while_decoding_is_the_machines_problem(conversion, monkeypatch):
    out = conversion("h264")
    _, _, payload = _clip(out, DAMAGED)
    _patched_decode(monkeypatch, payload, lambda: os.kill(os.getpid(), signal.SIGKILL))
    with pytest.raises(OSError, match=r"^shard-00000: the checker was killed by SIGKILL \(out of memory, or stopped "
                                      r"from outside\): not a problem of the shard; run verify again$"):
        verify(out, workers=1)


def test_the_hang_guard_times_each_decode_and_nothing_else(monkeypatch):
    """A checker is hung only inside one decode for the whole timeout: not while it reads (the machine's pace),
    and a new clip's decode starts the clock again (a slow shard of fast clips is no hang)."""
    monkeypatch.setattr(verify_module, "DECODE_TIMEOUT", 10.0)
    progress = verify_module.Progress()
    checker = verify_module._Checker("shard-00000", cast(Any, None), cast(Any, None), progress)  # progress alone
    t = checker.since
    assert not checker.hung(t + 100)  # not decoding
    progress.decoding("shard: c/a/1")
    assert not checker.hung(t + 101) and not checker.hung(t + 110.5)  # 9.5 s into this decode
    progress.done()
    progress.decoding("shard: c/a/2")
    assert not checker.hung(t + 112) and not checker.hung(t + 121.5)
    assert checker.hung(t + 122)  # 10 s into the same decode
    assert progress.state() == (2, True) and progress.where() == "shard: c/a/2"
    progress.done()
    assert progress.state() == (2, False) and not checker.hung(t + 1000)
    progress.close()
