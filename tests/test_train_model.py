"""C3D: the paper's parameter counts and shapes, options, fine-tuning loads."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from train.models import count_parameters, load_for_finetuning, scaled
from train.models.c3d import C3D, CLASSIFIER_PREFIX, feature_shape


@pytest.mark.parametrize("classes, expected", [(101, 78_409_573), (400, 79_634_576), (487, 79_991_015)])
def test_full_size_parameter_counts(classes, expected):
    with torch.device("meta"):  # no memory, no init cost
        model = C3D(classes)
    assert count_parameters(model) == expected
    assert model.fc6.in_features == 8192
    assert model.fc6.out_features == model.fc7.out_features == 4096


def test_full_size_output_shape_for_16x112x112():
    model = C3D(101).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 16, 112, 112))
    assert out.shape == (1, 101)
    assert feature_shape(16, 112) == (1, 4, 4)


def test_reduced_width_shape_and_count():
    model = C3D(7, width=0.25).eval()
    convs = [m for m in model.modules() if isinstance(m, nn.Conv3d)]
    assert [c.out_channels for c in convs] == [16, 32, 64, 64, 128, 128, 128, 128]
    assert model.fc6.in_features == 128 * 16 and model.fc6.out_features == scaled(4096, 0.25) == 1024
    with torch.no_grad():
        assert model(torch.randn(3, 3, 16, 112, 112)).shape == (3, 7)
    # Analytic count: convs (27 * in * out + out) + three linear layers.
    chans = [3, 16, 32, 64, 64, 128, 128, 128, 128]
    conv = sum(27 * a * b + b for a, b in zip(chans, chans[1:]))
    fc = (2048 * 1024 + 1024) + (1024 * 1024 + 1024) + (1024 * 7 + 7)
    assert count_parameters(model) == conv + fc


def test_small_input_and_too_small_input():
    model = C3D(5, width=0.0625, crop_size=32)
    assert feature_shape(16, 32) == (1, 2, 2)
    assert model(torch.randn(2, 3, 16, 32, 32)).shape == (2, 5)
    with pytest.raises(ValueError, match="at least 16 frames"):
        C3D(5, clip_len=8)


def test_batchnorm_option():
    model = C3D(5, width=0.125, bn=True, crop_size=32)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm3d)]
    convs = [m for m in model.modules() if isinstance(m, nn.Conv3d)]
    assert len(bns) == 8 and all(c.bias is None for c in convs)
    assert not any(isinstance(m, nn.BatchNorm3d) for m in C3D(5, width=0.125, crop_size=32).modules())


def test_finetune_load_reinitialises_classifier_only():
    torch.manual_seed(0)
    src = C3D(10, width=0.0625, crop_size=32)
    state = {"module." + k: v for k, v in src.state_dict().items()}  # as saved from a DDP wrapper
    torch.manual_seed(1)
    dst = C3D(3, width=0.0625, crop_size=32)
    left = load_for_finetuning(dst, state, classifier=CLASSIFIER_PREFIX)
    assert left == ["fc8.bias", "fc8.weight"]
    assert torch.equal(dst.get_parameter("features.conv1.weight"), src.get_parameter("features.conv1.weight"))
    assert torch.equal(dst.fc7.weight, src.fc7.weight)
    assert dst.fc8.weight.shape == (3, dst.fc7.out_features)
    same = C3D(10, width=0.0625, crop_size=32)
    assert load_for_finetuning(same, state, classifier=CLASSIFIER_PREFIX) == []
    assert torch.equal(same.fc8.weight, src.fc8.weight)
    wider = C3D(3, width=0.125, crop_size=32)
    with pytest.raises(ValueError, match="does not fit"):
        load_for_finetuning(wider, state, classifier=CLASSIFIER_PREFIX)


def test_bf16_autocast_gradients_match_float32_on_cpu(one_thread):
    """Guards the Conv3d work-around for the CPU bf16 weight-gradient bug at 2-frame inputs.

    bf16 rounding through eight layers on random data leaves 10-25% relative
    error in the early layers' gradients (PyTorch's non-oneDNN bf16 path gives
    the same); the bug gives NaN or values around 1e30.
    """
    torch.manual_seed(0)
    model = C3D(5, width=0.125, crop_size=64, dropout=0.0)
    x = torch.randn(4, 3, 16, 64, 64)
    y = torch.arange(4)
    grads: dict[bool, dict[str, torch.Tensor]] = {}
    for amp in (False, True):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = model(x)
        nn.functional.cross_entropy(out.float(), y).backward()
        grads[amp] = {}
        for n, p in model.named_parameters():
            assert p.grad is not None
            grads[amp][n] = p.grad.clone()
    for name, ref in grads[False].items():
        err = float((grads[True][name] - ref).norm() / ref.norm().clamp_min(1e-12))
        assert err < 0.5, (name, err)


def test_bf16_autocast_on_cpu_learns_a_fixed_batch(one_thread):
    torch.manual_seed(0)
    model = C3D(4, width=0.0625, crop_size=32, dropout=0.0)
    x = torch.randn(8, 3, 16, 32, 32)
    y = torch.arange(8) % 4
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(20):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        assert out.dtype == torch.bfloat16
        loss = nn.functional.cross_entropy(out.float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
