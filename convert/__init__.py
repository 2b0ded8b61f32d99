"""Decode a video dataset once into fixed-length uint8 clip shards (``python -m convert``).

Names are imported on first use: ``convert.format`` (what readers import)
must not pull in PyAV, which ``convert.worker.decode`` needs.
"""

from __future__ import annotations

from .format.system import lazy_exports

_LAZY = {"ClipSpec": "convert.worker.clips", "ConvertConfig": "convert.worker.plan",
         "FrameSpec": "convert.worker.decode", "VideoDecoder": "convert.worker.decode",
         "VideoError": "convert.worker.decode", "decode_all": "convert.worker.decode"}

__all__ = sorted(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
