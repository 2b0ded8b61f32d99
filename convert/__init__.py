"""Decode a video dataset once into fixed-length uint8 clip shards (``python -m convert``).

Names are imported on first use: ``convert.format`` (what readers import)
must not pull in PyAV, which ``convert.decode`` needs.
"""

from __future__ import annotations

from .format.system import lazy_exports

_LAZY = {"ClipSpec": "clips", "ConvertConfig": "plan", "FrameSpec": "decode", "VideoDecoder": "decode",
         "VideoError": "decode", "decode_all": "decode"}

__all__ = sorted(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
