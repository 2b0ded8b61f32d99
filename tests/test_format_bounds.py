"""A clip header is held to what its conversion can hold before any payload is decoded.

A short-side conversion fixes no clip shape, so a forged header (16 x 8192 x
8192, or 65535 frames) once made every reader decode the payload into
gigabytes. Now each header's shape is checked against the manifest's rule
(``DataSpec.shape_problem``: T the clip length, C 3, the short side S, the
long side at most ``MAX_ASPECT`` * S) by every reader and ``verify``, and each
decoder stops at the clip's size: a hostile clip costs at most one clip's
memory and is refused in one line naming the shard and the clip.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from convert.format import FormatError
from convert.format.codecs import CODECS_BY_ID, get_codec
from convert.format.layout import MAX_ASPECT, pack_header, unpack_header
from convert.format.lmdb import HANDLES, clip_key
from convert.format.manifest import ClipSettings, DataSpec, FrameSize
from convert.format.video import coded_size
from convert.store import open_clips
from convert.store.verify import verify

from .loaders_fixtures import copy_conversion, loader_base, rewrite_value, tfrecord_converted  # noqa: F401

CODECS = ("raw", "jpeg", "h264", "vp9")
SHORT = 32


def _spec(*, size: tuple[int, int] | None = None, short: int | None = None, clip_len: int = 16) -> DataSpec:
    return DataSpec(backend="lmdb", codec="raw", codec_id=0, classes=("a",),
                    clip_shape=(clip_len, *size, 3) if size else None,
                    frame_size=FrameSize(size=size, short_side=short),
                    fps=None, clip=ClipSettings(clip_len=clip_len, stride=1, step=16, max_clips=None, short="loop"),
                    on_damage="partial")


def test_the_shape_rule_allows_what_a_conversion_makes_and_nothing_else():
    short = _spec(short=SHORT)
    low, high = short.shape_bounds()
    assert (low, high) == ((16, SHORT, SHORT, 3), (16, MAX_ASPECT * SHORT, MAX_ASPECT * SHORT, 3))
    for ok in [(16, 32, 32, 3), (16, 32, 57, 3), (16, 128, 32, 3), (16, 32, MAX_ASPECT * SHORT, 3)]:
        assert short.shape_problem(ok) is None, ok
        assert all(a <= v <= b for a, v, b in zip(low, ok, high)), ok
    for bad in [(16, 8192, 8192, 3), (65535, 32, 40, 3), (15, 32, 40, 3), (16, 32, 40, 4), (16, 31, 40, 3),
                (16, 33, 40, 3), (16, 32, MAX_ASPECT * SHORT + 1, 3)]:
        problem = short.shape_problem(bad)
        assert problem is not None and str(bad) in problem and "\n" not in problem, bad
    assert short.max_clip_bytes == 16 * SHORT * MAX_ASPECT * SHORT * 3
    fixed = _spec(size=(32, 40))
    assert fixed.shape_bounds() == ((16, 32, 40, 3), (16, 32, 40, 3))
    assert fixed.shape_problem((16, 32, 40, 3)) is None
    assert fixed.shape_problem((16, 40, 32, 3)) is not None
    assert fixed.max_clip_bytes == 16 * 32 * 40 * 3


def test_a_manifest_whose_clip_shape_disagrees_with_its_frame_size_and_clip_length_is_refused():
    good = _spec(size=(32, 40)).to_dict()
    for change in ({"clip_shape": [16, 8192, 8192, 3]}, {"clip_shape": None}, {"clip_shape": [65535, 32, 40, 3]}):
        with pytest.raises(FormatError, match="is not what clip_len 16 and frame_size"):
            DataSpec.from_dict({**good, **change}, "m.json")
    short = _spec(short=SHORT).to_dict()
    with pytest.raises(FormatError, match="is not what clip_len"):
        DataSpec.from_dict({**short, "clip_shape": [16, 32, 40, 3]}, "m.json")


def test_a_short_side_conversion_refuses_a_video_wider_than_the_format_allows():
    from convert.worker.decode import FrameSpec, VideoError

    spec = FrameSpec(size=None, short_side=SHORT)
    assert spec.out_size(MAX_ASPECT * 100, 100) == (SHORT, MAX_ASPECT * SHORT)
    assert spec.out_size(100, MAX_ASPECT * 100) == (MAX_ASPECT * SHORT, SHORT)
    for width, height in [(MAX_ASPECT * 100 + 1, 100), (100, MAX_ASPECT * 100 + 1), (0, 100)]:
        with pytest.raises(VideoError, match="aspect"):
            spec.out_size(width, height)
    assert FrameSpec(size=(32, 40)).out_size(10_000, 10) == (32, 40)  # a fixed size takes any source


@pytest.fixture(scope="module")
def short_side(tmp_path_factory):
    """One small short-side conversion per codec (5 videos, one shard): {codec: folder}."""
    from convert.job.run import JobOptions, run_job
    from convert.synth import make_dataset
    from convert.worker.plan import ConvertConfig

    base = tmp_path_factory.mktemp("bounds")
    src = str(base / "src")
    make_dataset(src, per_class=1, seconds=0.8, seed=3)
    out = {}
    for codec in CODECS:
        out[codec] = str(base / codec)
        run_job(src, out[codec], ConvertConfig(codec=codec, size=None, short_side=SHORT),
                JobOptions(workers=1, shards=1, progress=False))
    return out


def _forge(root: str, tmp_path, shape: tuple[int, int, int, int], payload: bytes | None = None) -> tuple[str, str]:
    """A copy of ``root`` whose clip 0 has a header of ``shape`` (and ``payload`` when given), every checksum the
    header carries recomputed; (the copy, how errors name the clip: its shard's folder and its key)."""
    copy = copy_conversion(root, str(tmp_path / "c"))
    store = open_clips(root)
    shards, refs = store.refs([0])
    shard = os.path.join(copy, store.manifest.shards[int(shards[0])].path)

    def forged(value: bytes) -> bytes:
        h = unpack_header(value)
        body = value[h.offset:] if payload is None else payload
        return pack_header(codec_id=h.codec_id, shape=shape, label=h.label, clip_index=h.clip_index,
                           start_frame=h.start_frame, video_id=h.video_id, payload=body) + body

    HANDLES.forget(shard)
    rewrite_value(shard, clip_key(*refs[0]), forged)
    return copy, f"{shard}: {clip_key(*refs[0]).decode()}"


def _peak_growth(fn) -> int:
    """Bytes the process's peak resident set grew by while ``fn()`` ran (Linux: the peak is reset first)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM, the peak, to the current resident set

    def status(key: str) -> int:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith(key)) * 1024

    before = status("VmRSS:")
    fn()
    return status("VmHWM:") - before


def _refused(read) -> str:
    """The one-line FormatError ``read()`` raises, its peak memory growth asserted under ``BOUND``."""
    errors: list[FormatError] = []

    def attempt() -> None:
        try:
            read()
        except FormatError as exc:
            errors.append(exc)

    grown = _peak_growth(attempt)
    assert errors, "read without an error"
    msg = str(errors[0])
    assert "\n" not in msg, msg
    assert grown < BOUND, f"the peak grew by {grown >> 20} MiB reading until: {msg}"
    return msg


def _read_all(loader) -> None:
    for _ in loader:
        pass


HOSTILE = {"8192x8192": (16, 8192, 8192, 3), "T=65535": (65535, SHORT, 40, 3)}
BOUND = 64 << 20  # far below one hostile clip (3.2 GB or 250 MB), far above one real one


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_forged_header_is_refused_in_one_line_by_every_reader_before_its_payload_is_decoded(
        short_side, tmp_path, codec, case):
    from loaders import ClipDataset

    root, shard = _forge(short_side[codec], tmp_path, HOSTILE[case])
    store = open_clips(root)
    dataset = ClipDataset(root, train=False)
    for read in (lambda: store[0], lambda: dataset[0]):
        msg = _refused(read)
        assert msg.startswith(shard) and str(HOSTILE[case]) in msg, msg
    problems, _ = verify(root)
    named = [p for p in problems if str(HOSTILE[case]) in p]
    assert named and all("\n" not in p for p in problems), problems
    assert named[0].startswith(shard), named


def _clip(t: int, h: int, w: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, (t, h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("codec", ["jpeg", "h264", "vp9"])
def test_a_payload_coded_larger_than_its_legal_header_is_refused_without_decoding_it_whole(short_side, tmp_path,
                                                                                             codec):
    """A header the rule allows over pictures of another, larger size: refused before a decoder allocates them,
    from the payload's own headers (jpeg: each JPEG's; h264: its sequence parameter sets; vp9: its IVF header and
    frame headers), FFmpeg's max_pixels behind them."""
    store = open_clips(short_side[codec])
    shape = store[0].clip.shape
    big = get_codec(codec).encode(_clip(shape[0], 8 * shape[1], 8 * shape[2]))
    root, shard = _forge(short_side[codec], tmp_path, shape, bytes(big))
    with pytest.raises(FormatError) as exc:
        open_clips(root)[0]
    msg = str(exc.value)
    words = {"jpeg": "jpeg frame 0 is", "h264": "h264 sequence parameter set codes", "vp9": "IVF header says"}
    assert "\n" not in msg and msg.startswith(shard) and words[codec] in msg, msg


