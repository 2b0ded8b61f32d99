"""Readers of converted clip shards, and the training-side pieces around them.

``open_clips`` is the plain reader; ``LmdbClipDataset`` + ``DistributedClipSampler``
+ ``build_loader`` feed training; ``ClipPreset`` / ``to_model_input`` define
what the model sees; ``OnTheFlyVideoDataset`` is the decode-per-item baseline.
"""

from .clipstore import ClipSample, ClipStore, DatasetError, open_clips
from .dataset import LmdbClipDataset, collate
from .factory import build_loader
from .onthefly import OnTheFlyVideoDataset
from .presets import ClipPreset, CropParams, to_model_input
from .sampler import DistributedClipSampler

__all__ = [
    "ClipPreset",
    "ClipSample",
    "ClipStore",
    "CropParams",
    "DatasetError",
    "DistributedClipSampler",
    "LmdbClipDataset",
    "OnTheFlyVideoDataset",
    "build_loader",
    "collate",
    "open_clips",
    "to_model_input",
]
