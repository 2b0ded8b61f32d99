"""Decode a video dataset once into fixed-length uint8 clip shards (``python -m convert``).

Names are imported on first use: ``convert.format`` (what readers import)
must not pull in PyAV, which ``convert.worker.decode`` needs. Importing the
package imports nothing at all: ``python -m convert`` runs it before its
``__main__`` can take stop signals (``convert.signals``), and
``convert.format`` imports numpy.
"""

from __future__ import annotations

from typing import Any

_LAZY = {"ClipSpec": "convert.worker.clips", "ConvertConfig": "convert.worker.plan",
         "FrameSpec": "convert.worker.decode", "VideoDecoder": "convert.worker.decode",
         "VideoError": "convert.worker.decode", "decode_all": "convert.worker.decode"}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    from .format.system import lazy_exports  # here, not above: see the module's docstring

    return lazy_exports(__name__, _LAZY)(name)