def test_a_video_payload_is_decoded_no_further_than_its_clip():
    h264 = CODECS_BY_ID[4]
    long = h264.encode(_clip(20, 32, 40))
    with pytest.raises(FormatError, match="more than the 16 frames its header says"):
        h264.decode(long, (16, 32, 40, 3))
    vp9 = CODECS_BY_ID[5]
    payload = bytearray(vp9.encode(_clip(16, 32, 40)))
    assert vp9.decode(bytes(payload), (16, 32, 40, 3)).shape == (16, 32, 40, 3)
    # The IVF header's fields: frame count (offset 24), width (12), height (14), header length (6).
    for offset, fmt, value in [(24, "<I", 20), (12, "<H", 42), (14, "<H", 8192), (6, "<H", 44)]:
        bad = bytearray(payload)
        struct.pack_into(fmt, bad, offset, value)
        with pytest.raises(FormatError, match="IVF header says"):
            vp9.decode(bytes(bad), (16, 32, 40, 3))
    more = vp9.encode(_clip(20, 32, 40))
    forged = bytearray(more)
    struct.pack_into("<I", forged, 24, 16)  # the count says 16, the file holds 20 frames
    with pytest.raises(FormatError, match="go on past the clip's 16"):
        vp9.decode(bytes(forged), (16, 32, 40, 3))


