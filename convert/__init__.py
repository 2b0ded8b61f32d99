"""Decode a video dataset once into fixed-length uint8 clip shards (``python -m convert``).

Names are imported on first use: ``convert.format`` (what readers import)
must not pull in PyAV, which ``convert.decode`` needs.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"ClipSpec": "clips", "ConvertConfig": "plan", "FrameSpec": "decode", "VideoDecoder": "decode",
         "VideoError": "decode", "decode_all": "decode"}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'convert' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
