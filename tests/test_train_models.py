"""The model registry: every entry's architecture, counts and FLOPs, the CPU bf16 guard, inflation from 2-D
weights, and the trainer's --model / --inflate-from end to end on the tiny dataset.

Networks are built on the meta device for counts, shapes and FLOPs (no memory, no init), and at widths of
1/16 to 1/8 on 32x32 crops where they run, so the whole module stays cheap on two cores.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from train import TrainError
from train import checkpoint as ckpt_io
from train.config import TrainConfig
from train.evalcmd import main as eval_main
from train.main import main, run_argv
from train.models import (
    MODELS,
    build_model,
    count_parameters,
    flops_per_clip,
    inflate_kernel,
    inflated_state,
    load_for_finetuning,
    model_spec,
)
from train.models.i3d import INFLATE
from train.models.layers import Conv3d

from .train_fixtures import (  # noqa: F401
    CPU,
    assert_states_equal,
    common,
    cpu_config,
    final_state,
    one_line_error,
    tiny_data,
)

# torchvision's and mmaction2's published parameter counts at 400 classes.
PARAMS_400 = {"c3d": 79_634_576, "r3d_18": 33_371_472, "mc3_18": 11_695_440, "r2plus1d_18": 31_505_325,
              "i3d_r50": 28_043_472}
NEW = [name for name in MODELS if name != "c3d"]  # the entries C3D's own tests do not cover
TINY = {"width": 0.0625}


def _tiny(name: str, classes: int = 5, **opts) -> Any:
    """Any: the tests reach into the network's submodules by name (``model.layer2[0].conv1``), a lookup
    ``nn.Module.__getattr__`` types as ``Tensor | Module``."""
    return build_model(name, num_classes=classes, clip_len=16, crop_size=32, **{**TINY, **opts})


# -- the registry ----------------------------------------------------------------------------------------------

def test_the_registry_holds_the_entries_with_their_published_counts():
    assert list(MODELS) == ["c3d", "r3d_18", "mc3_18", "r2plus1d_18", "i3d_r50"]
    for name, spec in MODELS.items():
        assert spec.name == name and spec.params_400 == PARAMS_400[name]
        assert spec.classifier.endswith(".") and spec.features and set(spec.options) >= {"width"}
    assert [n for n, s in MODELS.items() if s.inflatable] == ["i3d_r50"]
    assert MODELS["c3d"].features == ("fc6", "fc7") and MODELS["r3d_18"].features == ("pool",)
    with pytest.raises(ValueError, match=r"^unknown model 'x3d' \(choose from c3d, r3d_18, mc3_18, r2plus1d_18, "
                                         r"i3d_r50\)$"):
        model_spec("x3d")
    with pytest.raises(ValueError, match="integer >= 1"):
        dataclasses.replace(MODELS["c3d"], min_clip_len=0)


@pytest.mark.parametrize("name", list(MODELS))
def test_parameter_count_and_flops_per_clip_are_the_measured_ones(name):
    spec = MODELS[name]
    with torch.device("meta"):  # no memory, no init
        model = build_model(name, num_classes=400, clip_len=spec.clip_len, crop_size=spec.crop_size)
        x = torch.empty(1, 3, spec.clip_len, spec.crop_size, spec.crop_size)
    assert count_parameters(model) == spec.params_400 == PARAMS_400[name]
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(x)
    assert out.shape == (1, 400)
    assert counter.get_total_flops() == spec.flops


def test_torchvision_flops_match_its_published_gflops():
    # torchvision's model cards give GFLOPS as multiply-adds at 16x112x112: 40.70, 43.34, 40.52.
    for name, gmacs in (("r3d_18", 40.70), ("mc3_18", 43.34), ("r2plus1d_18", 40.52)):
        assert MODELS[name].flops / 2e9 == pytest.approx(gmacs, abs=0.005)


# -- torchvision's architectures and names --------------------------------------------------------------------

def _shapes(name: str) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = build_model(name, num_classes=400, clip_len=16, crop_size=112)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_r3d_18_has_torchvisions_names_and_shapes():
    shapes = _shapes("r3d_18")
    assert len(shapes) == 122  # stem 6, 8 blocks x 12, 3 shortcuts x 6, fc 2
    assert shapes["stem.0.weight"] == (64, 3, 3, 7, 7) and shapes["stem.1.running_var"] == (64,)
    assert shapes["layer1.0.conv1.0.weight"] == (64, 64, 3, 3, 3) and shapes["layer1.1.conv2.1.bias"] == (64,)
    assert shapes["layer2.0.conv1.0.weight"] == (128, 64, 3, 3, 3)
    assert shapes["layer2.0.downsample.0.weight"] == (128, 64, 1, 1, 1)
    assert shapes["layer4.1.conv2.0.weight"] == (512, 512, 3, 3, 3)
    assert shapes["fc.weight"] == (400, 512) and shapes["fc.bias"] == (400,)
    assert "layer1.0.downsample.0.weight" not in shapes


def test_mc3_18_mixes_3d_and_spatial_convolutions():
    shapes = _shapes("mc3_18")
    assert shapes["stem.0.weight"] == (64, 3, 3, 7, 7)
    assert shapes["layer1.1.conv2.0.weight"] == (64, 64, 3, 3, 3)
    for stage, c in ((2, 128), (3, 256), (4, 512)):
        assert shapes[f"layer{stage}.0.conv1.0.weight"] == (c, c // 2, 1, 3, 3)
        assert shapes[f"layer{stage}.1.conv2.0.weight"] == (c, c, 1, 3, 3)
    model = _tiny("mc3_18")
    # No temporal stride after the first stage, on the shortcut either.
    assert model.layer2[0].conv1[0].stride == (1, 2, 2) and model.layer2[0].downsample[0].stride == (1, 2, 2)
    assert _tiny("r3d_18").layer2[0].downsample[0].stride == (2, 2, 2)
    assert _tiny("mc3_18")(torch.randn(2, 3, 8, 32, 32)).shape == (2, 5)


def test_r2plus1d_18_factors_each_convolution_with_torchvisions_middle_width():
    shapes = _shapes("r2plus1d_18")
    assert shapes["stem.0.weight"] == (45, 3, 1, 7, 7) and shapes["stem.1.weight"] == (45,)
    assert shapes["stem.3.weight"] == (64, 45, 3, 1, 1) and shapes["stem.4.weight"] == (64,)
    # mid = in * out * 27 // (9 * in + 3 * out), from the block's input and output, used by both convolutions.
    assert shapes["layer1.0.conv1.0.0.weight"] == (144, 64, 1, 3, 3) and shapes["layer1.0.conv1.0.1.weight"] == (144,)
    assert shapes["layer1.0.conv1.0.3.weight"] == (64, 144, 3, 1, 1) and shapes["layer1.0.conv1.1.weight"] == (64,)
    assert shapes["layer2.0.conv1.0.0.weight"] == (230, 64, 1, 3, 3)
    assert shapes["layer2.0.conv2.0.0.weight"] == (230, 128, 1, 3, 3)
    assert shapes["layer2.1.conv1.0.0.weight"] == (288, 128, 1, 3, 3)
    assert shapes["layer2.0.downsample.0.weight"] == (128, 64, 1, 1, 1)
    model = _tiny("r2plus1d_18")
    assert model.layer3[0].conv1[0][3].stride == (2, 1, 1) and model.layer3[0].downsample[0].stride == (2, 2, 2)


def _torchvision_video():
    """torchvision.models.video, or None where it does not import (its CUDA wheels against a CPU torch fail
    with a RuntimeError, not an ImportError)."""
    try:
        from torchvision.models import video
    except (ImportError, RuntimeError, OSError):
        return None
    return video


@pytest.mark.parametrize("name", ["r3d_18", "mc3_18", "r2plus1d_18"])
def test_state_dicts_and_outputs_are_torchvisions_where_it_imports(name):
    video = _torchvision_video()
    if video is None:
        pytest.skip("torchvision does not import here (CUDA wheels against a CPU torch)")
    torch.manual_seed(0)
    theirs = getattr(video, name)(num_classes=7).eval()
    ours = build_model(name, num_classes=7, clip_len=8, crop_size=32).eval()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 3, 8, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x))


# -- I3D-R50 -------------------------------------------------------------------------------------------------

def test_i3d_r50_is_mmaction2s_layout():
    shapes = _shapes("i3d_r50")
    assert shapes["conv1.weight"] == (64, 3, 5, 7, 7) and shapes["bn1.weight"] == (64,)
    for stage, pattern in enumerate(INFLATE, start=1):
        for block, inflated in enumerate(pattern):
            depth = shapes[f"layer{stage}.{block}.conv1.weight"][2]
            assert depth == (3 if inflated else 1), (stage, block)
            assert shapes[f"layer{stage}.{block}.conv2.weight"][2:] == (1, 3, 3)
    assert shapes["layer1.0.downsample.0.weight"] == (256, 64, 1, 1, 1)
    assert shapes["layer4.0.downsample.0.weight"] == (2048, 1024, 1, 1, 1) and shapes["fc.weight"] == (400, 2048)
    with torch.device("meta"):
        model: Any = build_model("i3d_r50", num_classes=400, clip_len=64, crop_size=224)  # submodules by name
        # The workload the project was specified with: 64 frames of 224x224 leave 8 x 7 x 7 at the last stage.
        assert model.trunk(torch.empty(1, 3, 64, 224, 224)).shape == (1, 2048, 8, 7, 7)
    assert model.conv1.stride == (2, 2, 2) and model.maxpool.stride == (2, 2, 2) and model.pool2.stride == (2, 1, 1)
    assert model.layer2[0].conv2.stride == (1, 2, 2) and model.layer2[0].downsample[0].stride == (1, 2, 2)
    assert model.dropout.p == 0.5


def test_smallest_inputs_are_accepted_and_smaller_ones_refused_in_one_line():
    for name, spec in MODELS.items():
        model = build_model(name, num_classes=3, clip_len=spec.min_clip_len, crop_size=max(spec.min_crop, 16),
                            width=0.0625)
        assert model(torch.randn(2, 3, spec.min_clip_len, max(spec.min_crop, 16), max(spec.min_crop, 16))).shape \
            == (2, 3), name
    with pytest.raises(ValueError, match=r"^I3D-R50 needs at least 5 frames and 1x1 pixels; got 4x32x32$"):
        build_model("i3d_r50", num_classes=3, clip_len=4, crop_size=32)
    with pytest.raises(ValueError, match=r"^C3D needs at least 16 frames and 16x16 pixels; got 16x8x8$"):
        build_model("c3d", num_classes=3, clip_len=16, crop_size=8)
    i3d = build_model("i3d_r50", num_classes=3, clip_len=5, crop_size=16, width=0.0625)
    with pytest.raises(RuntimeError):  # the torch error the registry's minimum stands in front of
        i3d(torch.randn(2, 3, 4, 16, 16))


def test_build_model_refuses_what_an_entry_does_not_take():
    with pytest.raises(ValueError, match=r"^r3d_18 takes no option bn \(its options: width, dropout\)$"):
        build_model("r3d_18", num_classes=3, clip_len=16, crop_size=32, bn=True)
    with pytest.raises(ValueError, match=r"^mc3_18 is not inflated from 2-D weights \(that is i3d_r50\)$"):
        build_model("mc3_18", num_classes=3, clip_len=16, crop_size=32, inflate_from={})


# -- every entry: shapes, features, width, finetuning ---------------------------------------------------------

@pytest.mark.parametrize("name", NEW)
def test_tiny_models_run_and_return_their_features(name):
    torch.manual_seed(0)
    model = _tiny(name, classes=7).eval()
    x = torch.randn(3, 3, 16, 32, 32)
    with torch.no_grad():
        feats, logits = model.features_and_logits(x)
        assert torch.equal(model(x), logits)
    assert logits.shape == (3, 7) and list(feats) == list(MODELS[name].features)
    width = 2048 if name == "i3d_r50" else 512
    assert feats["pool"].shape == (3, round(width * 0.0625))
    torch.testing.assert_close(model.fc(feats["pool"]), logits)


@pytest.mark.parametrize("name", NEW)
def test_finetuning_reinitialises_the_classifier_only(name):
    spec = MODELS[name]
    torch.manual_seed(0)
    src = _tiny(name, classes=10)
    state = {"module." + k: v for k, v in src.state_dict().items()}  # as saved from a DDP wrapper
    dst = _tiny(name, classes=3)
    assert load_for_finetuning(dst, state, classifier=spec.classifier) == ["fc.bias", "fc.weight"]
    own = dst.state_dict()
    assert all(torch.equal(own[k], v) for k, v in src.state_dict().items() if not k.startswith("fc."))
    assert dst.fc.weight.shape == (3, dst.fc.in_features) and float(dst.fc.bias.detach().abs().max()) == 0.0
    with pytest.raises(ValueError, match="does not fit"):
        load_for_finetuning(_tiny(name, classes=3, width=0.125), state, classifier=spec.classifier)


# -- the CPU bf16 guard ----------------------------------------------------------------------------------------

def test_the_bf16_guard_covers_the_layers_onednn_gets_wrong():
    """The rule: a temporal kernel deeper than its input, with an output at least 2 frames deep."""
    c3d_conv = Conv3d(4, 4, kernel_size=3, padding=1)
    assert [d for d in range(1, 9) if c3d_conv._bf16_wrong(d)] == [2]  # C3D's rule before the registry
    stem = Conv3d(3, 4, kernel_size=(5, 7, 7), stride=(2, 2, 2), padding=(2, 3, 3))  # I3D's conv1
    assert [d for d in range(1, 9) if stem._bf16_wrong(d)] == [3, 4]
    strided = Conv3d(4, 4, kernel_size=3, stride=2, padding=1)  # out 1 frame at depth 2: right in bf16
    assert not any(strided._bf16_wrong(d) for d in range(1, 9))
    spatial = Conv3d(4, 4, kernel_size=(1, 3, 3), padding=(0, 1, 1))
    assert not any(spatial._bf16_wrong(d) for d in range(1, 9))


@pytest.mark.parametrize("name", NEW)
def test_bf16_weight_gradients_of_every_convolution_match_float32_on_cpu(one_thread, name):
    """At 16 frames the ResNets' last stage and I3D's stages 2-4 hold convolutions 3 frames deep over 2-frame
    inputs, where oneDNN's bf16 weight gradient is NaN or inf without the guard. Each convolution's bf16 weight
    gradient, on the input it sees in the network, is within bf16 rounding of float32's; and a whole training
    step's gradients are finite. (Through a whole network of BatchNorms at these widths and a batch of 4, bf16
    rounding alone moves some gradients by their own size, so the layers are compared one by one.)"""
    torch.manual_seed(0)
    model = build_model(name, num_classes=5, clip_len=16, crop_size=32, width=0.125, dropout=0.0)
    convs = {n: m for n, m in model.named_modules() if isinstance(m, nn.Conv3d)}
    seen: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda m, args, key=n: seen.__setitem__(key, args[0].detach()))
             for n, m in convs.items()]
    x = torch.randn(4, 3, 16, 32, 32)
    model(x)
    for h in hooks:
        h.remove()
    ours = {n: m for n, m in convs.items() if isinstance(m, Conv3d)}
    assert ours.keys() == convs.keys()  # every 3-D convolution is the project's, the one with the bf16 guard
    guarded = [n for n, m in ours.items() if m._bf16_wrong(seen[n].shape[2])]
    assert bool(guarded) == (name != "mc3_18"), guarded  # mc3_18's 3-D convolutions all see 16 frames
    for key, conv in convs.items():
        inp = seen[key]
        upstream = torch.randn_like(conv(inp))
        ref = torch.autograd.grad(conv(inp), conv.weight, upstream)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = conv(inp)
        got = torch.autograd.grad(out.float(), conv.weight, upstream)[0]
        err = float((got - ref).norm() / ref.norm())
        assert err < 0.05, (key, err)
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    nn.functional.cross_entropy(out.float(), torch.arange(4)).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# -- inflation from 2-D weights --------------------------------------------------------------------------------

class _Bottleneck2d(nn.Module):
    def __init__(self, c_in: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.downsample = None
        if stride != 1 or c_in != planes * 4:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, planes * 4, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes * 4))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + identity)


class _ResNet50_2d(nn.Module):
    """A 2-D ResNet-50 (v1.5: stride on the 3x3) with torchvision's parameter names, at a width: the 2-D network
    the test inflates from and compares with."""

    layer1: nn.Sequential  # set by name in __init__
    layer2: nn.Sequential
    layer3: nn.Sequential
    layer4: nn.Sequential

    def __init__(self, classes: int, width: float) -> None:
        super().__init__()
        stem = round(64 * width)
        self.conv1 = nn.Conv2d(3, stem, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        c_in = stem
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
            p = round(planes * width)
            layer = []
            for j in range(blocks):
                layer.append(_Bottleneck2d(c_in, p, 2 if i > 0 and j == 0 else 1))
                c_in = p * 4
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
        self.fc = nn.Linear(c_in, classes)

    def stem(self, x):
        return self.layer1(self.maxpool(F.relu(self.bn1(self.conv1(x)))))

    def rest(self, x):
        return self.layer4(self.layer3(self.layer2(x)))

    def forward(self, x):
        return self.fc(self.rest(self.stem(x)).mean(dim=(2, 3)))


def _random_2d(width: float = 0.0625, classes: int = 1000, seed: int = 0) -> _ResNet50_2d:
    """A 2-D network with random BatchNorm statistics and affines, so copying them matters."""
    torch.manual_seed(seed)
    net = _ResNet50_2d(classes, width)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert m.running_mean is not None and m.running_var is not None  # track_running_stats is on
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.normal_(0, 0.1)
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return net.eval()


class _ReplicateTime(nn.Module):
    """A convolution whose temporal padding replicates the edge frames (its spatial padding stays zeros)."""

    def __init__(self, conv: nn.Conv3d) -> None:
        super().__init__()
        assert isinstance(conv.padding, tuple)  # numbers, not "same"/"valid"
        self.pad = conv.padding[0]
        conv.padding = (0, *conv.padding[1:])
        self.conv = conv

    def forward(self, x):
        return self.conv(F.pad(x, (0, 0, 0, 0, self.pad, self.pad), mode="replicate"))


def _replicate_temporal_padding(model: nn.Module) -> None:
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.Conv3d) and isinstance(child.padding, tuple) and child.padding[0] > 0:
                setattr(parent, child_name, _ReplicateTime(child))


def test_each_inflated_kernel_sums_over_time_to_its_2d_kernel():
    net2d = _random_2d()
    model = _tiny("i3d_r50")
    state = inflated_state(model, net2d.state_dict(), classifier="fc.")
    two = net2d.state_dict()
    convs = [k for k, v in state.items() if v.dim() == 5]
    assert len(convs) == 53  # every convolution of ResNet-50
    for key in convs:
        torch.testing.assert_close(state[key].sum(dim=2), two[key])
        assert torch.equal(state[key][:, :, 0], state[key][:, :, -1])  # the same at every tap
    assert all(torch.equal(state[k], two[k]) for k in state if state[k].dim() != 5)  # BatchNorm copied
    assert not any(k.startswith("fc.") for k in state)
    centre = inflate_kernel(two["conv1.weight"], 5, centre=True)
    assert torch.equal(centre[:, :, 2], two["conv1.weight"]) and float(centre[:, :, [0, 1, 3, 4]].abs().max()) == 0


def test_a_temporally_constant_clip_gives_the_2d_networks_logits():
    net2d = _random_2d(classes=5)
    model: Any = build_model("i3d_r50", num_classes=5, clip_len=16, crop_size=32, width=0.0625,  # .fc by name
                        inflate_from=net2d.state_dict())
    model.fc.load_state_dict(net2d.fc.state_dict())  # the classifier is not inflated: the test gives it
    _replicate_temporal_padding(model)
    model.eval()
    frame = torch.randn(2, 3, 32, 32)
    clip = frame[:, :, None].expand(2, 3, 16, 32, 32).contiguous()
    with torch.no_grad():
        torch.testing.assert_close(model(clip), net2d(frame), rtol=1e-4, atol=1e-5)


def test_with_all_weight_on_the_centre_tap_each_output_frame_is_the_2d_network_on_its_frame():
    """Output frame t of the trunk sees input frames 8t and 8t + 4 only: conv1 and the first max-pool keep every
    4th frame, the 2x1x1 pool after layer1 takes the larger of two such frames, the rest is frame-wise."""
    net2d = _random_2d()
    model = _tiny("i3d_r50")
    model.load_state_dict(inflated_state(model, net2d.state_dict(), classifier="fc.", centre=True), strict=False)
    model.eval()
    clip = torch.randn(2, 3, 16, 32, 32)
    with torch.no_grad():
        out = model.trunk(clip)
        assert out.shape[2] == 2
        for t in range(2):
            first = torch.maximum(net2d.stem(clip[:, :, 8 * t]), net2d.stem(clip[:, :, 8 * t + 4]))
            torch.testing.assert_close(out[:, :, t], net2d.rest(first), rtol=1e-4, atol=1e-5)


def test_weights_that_do_not_inflate_are_refused_in_one_line_naming_the_key():
    model = _tiny("i3d_r50")
    good = _random_2d().state_dict()
    cases = [({k: v for k, v in good.items() if k != "layer3.2.bn2.running_var"},
              r"^the 2-D weights lack layer3\.2\.bn2\.running_var: not a 2-D network"),
             ({**good, "layer5.0.conv1.weight": torch.zeros(1, 1, 1, 1)},
              r"^the 2-D weights hold layer5\.0\.conv1\.weight, which the 3-D network has not"),
             ({**good, "layer2.1.conv2.weight": torch.zeros(8, 8, 3, 3, 1)},
              r"^layer2\.1\.conv2\.weight: the 2-D weights' \(8, 8, 3, 3, 1\) does not inflate to \(8, 8, 1, 3, 3\)$"),
             ({**good, "bn1.weight": torch.ones(3)},
              r"^bn1\.weight: the 2-D weights' \(3,\) does not inflate to \(4,\)$")]
    for state, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            inflated_state(model, state, classifier="fc.")
        assert "\n" not in str(err.value)
    # A wider 2-D network: every mismatch is one of shape; the first is named.
    with pytest.raises(ValueError, match=r"^conv1\.weight: the 2-D weights' \(8, 3, 7, 7\) does not inflate"):
        inflated_state(model, _random_2d(width=0.125).state_dict(), classifier="fc.")


class _RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # what unpickling would do if it executed the file


def test_inflate_from_trains_and_bad_files_are_refused_in_one_line(tiny_data, tmp_path, capsys):
    weights = tmp_path / "r50_2d.pt"
    torch.save(_random_2d().state_dict(), weights)
    args = common(tiny_data, tmp_path / "run") + ["--model", "i3d_r50", "--epochs", "1", "--max-steps", "1",
                                                  "--batch-size", "4", "--lr", "0"]
    s = run_argv(args + ["--inflate-from", str(weights)])
    assert "inflated from the 2-D weights" in capsys.readouterr().out and s["step"] == 1
    saved = final_state(tmp_path / "run")
    expected = inflated_state(_tiny("i3d_r50"), torch.load(weights, weights_only=True), classifier="fc.")
    # lr 0: the trained weights are the inflated ones (BatchNorm's running statistics moved in the step).
    assert all(torch.equal(saved["model"][k], v) for k, v in expected.items() if "running" not in k
               and "num_batches" not in k)
    assert saved["config"]["inflate_from"] == str(weights) and saved["config"]["model"] == "i3d_r50"

    marker = tmp_path / "executed"
    hostile = tmp_path / "hostile.pt"
    with open(hostile, "wb") as f:
        pickle.dump({"conv1.weight": _RunsCode(str(marker))}, f, protocol=2)
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint\n")
    listed = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], listed)
    short = tmp_path / "short.pt"
    torch.save({k: v for k, v in _random_2d().state_dict().items() if k != "layer1.0.conv2.weight"}, short)
    for path, message in ((hostile, f"holds the Python object {open.__module__}.open, which loading with "
                                    "weights_only=True refuses"),
                          (text, "is not a torch.save file of tensors: loading with weights_only=True refuses it"),
                          (listed, "holds a list, not a state dict of tensors"),
                          (short, "the 2-D weights lack layer1.0.conv2.weight"),
                          (tmp_path / "none.pt", "no such file")):
        assert main(args + ["--overwrite", "--inflate-from", str(path)]) == 2
        err = one_line_error(capsys)
        assert err.startswith(f"--inflate-from {path}: ") and message in err, err
    assert not marker.exists()


# -- the trainer: --model end to end ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--model", "x3d"], "argument --model: invalid choice: 'x3d' (choose from 'c3d', 'r3d_18', 'mc3_18', "
                         "'r2plus1d_18', 'i3d_r50')"),
    (["--model", "i3d_r50", "--clip-len", "4"], "--clip-len 4 --crop-size 224 --downsample 1: I3D-R50 needs at "
                                                "least 5 frames and 1x1 pixels; got 4x224x224"),
    (["--crop-size", "12"], "--crop-size 12 --downsample 1: C3D needs at least 16 frames and 16x16 pixels; got "
                            "12x12 pixels"),
    (["--crop-size", "32", "--downsample", "4"], "--crop-size 32 --downsample 4: C3D needs at least 16 frames and "
                                                 "16x16 pixels; got 8x8 pixels"),
    (["--model", "i3d_r50", "--inflate-from", "w.pt", "--finetune", "c.pt"],
     "argument --finetune: not allowed with argument --inflate-from"),
])
def test_model_usage_errors_are_one_line_before_any_data_is_read(tmp_path, capsys, argv, message):
    # --data names no folder: every one of these is refused before it would be read.
    assert main(["--data", str(tmp_path / "absent"), "--device", "cpu", *argv]) == 2
    assert message in one_line_error(capsys)


@pytest.mark.parametrize("argv, message", [
    (["--model", "r3d_18", "--bn"], "--bn: r3d_18 has BatchNorm after every convolution already"),
    (["--model", "r3d_18", "--inflate-from", "{w}"], "--inflate-from: r3d_18 is not inflated from 2-D weights "
                                                     "(i3d_r50 is)"),
    (["--crop-scales", "1,0.8x"], "--crop-scales 1,0.8x: expected fractions of the short side in (0, 1]"),
    (["--crop-scales", "1.5"], "--crop-scales 1.5: expected fractions of the short side in (0, 1]"),
    (["--clip-len", "8"], "--clip-len 8 --crop-size 32 --downsample 1: C3D needs at least 16 frames and 16x16 "
                          "pixels; got 8x32x32"),
    # A resumed run compares with its checkpoint first; without one, building the model refuses it.
    (["--model", "i3d_r50", "--clip-len", "4", "--resume"], "--clip-len 4 --crop-size 32 --downsample 1: I3D-R50 "
                                                            "needs at least 5 frames and 1x1 pixels; got 4x32x32"),
])
def test_model_settings_that_do_not_go_together_are_one_line(tiny_data, tmp_path, capsys, argv, message):
    (tmp_path / "w.pt").write_bytes(b"")
    argv = [a.format(w=tmp_path / "w.pt") for a in argv]
    assert main(common(tiny_data, tmp_path / "run") + ["--batch-size", "8", *argv]) == 2
    assert message in one_line_error(capsys)


def test_model_defaults_follow_the_model(tiny_data, tmp_path):
    c3d = cpu_config(common(tiny_data, tmp_path) + ["--batch-size", "8"])
    assert (c3d.model, c3d.dropout, c3d.crop_size) == ("c3d", 0.5, 32)
    r3d = cpu_config(common(tiny_data, tmp_path) + ["--batch-size", "8", "--model", "r3d_18"])
    assert (r3d.model, r3d.dropout) == ("r3d_18", 0.0)
    assert cpu_config(common(tiny_data, tmp_path) + ["--batch-size", "8", "--model", "i3d_r50"]).dropout == 0.5
    assert cpu_config(common(tiny_data, tmp_path) + ["--batch-size", "8", "--model", "r3d_18", "--dropout",
                                                     "0.2"]).dropout == 0.2
    # Not given, the crop is the model's: 112 for c3d, 224 for i3d_r50 (larger than the 40x52 frames here: refused
    # naming it).
    argv = [a for a in common(tiny_data, tmp_path) if a not in ("--crop-size", "32")] + ["--batch-size", "8"]
    with pytest.raises(TrainError, match="--crop-size 112 does not fit"):
        cpu_config(argv)
    with pytest.raises(TrainError, match="--crop-size 224 does not fit"):
        cpu_config(argv + ["--model", "i3d_r50"])


@pytest.mark.parametrize("name", NEW)
def test_eval_rebuilds_the_model_from_the_checkpoint_alone_and_exports_its_features(name, tiny_data, tmp_path,
                                                                                   capsys):
    s = run_argv(common(tiny_data, tmp_path / "run") + ["--model", name, "--epochs", "1", "--max-steps", "2",
                                                       "--batch-size", "8", "--val-data", tiny_data])
    ckpt = ckpt_io.latest_path(str(tmp_path / "run"))
    npz = tmp_path / "feats.npz"
    assert eval_main(["--checkpoint", ckpt, "--data", tiny_data, "--export", str(npz), "--workers", "0",
                      "--device", "cpu", "--threads", "1", "--batch-size", "7", "--no-progress",
                      "--eval-protocol", "10x3"]) == 0
    text = capsys.readouterr().out
    assert f"{name} width 0.0625 on 5 classes" in text
    report = json.load(open(tmp_path / "run" / "eval" / "clips_train_10x3_step2.json"))
    assert report["clips"] == 120 and report["videos"] == 20  # 2 stored clips x 3 crops per video
    got = np.load(npz)
    width = 2048 if name == "i3d_r50" else 512
    assert sorted(got.files) == ["classes", "labels", "pool", "probs", "protocol", "video_ids", "views"]
    assert got["pool"].shape == (20, width // 16) and got["views"].tolist() == [6] * 20
    assert s["eval"]["clips"] == 40  # the trainer's own evaluation (clips protocol)


def test_resuming_with_another_model_is_refused_and_old_checkpoints_are_c3ds(tiny_data, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--epochs", "1", "--max-steps", "1", "--batch-size", "8"]
    run_argv(common(tiny_data, out) + args)
    capsys.readouterr()
    assert main(common(tiny_data, out) + ["--epochs", "1", "--max-steps", "2", "--batch-size", "8", "--resume",
                                          "--model", "r3d_18"]) == 2
    assert "was saved with --model c3d (this run: r3d_18)" in one_line_error(capsys)
    # A checkpoint written before --model: its config lacks model and inflate_from, and it is C3D's.
    path = ckpt_io.latest_path(str(out))
    old = ckpt_io.load(path)
    for key in ("model", "inflate_from"):
        del old["config"][key]
    assert TrainConfig.from_dict(old["config"]).model == "c3d"
    os.unlink(path)  # a hard link to the step file: write a new file instead of through it
    for _, step_file in ckpt_io.step_files(str(out)):
        os.unlink(step_file)
    ckpt_io.save_atomic(old, path)
    assert eval_main(["--checkpoint", path, "--data", tiny_data, "--workers", "0", "--device", "cpu", "--threads",
                      "1", "--no-progress"]) == 0
    s = run_argv(common(tiny_data, out) + ["--epochs", "1", "--max-steps", "2", "--batch-size", "8", "--resume"])
    assert s["step"] == 2 and s["config"]["model"] == "c3d"


# -- parametrised over the registry: exact resume, accumulation, the batch-size probe ---------------------------

@pytest.mark.parametrize("name", NEW)
def test_resume_is_bit_identical(name, tiny_data, tmp_path):
    """4 steps straight against 2, a stop, and 2 more: the same weights, BatchNorm statistics and optimizer state."""
    args = ["--model", name, "--epochs", "1", "--batch-size", "8", "--optimizer", "adamw", "--lr", "1e-3",
            "--dropout", "0.5"]  # dropout on: its RNG must be restored too
    run_argv(common(tiny_data, tmp_path / "a") + args + ["--max-steps", "4"])
    run_argv(common(tiny_data, tmp_path / "b") + args + ["--max-steps", "2"])
    run_argv(common(tiny_data, tmp_path / "b") + args + ["--max-steps", "4", "--resume"])
    sa, sb = final_state(tmp_path / "a"), final_state(tmp_path / "b")
    assert sa["step"] == sb["step"] == 4
    assert_states_equal(sa["model"], sb["model"])
    for pa, pb in zip(sa["optimizer"]["state"].values(), sb["optimizer"]["state"].values()):
        assert_states_equal(pa, pb)


@pytest.mark.parametrize("name", NEW)
def test_accumulation_equals_two_half_batches_of_ranks(name, tiny_data, tmp_path, one_thread):
    """With BatchNorm in every model, 2 micro-batches of 4 are not one batch of 8 (the batch statistics
    differ); they are what two ranks of 4 compute. Here the weights after accumulation are those of the
    mean of the two half-batch gradients, computed by hand from the same start (on one thread, as the run: other
    kernels round otherwise, and a max-pool near tie can then route a gradient elsewhere)."""
    from train.data import build_train_data
    from train.dist import DistInfo
    from train.engine import model_input

    args = ["--model", name, "--epochs", "1", "--max-steps", "1", "--batch-size", "8", "--optimizer", "sgd",
            "--lr", "0.05", "--no-lr-scaling", "--momentum", "0", "--weight-decay", "0", "--dropout", "0"]
    argv = common(tiny_data, tmp_path / "acc") + args + ["--accum-steps", "2"]
    run_argv(argv)
    after = final_state(tmp_path / "acc")["model"]
    cfg = cpu_config(argv)
    data = build_train_data(cfg, DistInfo(0, 1, 0, CPU, None))
    data.set_epoch(0)
    batch = next(iter(data))
    data.close()
    torch.manual_seed(cfg.seed)
    model = build_model(name, num_classes=5, clip_len=16, crop_size=32, width=0.0625, dropout=0.0)
    start = {k: v.clone() for k, v in model.named_parameters()}
    for j in range(2):  # micro-batch j: clips j, j + 2, ... (as rank j of two would hold them)
        x = model_input(batch["clip"][j::2], data.mean, data.std, CPU, False)
        loss = nn.functional.cross_entropy(model(x), batch["label"][j::2]) / 2
        loss.backward()
    for k, p in model.named_parameters():
        assert p.grad is not None
        torch.testing.assert_close(after[k], start[k] - 0.05 * p.grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", NEW)
def test_the_batch_size_probe_runs_every_model(name):
    from train.autobatch import find_batch_size

    class Memory:  # a 1 GiB GPU whose trial steps peak at 100 MiB + 10 MiB per clip
        @staticmethod
        def total(device):
            return 2**30

        @staticmethod
        def reset(device):
            pass

        @staticmethod
        def peak(device):
            return 100 * 2**20 + 10 * 2**20 * seen[-1]

        @staticmethod
        def release():
            pass

    seen: list[int] = []
    model = _tiny(name)
    model.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    batch, details = find_batch_size(model, shape=(8, 32, 32), num_classes=5, device=torch.device("cpu"),
                                     amp_dtype=None, channels_last=False, headroom=0.5, accum_steps=2,
                                     memory=Memory)
    # (512 MiB - 100 MiB) / 10 MiB per clip = 41 clips per micro-batch, times 2 accumulation steps.
    assert details["micro_batch"] == 41 and batch == 82


DDP_ARGS = ["--epochs", "2", "--optimizer", "sgd", "--lr", "0.05", "--no-lr-scaling", "--dropout", "0",
            "--eval-every", "0"]


@pytest.fixture(scope="module")
def ddp_runs(tiny_data, tmp_path_factory):  # noqa: F811
    """torchrun x2 (gloo) at batch 20 each, for every model of NEW in one launch (``tests.ddp_runs``: one set of
    interpreters for all of them); (the launch's CompletedProcess, each model's --out)."""
    import subprocess
    import sys

    from .train_fixtures import ROOT, subprocess_env

    base = tmp_path_factory.mktemp("ddp_models")
    outs = {name: base / name for name in NEW}
    argvs = [[*common(tiny_data, out), "--model", name, *DDP_ARGS, "--batch-size", "20"] for name, out in outs.items()]
    env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "tests.ddp_runs", json.dumps(argvs)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120 * len(NEW)), outs


@pytest.mark.parametrize("name", NEW)
def test_ddp_two_processes_match_one_process_with_double_batch(name, tiny_data, tmp_path, ddp_runs):
    """torchrun x2 (gloo) at batch 20 each == one process at batch 40 in 2 micro-batches: bit-identical
    parameters after 2 steps (2 epochs of 1 step), as tests/test_train_run.py checks for C3D.

    The parameters only: BatchNorm's running statistics are rank 0's in the DDP run (DDP broadcasts rank 0's
    buffers before each forward), where the one process updated them with both micro-batches in turn. The
    gradients use each micro-batch's own batch statistics on both sides, as each rank's.
    """
    proc, outs = ddp_runs
    run_argv(common(tiny_data, tmp_path / "single") + ["--model", name, *DDP_ARGS, "--batch-size", "40",
                                                       "--accum-steps", "2"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    single, ddp = final_state(tmp_path / "single"), final_state(outs[name])
    assert ddp["config"]["world_size"] == 2 and ddp["step"] == single["step"] == 2
    params = [k for k, _ in _tiny(name).named_parameters()]
    assert_states_equal({k: single["model"][k] for k in params}, {k: ddp["model"][k] for k in params})


def test_the_i3d_workload_end_to_end_at_reduced_size(tiny_data, tmp_path, capsys):
    """The workload the project was specified with, scaled down: a conversion by short side with a compact codec
    (JPEG), then I3D-R50 inflated from 2-D ResNet-50 weights, bf16 autocast, gradient accumulation, the lr scaled
    linearly to the global batch, and the 10x3 evaluation. Full size: --short-side 256 --clip-len 64, --crop-size
    224, 8 GPUs (docs/training.md)."""
    from convert.synth import synthetic_conversions
    from convert.worker.plan import ConvertConfig
    from loaders import open_clips
    from loaders.presets import KINETICS_MEAN
    from train.data import make_preset
    from train.models import IMAGENET_MEAN, IMAGENET_STD

    clips = synthetic_conversions(os.path.dirname(tiny_data), {
        "i3d": ConvertConfig(size=None, short_side=36, clip_len=24, codec="jpeg", max_clips=2)},
        per_class=4, seconds=2.0, seed=7, videos="videos/train", workers=2)["i3d"]
    weights = tmp_path / "r50.pt"
    torch.save(_random_2d().state_dict(), weights)
    argv = common(clips, tmp_path / "run") + [
        "--model", "i3d_r50", "--inflate-from", str(weights), "--crop-size", "32", "--clip-len", "24",
        "--batch-size", "8", "--accum-steps", "2", "--amp", "bf16", "--lr", "0.01", "--lr-ref-batch", "4",
        "--epochs", "1", "--max-steps", "3", "--val-data", clips, "--eval-protocol", "10x3",
        "--crop-scales", "1,0.875,0.75,0.66"]
    s = run_argv(argv)
    text = capsys.readouterr().out
    assert "inflated from the 2-D weights" in text and "i3d_r50 width 0.0625" in text and "(accum 2)" in text
    assert "lr 0.02 = --lr 0.01 x 8/4 (linear scaling to the global batch 8)" in text
    assert s["step"] == 3 and s["nonfinite_steps"] == 0 and np.isfinite(s["final_loss"])
    assert s["eval"]["protocol"]["name"] == "10x3" and s["eval"]["videos"] == 20
    assert s["eval"]["clips"] == 3 * sum(open_clips(clips).video_clips)  # every stored clip x 3 crops
    cfg = TrainConfig.from_dict(final_state(tmp_path / "run")["config"])
    assert (cfg.model, cfg.clip_len, cfg.amp, cfg.accum_steps, cfg.dropout) == ("i3d_r50", 24, "bf16", 2, 0.5)
    assert (cfg.crop_size, cfg.inflate_from) == (32, str(weights))
    # Normalised as the ImageNet weights were trained (the ResNets and C3D: Kinetics' statistics).
    assert make_preset(cfg, train=True).mean == IMAGENET_MEAN and make_preset(cfg, train=False).std == IMAGENET_STD
    # mmaction2's multi-scale crop in training; evaluation keeps its fixed crops.
    assert make_preset(cfg, train=True).multiscale == (1.0, 0.875, 0.75, 0.66)
    assert make_preset(cfg, train=False).multiscale is None
    assert make_preset(dataclasses.replace(cfg, model="r3d_18", inflate_from=None), train=True).mean == KINETICS_MEAN


def test_the_models_benchmark_prints_every_model_side_by_side(capsys):
    from benchmarks.models import main as bench_main

    assert bench_main(["--width", "0.0625", "--crop", "32", "--batch", "1", "--steps", "1", "--warmup", "0"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "model" not in line]
    assert [row.split("|")[1].strip() for row in rows] == list(MODELS)
    for row in rows:
        name = row.split("|")[1].strip()
        flops = flops_per_clip(name, clip_len=16, crop_size=32, width=0.0625)
        assert row.split("|")[3].strip() == f"{flops / 1e9:.4g}" and flops < MODELS[name].flops / 100, row
        spec = MODELS[name]
        assert flops_per_clip(name, clip_len=spec.clip_len, crop_size=spec.crop_size) == spec.flops
        assert float(row.split("|")[5]) > 0  # clips/s
    with pytest.raises(SystemExit):
        bench_main(["--models", "x3d"])


def test_the_log_gives_the_training_flops_counted_for_the_model_and_mfu_only_with_a_known_peak(tiny_data, tmp_path):
    from train.gpustats import PEAKS, peak_flops
    from train.metrics import read_metrics

    out = tmp_path / "run"
    s = run_argv(common(tiny_data, out) + ["--model", "r3d_18", "--epochs", "1", "--max-steps", "4",
                                           "--batch-size", "8", "--log-every", "2"])
    step = 3 * flops_per_clip("r3d_18", num_classes=5, clip_len=16, crop_size=32, width=0.0625)
    rows = [r for r in read_metrics(str(out / "metrics.jsonl")) if r["kind"] == "train"]
    assert rows and all(r["tflops"] == pytest.approx(r["clips_per_s"] * step / 1e12) for r in rows)
    assert all("mfu" not in r for r in rows) and "mfu" not in s  # the CPU: no peak to divide by
    assert s["tflops"] == pytest.approx(float(np.median([r["tflops"] for r in rows])))
    assert peak_flops(torch.device("cpu")) is None and PEAKS["H200"] == 989e12


def test_a_bare_state_dict_with_torchvisions_names_finetunes_through_the_trainer(tiny_data, tmp_path, capsys):
    # What a user's local torchvision checkpoint is: a bare state dict of 400 classes, torchvision's key names.
    torch.manual_seed(3)
    source: Any = build_model("r3d_18", num_classes=400, clip_len=16, crop_size=32, width=0.0625)  # .fc by name
    path = tmp_path / "r3d_18_kinetics.pth"
    torch.save(source.state_dict(), path)
    run_argv(common(tiny_data, tmp_path / "ft") + ["--model", "r3d_18", "--epochs", "1", "--max-steps", "1",
                                                   "--batch-size", "8", "--lr", "0", "--finetune", str(path)])
    assert "newly initialised: fc.bias, fc.weight" in capsys.readouterr().out
    got = final_state(tmp_path / "ft")["model"]
    assert got["fc.weight"].shape == (5, source.fc.in_features)
    for key in ("stem.0.weight", "layer2.0.conv1.0.weight", "layer4.1.conv2.0.weight", "layer3.0.downsample.0.weight"):
        assert torch.equal(got[key], source.state_dict()[key]), key
