"""The versions pyproject.toml declares have the APIs the trainer and the DALI loader call.

The floors are checked against what is installed here (the versions the tests
ran with): the installed torch and DALI must satisfy them, and the calls whose
availability set them must work in the installed versions, with the shapes the
code uses.
"""

from __future__ import annotations

import inspect
import os
import re
from importlib.metadata import version

import numpy as np
import pytest
import tomllib
import torch
from packaging.requirements import Requirement
from packaging.version import Version

from .conftest import ROOT


def _requirements() -> dict[str, Requirement]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        project = tomllib.load(fh)["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return {r.name: r for r in reqs}


def _floor(req: Requirement) -> Version:
    (spec,) = [s for s in req.specifier if s.operator == ">="]
    return Version(spec.version)


def test_torch_floor_has_the_apis_the_trainer_uses():
    req = _requirements()["torch"]
    assert _floor(req) == Version("2.4")  # is_autocast_enabled(device_type) arrived in 2.4
    installed = Version(torch.__version__.split("+")[0])
    assert installed in req.specifier
    # torch.amp.GradScaler(device, ...) (train/main.py): the device is the first parameter.
    params = list(inspect.signature(torch.amp.GradScaler.__init__).parameters)
    assert params[:2] == ["self", "device"]
    scaler = torch.amp.GradScaler("cpu", enabled=False, init_scale=2.0 ** 16, growth_interval=2000)
    assert not scaler.is_enabled()
    # init_process_group(device_id=torch.device) (train/dist.py).
    sig = inspect.signature(torch.distributed.init_process_group)
    assert "device_id" in sig.parameters
    # torch.is_autocast_enabled("cpu") (train/models/layers.py).
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("cpu") is True
    assert torch.is_autocast_enabled("cpu") is False


def test_dali_extras_pin_a_checked_version_for_each_cuda_major():
    reqs = _requirements()
    # dali: the CUDA 12 build the project was specified with; dali-cu13: the CUDA 13 build, one CUDA major
    # with torch 2.13.0 from PyPI. Both at the same checked floor.
    assert reqs["nvidia-dali-cuda130"].specifier == reqs["nvidia-dali-cuda120"].specifier
    assert _floor(reqs["nvidia-dali-cuda130"]) == Version("2.4")


class _Source:
    """Six outputs per sample, as loaders.dali.stream._ClipSource returns them (decoded in the source)."""

    in_dali = False

    def __call__(self, info) -> tuple[np.ndarray, ...]:
        i = int(info.idx_in_epoch)
        clip = np.full((4, 6, 8, 3), i % 256, dtype=np.uint8)
        return (clip, np.array([0, 1, 2], np.int32), np.array([2, 4, 4], np.int32), np.array(i % 2, np.int32),
                np.array(i % 5, np.int64), np.array(i, np.int64))


def test_dali_pipeline_accepts_run_with_a_stream_argument():
    """loaders.dali builds its pipeline with the dynamic executor, whose run(stream) the loader calls."""
    pytest.importorskip("nvidia.dali")
    import nvidia.dali.fn as fn
    from nvidia.dali.pipeline import Pipeline

    from convert.format.codecs import RawCodec
    from loaders.dali.graphs import graph_for
    from loaders.dali.source import _build_pipeline
    from loaders.presets import ClipPreset

    assert Version(version("nvidia-dali-cuda120")) in _requirements()["nvidia-dali-cuda120"].specifier
    preset = ClipPreset(train=True, crop_size=4)
    pipe = _build_pipeline(_Source(), graph=graph_for(RawCodec()), frames=2, batch_size=3, device_id=None, workers=0,
                           prefetch=2, start_method="fork", preset=preset, normalize=False, hint=1 << 20)
    try:
        assert pipe.exec_dynamic is True
        # DaliClipLoader._run_pipe's call: the stream positionally (None on the CPU backend).
        params = list(inspect.signature(Pipeline.run).parameters)
        assert params[:2] == ["self", "cuda_stream"]
        clips, labels, index = pipe.run(None)
        assert np.array(index.as_tensor()).reshape(-1).tolist() == [0, 1, 2]
        got = np.array(clips.as_tensor())
        assert got.shape == (3, 2, 4, 4, 3)
        assert got[:, 0, 0, 0, 0].tolist() == [0, 1, 2]
    finally:
        del pipe
    # What the floor guards against: the legacy executor refuses an output stream.
    legacy = Pipeline(batch_size=1, num_threads=1, device_id=None, exec_dynamic=False)
    with legacy:
        # fn's operators are made at import from DALI's registry; its stub file lists only some (not constant)
        legacy.set_outputs(fn.constant(idata=[1]))  # type: ignore[attr-defined]
    legacy.build()
    with pytest.raises(RuntimeError, match=re.escape("legacy execution model")):
        legacy.run(0)