@pytest.mark.parametrize("case", ["raw-header", "jpeg-pictures", "vp9-pictures"])
def test_the_dali_source_route_refuses_a_forged_clip_in_one_line(short_side, tmp_path, case):
    """A forged header (raw), or pictures larger than a legal header (jpeg, vp9: DALI's decoders would size their
    output by them): refused before DALI gets the payload, in one line naming the shard and clip."""
    pytest.importorskip("nvidia.dali")
    from loaders.dali import DaliClipLoader
    from loaders.presets import ClipPreset

    codec, what = case.split("-")
    if what == "header":
        root, clip = _forge(short_side[codec], tmp_path, HOSTILE["8192x8192"])
        words = str(HOSTILE["8192x8192"])
    else:
        shape = open_clips(short_side[codec])[0].clip.shape
        big = get_codec(codec).encode(_clip(shape[0], 8 * shape[1], 8 * shape[2]))
        root, clip = _forge(short_side[codec], tmp_path, shape, bytes(big))
        words = {"jpeg": f"jpeg frame 0 is {(8 * shape[1], 8 * shape[2], 3)}", "vp9": "IVF header says"}[codec]
    loader = DaliClipLoader(root, train=False, batch_size=2, preset=ClipPreset(crop_size=SHORT, train=False),
                            workers=0)
    msg = _refused(lambda: next(iter(loader)))
    loader.close()
    assert clip in msg and words in msg, msg


# (codec, the forged shape's varints in place of [16, 128, 171, 3]'s, the shape the loader names): 17 frames, and
# a height of 8192 (two varint bytes, as 128's), which the raw reshape would otherwise be asked to make.
NATIVE_FORGERIES = {"jpeg-T17": ("jpeg", b"\x11\x80\x01\xab\x01\x03", (17, 128, 171, 3)),
                    "raw-H8192": ("raw", b"\x10\x80\x40\xab\x01\x03", (16, 8192, 171, 3))}


@pytest.mark.parametrize("case", list(NATIVE_FORGERIES))
def test_the_dali_native_route_refuses_a_record_of_a_shape_the_conversion_cannot_hold(synth_videos, loader_base,  # noqa: F811
                                                                                      tmp_path, case):
    """The record's ``shape`` feature (what DALI's decoders are given) is forged: clamped into the conversion's
    bounds inside the pipeline (no decoder sizes its output by it), and refused by the loader in one line naming
    the shard and clip."""
    pytest.importorskip("nvidia.dali")
    from convert.format.tfrecord.wire import masked_crc
    from loaders.dali import DaliTFRecordLoader

    codec, forged, named = NATIVE_FORGERIES[case]
    root = copy_conversion(tfrecord_converted(synth_videos, loader_base, codec), str(tmp_path / "c"))
    shard = os.path.join(root, open_clips(root).manifest.shards[0].path)
    part = os.path.join(shard, "part-00000.tfrecord")
    with open(part, "r+b") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        fh.seek(12)
        data = bytearray(fh.read(length))
        # The packed int64 list [16, 128, 171, 3] (varints) of the first record's shape feature.
        at = bytes(data).index(b"\x10\x80\x01\xab\x01\x03")
        data[at:at + len(forged)] = forged
        fh.seek(12)
        fh.write(data + struct.pack("<I", masked_crc(bytes(data))))
    loader = DaliTFRecordLoader(root, train=False, batch_size=4)
    msg = _refused(lambda: _read_all(loader))
    loader.close()
    assert msg.startswith(shard) and str(named) in msg, msg


