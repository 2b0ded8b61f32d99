"""The video codecs (h264, vp9): exact frames, odd sizes, colour, quality, determinism, bad input in one line."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from convert.format import FormatError, codec_for_id, get_codec, read_manifest
from convert.format.bitstreams import IVF_FRAME_HEADER, IVF_HEADER
from convert.format.video import H264Codec, coded_size, rgb_into

from .conftest import load_script
from .convert_helpers import run_cli
from .videos import pattern

VIDEO_CODECS = ("h264", "vp9")


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b) ** 2))
    return 10 * np.log10(255 ** 2 / max(mse, 1e-12))


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    """A 16-frame clip of odd height and width, moving patterns (as the synthetic videos have)."""
    return pattern(16, 37, 51, seed=3)


@pytest.mark.parametrize("name", VIDEO_CODECS)
def test_a_clip_decodes_to_exactly_its_frames_cropped_back_and_close_to_the_source(name, clip):
    codec = get_codec(name)
    payload = codec.encode(clip)
    assert coded_size(clip.shape) == (38, 52)
    frames = codec_for_id(codec.id).decode(payload, clip.shape)
    assert frames.shape == clip.shape and frames.dtype == np.uint8
    assert _psnr(frames, clip) > 30  # each frame is its own, in order: a shifted frame falls far below
    per_frame = [_psnr(frames[k], clip[k]) for k in range(16)]
    assert min(per_frame) > 25
    # A window is the whole decode's frames, written into the caller's array.
    out = np.zeros((5, 37, 51, 3), np.uint8)
    assert codec.window(payload, clip.shape, 9, 5, out) is out
    assert np.array_equal(out, frames[9:14])


@pytest.mark.parametrize("name", VIDEO_CODECS)
def test_encoding_is_deterministic_and_the_quality_changes_the_bytes(name, clip):
    codec = get_codec(name)
    assert codec.encode(clip) == get_codec(name).encode(clip)
    low, high = codec.quality_range  # type: ignore[misc]
    better, worse = get_codec(name, low + 5).encode(clip), get_codec(name, high - 10).encode(clip)
    assert len(better) > len(worse)


def _nal_types(h264: bytes) -> list[int]:
    """The NAL unit types of an Annex-B stream, in order (3- and 4-byte start codes)."""
    return [h264[i + 3] & 0x1F for i in range(len(h264) - 3) if h264[i:i + 3] == b"\x00\x00\x01"]


@pytest.mark.parametrize("name", VIDEO_CODECS)
def test_a_videos_clips_share_one_encoder_yet_each_decodes_alone(name):
    codec = get_codec(name)
    video = pattern(48, 37, 51, seed=5)
    clips = [video[k:k + 16] for k in (0, 16, 32)]
    with codec.encoder() as encoder:
        payloads = [bytes(encoder.encode(c)) for c in clips]
    # The first clip is what a fresh encoder writes; the video's encoding repeats in a new encoder.
    assert payloads[0] == bytes(codec.encode(clips[0]))
    with codec.encoder() as encoder:
        assert [bytes(encoder.encode(c)) for c in clips] == payloads
    for c, payload in zip(clips, payloads):
        frames = codec.decode(payload, c.shape)  # a fresh decoder, nothing of the clips before
        assert _psnr(frames, c) > 30
        if name == "h264":
            types = _nal_types(payload)
            assert types[:3] == [7, 8, 5] and types.count(5) == 1  # SPS, PPS, then the clip's one IDR picture
        else:
            first = payload[IVF_HEADER + IVF_FRAME_HEADER]
            assert first >> 6 == 2 and not first & 0x04  # VP9 frame marker, then frame_type 0: a key frame
            assert sum(1 for p in _ivf_frames(payload) if not p[0] & 0x04) == 1


def _ivf_frames(payload: bytes) -> list[bytes]:
    pos, out = IVF_HEADER, []
    while pos < len(payload):
        size = int.from_bytes(payload[pos:pos + 4], "little")
        out.append(payload[pos + IVF_FRAME_HEADER:pos + IVF_FRAME_HEADER + size])
        pos += IVF_FRAME_HEADER + size
    return out


def test_a_clip_of_another_size_starts_a_new_encoder(clip):
    codec = get_codec("vp9")
    small = clip[:, :20, :30]
    with codec.encoder() as encoder:
        encoder.encode(clip)
        assert bytes(encoder.encode(small)) == bytes(codec.encode(small))


def test_an_encoder_that_holds_frames_back_is_an_error_not_a_short_clip(clip):
    # Without force-cfr, x264 holds one frame back to time it: a clip's packets would spill into the next one.
    class Delayed(H264Codec):
        encoder_options = {**H264Codec.encoder_options, "x264-params": "mbtree=0"}

    with pytest.raises(FormatError, match="libx264 gave 15 packets for a clip of 16 frames"):
        Delayed().encode(clip)


@pytest.mark.parametrize("name", VIDEO_CODECS)
def test_the_model_of_dalis_gpu_conversion_is_within_one_grey_level_of_format_md(name, clip):
    # scripts/device_check.py's nvdec_model: DALI's GPU YUV-to-RGB kernel on FFmpeg's (exact) pictures. Its
    # difference from FORMAT.md's libswscale pixels is what a GPU decode is expected to show: rounding only.
    codec = get_codec(name)
    payload = bytes(codec.encode(clip))
    model = load_script("device_check").nvdec_model(codec, payload, clip.shape).astype(np.int16)
    diff = np.abs(model - codec.decode(payload, clip.shape))
    assert diff.max() <= 1 and 0 < diff.mean() < 0.5


def test_the_device_checks_mp4_probe_holds_the_same_pictures(clip):
    # scripts/device_check.py's h264_in_mp4: the stored stream's access units in an mp4 file, which FFmpeg's mp4
    # demuxer decodes to open_clips' frames (the probe compares a GPU's decode of it with those).
    import io

    import av

    payload = bytes(get_codec("h264").encode(clip))
    mp4 = load_script("device_check").h264_in_mp4(payload)
    assert mp4[4:8] == b"ftyp"
    out = np.empty(clip.shape, np.uint8)
    with av.open(io.BytesIO(mp4), format="mp4") as container:
        frames = list(container.decode(video=0))
    assert len(frames) == 16
    for k, frame in enumerate(frames):
        rgb_into(frame, out[k])
    assert np.array_equal(out, get_codec("h264").decode(payload, clip.shape))


def test_a_failing_nvdec_row_is_one_line_and_the_check_goes_on(monkeypatch):
    check = load_script("device_check")
    monkeypatch.setattr(check, "synthetic_conversions", lambda work, configs, **kw: {k: f"/x/{k}" for k in configs})

    def row(root, *, label, **kw):
        if label == "h264":
            raise RuntimeError("Critical error in pipeline:\nError in MIXED operator\nAssert failed: no stream")
        return {"codec": label, "clips": 1}

    monkeypatch.setattr(check, "nvdec_row", row)
    rows = check.nvdec_rows("/unused", device_id=0, cores=1, smoke=True)
    assert [r["codec"] for r in rows] == ["h264", "vp9", "h264 in mp4 (probe)"]
    assert rows[0]["error"] == ("RuntimeError: Critical error in pipeline: | Error in MIXED operator | "
                                "Assert failed: no stream")
    assert "error" not in rows[1] and "error" not in rows[2]


def test_payloads_are_what_format_md_says(clip):
    h264 = bytes(get_codec("h264").encode(clip))
    assert h264.startswith(b"\x00\x00\x00\x01")
    # No SEI NAL units (type 6): x264's version string would tie the bytes to the encoder build.
    nal_types = {h264[i + 4] & 0x1F for i in range(len(h264) - 4) if h264[i:i + 4] == b"\x00\x00\x00\x01"}
    nal_types |= {h264[i + 3] & 0x1F for i in range(len(h264) - 3) if h264[i:i + 3] == b"\x00\x00\x01"}
    assert 6 not in nal_types and {7, 8, 5} <= nal_types  # SPS, PPS, IDR
    vp9 = bytes(get_codec("vp9").encode(clip))
    assert vp9[:4] == b"DKIF" and vp9[8:12] == b"VP90"
    assert int.from_bytes(vp9[12:14], "little") == 52 and int.from_bytes(vp9[14:16], "little") == 38
    assert int.from_bytes(vp9[24:28], "little") == 16


@pytest.mark.parametrize("name", VIDEO_CODECS)
def test_the_stream_says_bt601_full_range(name, clip):
    import io

    import av

    fmt = {"h264": "h264", "vp9": "ivf"}[name]
    with av.open(io.BytesIO(get_codec(name).encode(clip)), format=fmt) as container:
        frame = next(container.decode(video=0))
    assert frame.color_range == 2  # AVCOL_RANGE_JPEG: full
    assert frame.colorspace in (5, 6)  # BT.470BG / SMPTE 170M: the BT.601 matrix


@pytest.mark.parametrize("name", VIDEO_CODECS)
def test_damaged_or_foreign_payloads_are_one_line_format_errors(name, clip):
    codec = get_codec(name)
    payload = codec.encode(clip)
    other = get_codec("vp9" if name == "h264" else "h264").encode(clip)
    for bad in (payload[: len(payload) // 3], b"", other, b"\x00\x00\x00\x01" + bytes(200)):
        with pytest.raises(FormatError) as exc:
            codec.decode(bad, clip.shape)
        assert "\n" not in str(exc.value) and name in str(exc.value)
    # A sound stream of fewer frames than the header's T: the count check says so, before decoding (vp9: its IVF
    # header; h264: its pictures' slices).
    short = codec.encode(clip[:12])
    with pytest.raises(FormatError, match=f"{name} payload(: IVF header says 12 frames| holds 12 pictures, "
                                          f"header says 16)"):
        codec.decode(short, clip.shape)
    # Coded at another size than the header's H x W.
    with pytest.raises(FormatError, match="coded at"):
        codec.decode(payload, (16, 61, 51, 3))


def test_quality_is_checked_on_each_codecs_scale():
    with pytest.raises(ValueError, match=r"^h264 quality must be an integer in 0\.\.51, got 52$"):
        get_codec("h264", 52)
    with pytest.raises(ValueError, match=r"^vp9 quality must be an integer in 0\.\.63, got -1$"):
        get_codec("vp9", -1)
    with pytest.raises(ValueError, match="^codec raw has no quality setting"):
        get_codec("raw", 10)
    assert get_codec("jpeg", 70).quality == 70 and get_codec("h264").quality == 16


def test_bad_codec_or_quality_on_the_command_line_is_one_line_and_status_2(tmp_path):
    for args, message in ((("--codec", "h265"), "invalid choice: 'h265'"),
                          (("--codec", "h264", "--quality", "60"), "h264 quality must be an integer in 0..51"),
                          (("--codec", "lz4", "--quality", "5"), "codec lz4 has no quality setting")):
        r = run_cli(str(tmp_path), str(tmp_path / "out"), *args)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert message in lines[-1], r.stderr
        assert not (tmp_path / "out").exists()


def test_the_manifest_and_every_shard_record_the_quality(tmp_path, videos):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    os.symlink(videos.path("mmcv__test.mp4"), src / "mmcv__test.mp4")
    out = str(tmp_path / "out")
    r = run_cli(str(tmp_path / "src"), out, "--codec", "vp9", "--quality", "30", "--max-clips", "2",
                "--no-progress")
    assert r.returncode == 0, r.stderr
    manifest = read_manifest(out)
    assert manifest.data.codec == "vp9" and manifest.data.codec_id == 5 and manifest.data.quality == 30
    with open(os.path.join(out, "manifest.json")) as f:
        assert json.load(f)["quality"] == 30
    verify = run_cli("verify", out)
    assert verify.returncode == 0, verify.stdout + verify.stderr
