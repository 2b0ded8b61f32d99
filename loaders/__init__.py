"""Readers of converted clip shards."""

from .clipstore import ClipSample, ClipStore, DatasetError, open_clips

__all__ = ["ClipSample", "ClipStore", "DatasetError", "open_clips"]