def _rewrite_first_record(root: str, codec, forge=None) -> tuple[str, tuple[int, ...]]:
    """Conversion ``root``'s first TFRecord record rewritten with its header and shape kept and its payload coded
    by ``codec`` at 8x the clip's height and width, then passed through ``forge(payload, shape)`` where given (the
    parts, the header's checksums, the index, the part's commit and the manifest's file sizes rewritten to
    match, as a forger would); (its shard's folder, the clip's shape)."""
    from convert.format.tfrecord.wire import decode_example, encode_example, frame_record

    shard = os.path.join(root, open_clips(root).manifest.shards[0].path)
    part = os.path.join(shard, "part-00000.tfrecord")
    raw = open(part, "rb").read()
    (length,) = struct.unpack_from("<Q", raw, 0)
    features = decode_example(memoryview(raw)[12:12 + length])
    header = unpack_header(bytes(features["header"][1]))
    t, h, w, _ = header.shape
    # Flat pictures: a payload of few bytes, so what the read costs is the decoder's pictures, not the record.
    payload = bytes(codec.encode(np.zeros((t, 8 * h, 8 * w, 3), np.uint8)))
    payload = payload if forge is None else forge(payload, header.shape)
    offsets, sizes = codec.parts(payload, header.shape) if codec.payload.layout == "frames" else \
        (np.zeros(1, np.int64), np.full(1, len(payload), np.int64))
    new: dict[str, tuple[str, object]] = {name: (kind, bytes(value) if kind == "bytes" else value)
                                           for name, (kind, value) in features.items()}
    new["payload"] = ("bytes", payload)
    new["part_offsets"], new["part_sizes"] = ("int64", offsets.tolist()), ("int64", sizes.tolist())
    new["header"] = ("bytes", pack_header(codec_id=header.codec_id, shape=header.shape, label=header.label,
                                          clip_index=header.clip_index, start_frame=header.start_frame,
                                          video_id=header.video_id, payload=payload))
    record = b"".join(bytes(p) for p in frame_record(b"".join(bytes(p) for p in encode_example(new))))
    rest = raw[12 + length + 4:]
    with open(part, "wb") as fh:
        fh.write(record + rest)
    index = part[:-len(".tfrecord")] + ".idx"
    lines = [line.split() for line in open(index).read().splitlines()]
    shift = len(record) - (12 + length + 4)
    with open(index, "w") as idx:
        idx.write(f"0 {len(record)}\n" + "".join(f"{int(a) + shift} {b}\n" for a, b in lines[1:]))
    # The part's commit and the manifest's list of files give its size: a forger rewrites them too.
    commit = os.path.join(shard, "part-00000.json")
    done = json.load(open(commit))
    done["bytes"] += shift
    json.dump(done, open(commit, "w"))
    path = os.path.join(root, "manifest.json")
    manifest = json.load(open(path))
    for f in manifest["shards"][0]["files"]:
        if f["path"] == "part-00000.tfrecord":
            f["bytes"] += shift
    json.dump(manifest, open(path, "w"))
    return shard, header.shape


@pytest.mark.parametrize("codec", ["jpeg", "vp9"])
def test_the_dali_native_route_refuses_pictures_larger_than_their_legal_header(synth_videos, loader_base,  # noqa: F811
                                                                              tmp_path, codec):
    """A record whose header and shape are the clip's but whose pictures are coded at 8x its size. jpeg: DALI
    decodes only the clip's region of each JPEG (no output buffer of the forged size), and the loader refuses the
    record from the JPEGs' own headers. vp9: DALI's video decoder would size its pictures by the stream, so the
    route's gate reads the stream's headers before it. Either way one line naming the shard and clip, and no
    more memory than a clip's."""
    pytest.importorskip("nvidia.dali")
    from loaders.dali import DaliTFRecordLoader

    def legal_ivf(payload: bytes, shape: tuple[int, ...]) -> bytes:
        # The IVF header says the clip's coded size too: only the VP9 frames' own headers say the truth.
        out = bytearray(payload)
        struct.pack_into("<HH", out, 12, *reversed(coded_size(shape)))
        return bytes(out)

    root = copy_conversion(tfrecord_converted(synth_videos, loader_base, codec), str(tmp_path / "c"))
    shard, (t, h, w, _) = _rewrite_first_record(root, get_codec(codec), legal_ivf if codec == "vp9" else None)
    loader = DaliTFRecordLoader(root, train=False, batch_size=4)
    msg = _refused(lambda: _read_all(loader))
    loader.close()
    big = coded_size((t, 8 * h, 8 * w, 3))
    words = {"jpeg": f"jpeg frame 0 is {(8 * h, 8 * w, 3)}", "vp9": f"vp9 payload: frame 0 states {big[0]}x{big[1]}"}
    assert msg.startswith(shard) and words[codec] in msg, msg
