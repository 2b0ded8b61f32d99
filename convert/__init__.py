"""Decode a video dataset once into fixed-length uint8 clip shards (``python -m convert``)."""

from .clips import ClipSpec
from .decode import FrameSpec, VideoDecoder, VideoError, decode_all
from .plan import ConvertConfig

__all__ = ["ClipSpec", "ConvertConfig", "FrameSpec", "VideoDecoder", "VideoError", "decode_all"]
