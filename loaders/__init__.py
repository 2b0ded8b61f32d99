"""Readers of converted clip shards, and the training-side pieces around them.

``open_clips`` is the plain reader (``convert.store``, beside the format layer);
``ClipDataset`` + ``DistributedClipSampler`` + ``build_loader`` feed
training (reader threads or DataLoader workers); ``SampleSpec`` says which
frames of a video a sample is, chosen at read time; ``ClipPreset`` /
``to_model_input`` define what the model sees; ``loaders.dali`` holds the
NVIDIA DALI pipelines.

Names are imported on first use, so ``from loaders import open_clips`` pulls
in neither torch nor PyAV (a shard reader needs numpy and the backend's
library only). ``loaders`` imports nothing of ``convert`` but its format
layer, ``convert.format``, and shard access, ``convert.store``.
"""

from __future__ import annotations

from convert.format.system import lazy_exports

_LAZY = {
    "ClipBatch": "dataset", "ClipDataset": "dataset", "collate": "dataset",
    "ClipDataLoader": "factory", "build_loader": "factory", "default_threads": "factory", "loader_meter": "factory",
    "LoaderTimeout": "threaded", "ThreadedClipLoader": "threaded",
    "ClipPreset": "presets", "CropParams": "presets", "to_model_input": "presets",
    "DistributedClipSampler": "sampler", "VideoEpochSampler": "sampler",
    "SampleSpec": "sampling", "VideoSamples": "sampling",
    # The plain reader (shard access) and the error type (the format layer) live below both sides.
    "ClipSample": "convert.store.store", "ClipStore": "convert.store.store", "open_clips": "convert.store.store",
    "FormatError": "convert.format.errors",
}

__all__ = sorted(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
