"""ClipPreset, CropParams, apply and to_model_input: exact pixels and values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loaders import ClipPreset, to_model_input
from loaders.presets import KINETICS_MEAN, KINETICS_STD, CropParams, apply, resize_bilinear


def _clip(shape=(16, 128, 171, 3), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def test_kinetics_statistics_in_0_255_units():
    assert KINETICS_MEAN == pytest.approx((110.2008, 100.63983, 95.99475))
    assert KINETICS_STD == pytest.approx((58.14765, 56.46975, 55.332195))
    p = ClipPreset(train=True)
    assert p.mean == KINETICS_MEAN and p.std == KINETICS_STD and p.crop_size == 112


@pytest.mark.parametrize("kw, words", [
    ({"crop_size": 0}, "crop_size"),
    ({"clip_len": 0}, "clip_len"),
    ({"multiscale": (1.2,)}, "(0, 1]"),
    ({"multiscale": ()}, "multiscale"),
    ({"mean": (1, 2)}, "3 finite"),
    ({"std": (1, 0, 1)}, "> 0"),
    ({"seed": -1}, "seed"),
    ({"flip": "yes"}, "True or False"),
])
def test_preset_validates_and_says_what_is_allowed(kw, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        ClipPreset(train=True, **kw)


def test_preset_is_keyword_only():
    with pytest.raises(TypeError):
        ClipPreset(True)


def test_eval_centre_crop_uses_torchvision_rounding():
    p = ClipPreset(train=False)
    # 128-112 = 16 -> 8; 171-112 = 59 -> round(29.5) = 30 (halves to even)
    assert p.params(0, 0, (16, 128, 171)) == CropParams(0, 8, 30, 112, 112, False, t=16)
    # slack 5 -> round(2.5) = 2, slack 3 -> round(1.5) = 2, slack 7 -> round(3.5) = 4
    a, b = p.params(0, 0, (16, 117, 115)), p.params(0, 0, (16, 119, 112))
    assert (a.y0, a.x0) == (2, 2) and (b.y0, b.x0) == (4, 0)
    # the same for every epoch and index, never flipped
    assert {p.params(e, i, (16, 128, 171)) for e in range(3) for i in range(5)} == {p.params(0, 0, (16, 128, 171))}
    clip = _clip()
    assert np.array_equal(apply(clip, p.params(0, 0, clip.shape)), clip[:, 8:120, 30:142])


def test_eval_centre_window_in_time():
    p = ClipPreset(train=False, clip_len=8)
    params = p.params(0, 0, (16, 128, 171))
    assert (params.t0, params.t) == (4, 8)  # (16-8)/2
    assert ClipPreset(train=False, clip_len=5).params(0, 0, (16, 128, 171)).t0 == 6  # round(5.5) = 6


def test_train_crops_are_keyed_by_seed_epoch_index():
    p = ClipPreset(train=True)
    shape = (16, 128, 171)
    assert p.params(3, 17, shape) == p.params(3, 17, shape)
    assert p.params(3, 17, shape) == ClipPreset(train=True).params(3, 17, shape)
    draws = {p.params(e, i, shape) for e in range(4) for i in range(25)}
    assert len(draws) > 90  # (y0, x0, flip) take 17*60*2 values: nearly all differ
    other_seed = ClipPreset(train=True, seed=1)
    assert sum(p.params(0, i, shape) == other_seed.params(0, i, shape) for i in range(50)) < 3
    for prm in draws:
        assert 0 <= prm.y0 <= 16 and 0 <= prm.x0 <= 59 and prm.h == prm.w == 112 and prm.t0 == 0
    flips = [p.params(0, i, shape).flip for i in range(400)]
    assert 150 < sum(flips) < 250
    # switching flips off leaves the crops where they were
    no_flip = ClipPreset(train=True, flip=False)
    for i in range(20):
        a, b = p.params(1, i, shape), no_flip.params(1, i, shape)
        assert (a.t0, a.y0, a.x0) == (b.t0, b.y0, b.x0) and not b.flip


def test_train_crop_cuts_the_right_pixels_and_flip_really_flips():
    clip = _clip()
    p = ClipPreset(train=True)
    seen_flip = seen_plain = False
    for i in range(12):
        prm = p.params(0, i, clip.shape)
        ref = clip[:, prm.y0:prm.y0 + 112, prm.x0:prm.x0 + 112]
        got = apply(clip, prm)
        if prm.flip:
            seen_flip = True
            assert np.array_equal(got, ref[:, :, ::-1])
            assert np.array_equal(got[:, :, 0], ref[:, :, 111])  # first column is the last one
        else:
            seen_plain = True
            assert np.array_equal(got, ref)
        assert got.dtype == np.uint8 and got.flags.c_contiguous
    assert seen_flip and seen_plain


@pytest.mark.parametrize("threads", [1, 2])
def test_flip_is_exact_on_both_code_paths(threads):
    # the flip does not depend on torch's thread count (it once chose torch.flip or numpy by it)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        clip = _clip((4, 20, 30, 3))
        got = apply(clip, CropParams(1, 2, 3, 10, 20, True, t=2))
        assert np.array_equal(got, clip[1:3, 2:12, 3:23][:, :, ::-1])
        out = np.zeros((2, 10, 20, 3), np.uint8)
        assert apply(clip, CropParams(1, 2, 3, 10, 20, True, t=2), out=out) is out
        assert np.array_equal(out, got)
    finally:
        torch.set_num_threads(old)


def test_temporal_jitter_window():
    clip = np.broadcast_to(np.arange(16, dtype=np.uint8)[:, None, None, None], (16, 128, 171, 3)).copy()
    p = ClipPreset(train=True, clip_len=8)
    starts = set()
    for i in range(200):
        prm = p.params(2, i, clip.shape)
        got = apply(clip, prm)
        assert got.shape == (8, 112, 112, 3)
        assert np.array_equal(got[:, 0, 0, 0], np.arange(prm.t0, prm.t0 + 8))  # consecutive frames
        # A codec's temporal window, cropped with first = the stored frame it starts at: the same pixels.
        assert np.array_equal(apply(clip[prm.t0:prm.t0 + 8], prm, first=prm.t0), got)
        starts.add(prm.t0)
    assert starts == set(range(9))  # every window start 0..8 occurs
    with pytest.raises(ValueError, match="longer than the stored clip"):
        ClipPreset(train=True, clip_len=20).params(0, 0, clip.shape)
    with pytest.raises(ValueError, match="holding stored frames from 3"):
        apply(clip[3:11], CropParams(2, 0, 0, 112, 112, False, t=8), first=3)


def test_multiscale_shape_scales_and_determinism():
    clip = _clip()
    scales = (1.0, 0.875, 0.75, 0.66)
    p = ClipPreset(train=True, multiscale=scales)
    sides = set()
    for i in range(60):
        prm = p.params(0, i, clip.shape)
        assert prm.h == prm.w and prm.h in {128, 112, 96, 84}  # round(128 * s)
        assert 0 <= prm.y0 <= 128 - prm.h and 0 <= prm.x0 <= 171 - prm.w
        assert prm.out_size == (None if prm.h == 112 else (112, 112))
        sides.add(prm.h)
        got = apply(clip, prm)
        assert got.shape == (16, 112, 112, 3) and got.dtype == np.uint8
        assert np.array_equal(got, apply(clip, p.params(0, i, clip.shape)))
        if prm.out_size is not None:
            src = clip[:, prm.y0:prm.y0 + prm.h, prm.x0:prm.x0 + prm.w]
            assert np.array_equal(got, resize_bilinear(src[:, :, ::-1] if prm.flip else src, (112, 112)))
    assert sides == {128, 112, 96, 84}
    # evaluation ignores multiscale: centre crop
    assert ClipPreset(train=False, multiscale=scales).params(0, 0, clip.shape).h == 112


def test_resize_bilinear_matches_torch_interpolate():
    frames = _clip((2, 40, 50, 3), seed=3)
    got = resize_bilinear(frames, (23, 31))
    ref = torch.nn.functional.interpolate(torch.from_numpy(frames).permute(0, 3, 1, 2).double(), size=(23, 31),
                                          mode="bilinear", align_corners=False, antialias=False)
    want = ref.permute(0, 2, 3, 1).round().clamp(0, 255).numpy()
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert np.mean(got == want) > 0.99
    same = resize_bilinear(frames, (40, 50))
    assert np.array_equal(same, frames)  # same size: identity


def test_crop_larger_than_frames_is_refused():
    with pytest.raises(ValueError, match="does not fit stored frames of 100x171"):
        ClipPreset(train=True).params(0, 0, (16, 100, 171))
    with pytest.raises(ValueError, match="falls outside"):
        apply(_clip((4, 20, 20, 3)), CropParams(0, 15, 0, 10, 10, False, t=4))


def test_to_model_input_values_and_shape():
    g = torch.Generator().manual_seed(0)
    clips = torch.randint(0, 256, (2, 4, 5, 6, 3), dtype=torch.uint8, generator=g)
    mean, std = (110.0, 100.0, 90.0), (58.0, 56.0, 55.0)
    x = to_model_input(clips, mean=mean, std=std)
    assert x.shape == (2, 3, 4, 5, 6) and x.dtype == torch.float32 and x.is_contiguous()
    for c in range(3):
        want = (clips[..., c].double() - mean[c]) / std[c]
        assert torch.allclose(x[:, c].double(), want, atol=1e-5)
    # one pixel by hand
    v = int(clips[1, 2, 3, 4, 1])
    assert float(x[1, 1, 2, 3, 4]) == pytest.approx((v - 100.0) / 56.0, abs=1e-5)
    y = to_model_input(clips, mean=mean, std=std, channels_last=True)
    assert torch.equal(x, y) and y.is_contiguous(memory_format=torch.channels_last_3d)
    h = to_model_input(clips, mean=mean, std=std, device="cpu", dtype=torch.float64)
    assert h.dtype == torch.float64 and torch.allclose(h.float(), x, atol=1e-5)
    assert clips.dtype == torch.uint8  # the input is left alone


def test_to_model_input_rejects_wrong_input():
    with pytest.raises(ValueError, match="uint8 tensor"):
        to_model_input(torch.zeros(1, 2, 3, 4, 3), mean=(0, 0, 0), std=(1, 1, 1))
    with pytest.raises(ValueError, match="one per channel"):
        to_model_input(torch.zeros(1, 2, 3, 4, 3, dtype=torch.uint8), mean=(0, 0), std=(1, 1))


def test_to_model_input_reuses_its_mean_std_tensors(monkeypatch):
    """The mean/std device tensors are built once per (values, device, dtype), not per batch."""
    from loaders import presets

    mean, std = (10.0, 20.0, 30.0), (2.0, 4.0, 5.0)
    clips = torch.arange(2 * 1 * 2 * 2 * 3, dtype=torch.uint8).reshape(2, 1, 2, 2, 3)
    first = to_model_input(clips, mean=mean, std=std)
    m1, s1 = presets.normalisation_tensors(mean, std, torch.device("cpu"), torch.float32)
    made = []
    real = torch.tensor

    def counted(*a, **k):
        made.append(a)
        return real(*a, **k)

    monkeypatch.setattr(presets.torch, "tensor", counted)
    second = to_model_input(clips, mean=list(mean), std=list(std))  # a list with the same values hits the cache
    m2, s2 = presets.normalisation_tensors(mean, std, torch.device("cpu"), torch.float32)
    assert made == []  # no tensor built on the second call
    assert m2 is m1 and s2 is s1
    assert m1.tolist() == list(mean) and s1.tolist() == list(std)  # not modified by the in-place normalisation
    assert torch.equal(first, second)
    expected = (clips.double() - torch.tensor(mean, dtype=torch.float64)) / torch.tensor(std, dtype=torch.float64)
    assert torch.allclose(second, expected.permute(0, 4, 1, 2, 3).float())
    # Another dtype is another entry.
    m3, _ = presets.normalisation_tensors(mean, std, torch.device("cpu"), torch.float64)
    assert m3 is not m1 and m3.dtype == torch.float64


def test_three_spatial_crops_along_the_long_side():
    """spatial_crops=3: the item's epoch picks left/centre/right (wide frames) or top/centre/bottom (tall ones)."""
    wide = ClipPreset(train=False, crop_size=32, spatial_crops=3)
    got = [wide.params(s, 7, (16, 40, 52)) for s in range(3)]
    assert [(p.y0, p.x0) for p in got] == [(4, 0), (4, 10), (4, 20)]  # centre y: round(8/2); x: 0, round(20/2), 20
    assert all((p.t0, p.t, p.h, p.w, p.flip) == (0, 16, 32, 32, False) for p in got)
    tall = [wide.params(s, 0, (16, 60, 40)) for s in range(3)]
    assert [(p.y0, p.x0) for p in tall] == [(0, 4), (14, 4), (28, 4)]
    # The centre view is the plain evaluation crop; one crop ignores the epoch, as before.
    plain = ClipPreset(train=False, crop_size=32)
    assert plain.params(5, 7, (16, 40, 52)) == got[1]
    with pytest.raises(ValueError, match="selects the crop"):
        wide.params(3, 0, (16, 40, 52))
    with pytest.raises(ValueError, match="3 and 10 for evaluation only"):
        ClipPreset(train=True, spatial_crops=3)
    # The pixels: the right view of a clip is its last 32 columns.
    clip = _clip((16, 40, 52, 3))
    assert np.array_equal(apply(clip, got[2]), clip[:, 4:36, 20:52])


def test_ten_spatial_crops_are_the_corners_and_the_centre_each_also_flipped():
    """spatial_crops=10 (TenCrop): 0-3 the corners, 4 the centre, 5-9 the same five mirrored."""
    ten = ClipPreset(train=False, crop_size=32, spatial_crops=10)
    got = [ten.params(s, 7, (16, 40, 52)) for s in range(10)]
    corners = [(0, 0), (0, 20), (8, 0), (8, 20), (4, 10)]
    assert [(p.y0, p.x0) for p in got] == corners * 2 and [p.flip for p in got] == [False] * 5 + [True] * 5
    clip = _clip((16, 40, 52, 3))
    assert np.array_equal(apply(clip, got[8]), clip[:, 8:40, 20:52][:, :, ::-1])
    with pytest.raises(ValueError, match=r"selects the crop \(0..9\)"):
        ten.params(10, 0, (16, 40, 52))
