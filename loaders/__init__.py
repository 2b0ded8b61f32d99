"""Readers of converted clip shards, and the training-side pieces around them.

``open_clips`` is the plain reader; ``ClipDataset`` (``LmdbClipDataset``) +
``DistributedClipSampler`` + ``build_loader`` feed training; ``ClipPreset`` /
``to_model_input`` define what the model sees; ``OnTheFlyVideoDataset`` is the
decode-per-item baseline.

Names are imported on first use, so ``from loaders import open_clips`` pulls
in neither torch nor PyAV (a shard reader needs numpy and the backend's
library only).
"""

from __future__ import annotations

from convert.system import lazy_exports

_LAZY = {
    "ClipBatch": "dataset", "ClipDataset": "dataset", "LmdbClipDataset": "dataset", "collate": "dataset",
    "ClipSample": "clipstore", "ClipStore": "clipstore", "DatasetError": "clipstore", "open_clips": "clipstore",
    "build_loader": "factory", "default_threads": "factory", "loader_meter": "factory", "OnTheFlyVideoDataset": "onthefly",
    "LoaderTimeout": "threaded", "ThreadedClipLoader": "threaded",
    "ClipPreset": "presets", "CropParams": "presets", "to_model_input": "presets",
    "DistributedClipSampler": "sampler",
}

__all__ = sorted(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
