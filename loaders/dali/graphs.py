"""How DALI decodes each kind of payload: the table from what a codec declares to a DALI graph.

A codec says what its payload is (``convert.format.codecs.Payload``: an
array or independently coded frames, and their coding); this table, on the
DALI side, says how DALI decodes such a payload, where it can (CPU, GPU), and
what it needs. The format layer knows nothing of DALI, and nothing here tests
a codec's id or class: a new codec whose payload is of a known kind is
decoded by DALI without a line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from convert.format import Codec, Payload

from .base import fn, types


def _reshape(data: Any, *, shape: Any, offsets: Any, sizes: Any, frames: int, device: str) -> Any:
    # The source route hands over whole clips; a frame window is sliced after.
    return fn.reshape(data, shape=shape, layout="FHWC")


def _inflate_frames(data: Any, *, shape: Any, offsets: Any, sizes: Any, frames: int, device: str) -> Any:
    # One block per frame: the GPU inflate decompresses a clip's frames in parallel.
    return fn.decoders.inflate(data, shape=shape[1:], chunk_offsets=offsets, chunk_sizes=sizes,
                               algorithm="LZ4", dtype=types.UINT8, layout="HWC", sequence_axis_name="F")


def _images(data: Any, *, shape: Any, offsets: Any, sizes: Any, frames: int, device: str) -> Any:
    # One decoder call per frame position; each decodes the whole batch's frames at that position
    # ("mixed": nvJPEG on the GPU, reading its input from host memory).
    where = "mixed" if device == "gpu" else "cpu"
    decoded = []
    for k in range(frames):
        one = fn.slice(data, offsets[k:k + 1], sizes[k:k + 1], axes=[0])
        decoded.append(fn.decoders.image(one, device=where, output_type=types.RGB))
    return fn.stack(*decoded, axis_name="F")


@dataclass(frozen=True, kw_only=True)
class Graph:
    """How DALI decodes one kind of payload.

    ``decode(data, shape=, offsets=, sizes=, frames=, device=)``: 1-D uint8
    ``data`` (on ``device``, "cpu" or "gpu") -> uint8 (F, H, W, C), layout
    FHWC; ``shape`` the stored (T, H, W, C), ``offsets``/``sizes`` the parts of
    the ``frames`` frames wanted. ``cpu``: DALI's CPU backend has this decoder
    (else it needs the GPU). ``in_dali``: the source route hands DALI the
    payload to decode (False: the payload is the pixels, and handing over its
    decoded window costs nothing). ``host_input``: the decoder reads its input
    from host memory even on the GPU. ``needs_shape``: it needs the stored
    shape (a JPEG carries its own).
    """

    decode: Callable[..., Any]
    cpu: bool
    in_dali: bool = True
    host_input: bool = False
    needs_shape: bool = True


GRAPHS: dict[tuple[str, str], Graph] = {
    ("array", "none"): Graph(decode=_reshape, cpu=True, in_dali=False),
    ("frames", "lz4-block"): Graph(decode=_inflate_frames, cpu=False),
    ("frames", "jpeg"): Graph(decode=_images, cpu=True, host_input=True, needs_shape=False),
}


def graph_for(codec: Codec) -> Graph:
    """The graph that decodes ``codec``'s payloads; ValueError naming the payload DALI has none for."""
    payload: Payload = codec.payload
    graph = GRAPHS.get((payload.layout, payload.coding))
    if graph is None:
        raise ValueError(f"DALI has no decoder for {codec.name} payloads ({payload.layout} of {payload.coding})")
    return graph


def cpu_codecs() -> list[str]:
    """Names of the codecs a conversion can be written with that DALI decodes on its CPU backend."""
    from convert.format import WRITE_CODECS

    return [name for name, cls in WRITE_CODECS.items() if graph_for(cls()).cpu]


__all__ = ["GRAPHS", "Graph", "cpu_codecs", "graph_for"]
