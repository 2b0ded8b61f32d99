"""How DALI decodes each kind of payload: the table from what a codec declares to a DALI graph.

A codec says what its payload is (``convert.format.payload.Payload``: an
array, independently coded frames or one video stream, and their coding);
this table, on the DALI side, says how DALI decodes such a payload, where it
can (CPU, GPU), what happens without a GPU, and what it needs. The format
layer knows nothing of DALI, and nothing here tests a codec's id or class: a
new codec whose payload is of a known kind is decoded by DALI without a line
here.
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
    # ("mixed": nvJPEG on the GPU, reading its input from host memory). Each decodes the region of the clip's
    # (H, W) only: a JPEG coded larger than its header says (which the loaders then refuse, from its own header)
    # never gets an output buffer of its own size.
    where = "mixed" if device == "gpu" else "cpu"
    decoded = []
    for k in range(frames):
        one = fn.slice(data, offsets[k:k + 1], sizes[k:k + 1], axes=[0])
        decoded.append(fn.decoders.image_slice(one, start=[0, 0], shape=shape[1:3], axes=[0, 1],
                                               normalized_anchor=False, normalized_shape=False, device=where,
                                               output_type=types.RGB))
    return fn.stack(*decoded, axis_name="F")


def _image_sizes(data: Any, *, offsets: Any, sizes: Any, frames: int) -> Any:
    # Each frame's (H, W, C) as its JPEG header says, nothing decoded (CPU): what the native route's loader holds
    # against the clip header, since no Python sees those payloads before DALI decodes them.
    return fn.stack(*[fn.peek_image_shape(fn.slice(data, offsets[k:k + 1], sizes[k:k + 1], axes=[0]),
                                          dtype=types.INT32) for k in range(frames)])


def _video(data: Any, *, shape: Any, offsets: Any, sizes: Any, frames: int, device: str) -> Any:
    # A closed GOP decodes from its start, so every frame is decoded and the window cut after (by the caller).
    # "mixed": NVDEC on the GPU, reading the stream from host memory.
    decoded = fn.decoders.video(data, device="mixed" if device == "gpu" else "cpu")
    # Frames of odd size are coded padded to even: cropped back to the stored (H, W) here, before any crop whose
    # anchors are relative to the stored size (the native route's) sees them.
    return fn.slice(decoded, start=[0, 0], shape=shape[1:3], axis_names="HW", out_of_bounds_policy="error")


@dataclass(frozen=True, kw_only=True)
class Graph:
    """How DALI decodes one kind of payload.

    ``decode(data, shape=, offsets=, sizes=, frames=, device=)``: 1-D uint8
    ``data`` (on ``device``, "cpu" or "gpu") -> uint8 (F, H, W, C), layout
    FHWC; ``shape`` the stored (T, H, W, C) as int32, ``offsets``/``sizes``
    the parts of the ``frames`` frames wanted (a stream payload is one part and
    decodes to all T frames; the caller cuts the window). ``cpu``: DALI's CPU
    backend has this decoder (else it needs the GPU). ``cpu_fallback``: where
    ``cpu`` is False, the source route decodes the payload in Python on the CPU
    instead; ``gpu_only`` (set where ``cpu_fallback`` is False): why such
    payloads need a GPU under DALI, which the loaders' refusal without one
    says (``refuse_without_gpu``). ``in_dali``: the source route hands DALI the
    payload to decode (False: the payload is the pixels, and handing over its
    decoded window costs nothing). ``host_input``: the decoder reads its input
    from host memory even on the GPU. ``needs_shape``: it needs the stored
    shape (the JPEG decoder too, though a JPEG carries its own: it decodes the
    clip's region only). ``needs_parts``: it needs ``offsets`` and
    ``sizes`` (a stream is decoded whole: None are passed). ``checkpoints``:
    DALI can checkpoint a pipeline holding this decoder (False: the native
    route builds its pipelines without checkpoints, and a resume reads up to
    its position). ``picture_sizes(data, offsets=, sizes=, frames=)``: each
    frame's (H, W, C) as the payload's own picture headers say, read on the
    CPU without decoding, for the native route's loader to check against the
    clip header (None: the decoder's output is sized by the header's shape,
    or by the stream's own headers). ``stream_sized``: the decoder sizes its
    pictures by the stream's own headers, which no DALI operator reads
    first, so the native route hands each payload through the codec's
    ``check_framing`` (Python, nothing decoded) before the decoder gets it.
    """

    decode: Callable[..., Any]
    cpu: bool
    cpu_fallback: bool = True
    gpu_only: str = ""
    in_dali: bool = True
    host_input: bool = False
    needs_shape: bool = True
    needs_parts: bool = True
    checkpoints: bool = True
    picture_sizes: Callable[..., Any] | None = None
    stream_sized: bool = False

    def __post_init__(self) -> None:
        if self.cpu and not self.cpu_fallback:
            raise ValueError("a graph with a CPU decoder needs no CPU fallback: cpu_fallback=False needs cpu=False")
        if self.cpu_fallback == bool(self.gpu_only):
            raise ValueError("gpu_only says why a graph without a CPU fallback needs a GPU, and only then")


GRAPHS: dict[tuple[str, str], Graph] = {
    ("array", "none"): Graph(decode=_reshape, cpu=True, in_dali=False),
    ("frames", "lz4-block"): Graph(decode=_inflate_frames, cpu=False),
    ("frames", "jpeg"): Graph(decode=_images, cpu=True, host_input=True, picture_sizes=_image_sizes),
    # DALI 2.4's video decoder implements no checkpointing (a pipeline holding it refuses to build with it).
    ("stream", "vp9"): Graph(decode=_video, cpu=True, host_input=True, needs_parts=False, checkpoints=False,
                             stream_sized=True),
    # DALI's CPU video decoder has no H.264 (removed from DALI); decoding it in the Python source instead would
    # make the GPU loader a slower copy of the reader threads, which decode it on the CPU already.
    ("stream", "h264"): Graph(decode=_video, cpu=False, host_input=True, needs_parts=False, checkpoints=False,
                              cpu_fallback=False, stream_sized=True,
                              gpu_only="DALI decodes H.264 with NVDEC on a GPU only; its CPU backend has no "
                                       "H.264 decoder"),
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


def refuse_without_gpu(root: str, codec: Codec, device_id: int | None) -> None:
    """A loader's check when it is made: a one-line ValueError naming ``root`` when ``device_id`` is None and
    ``codec``'s payloads need a GPU under DALI with no CPU fallback (``Graph.gpu_only``)."""
    graph = graph_for(codec)
    if device_id is None and not graph.cpu_fallback:
        *most, last = cpu_codecs()
        on_cpu = f"{', '.join(most)} and {last}" if most else last
        # Said for a user of the trainer as much as of the API: no API words.
        raise ValueError(f"{root}: {codec.name} clips need a GPU under DALI ({graph.gpu_only}), and there is none "
                         f"for it here; without one, DALI reads {on_cpu} conversions, and --loader threads reads "
                         f"this one on the CPU")


__all__ = ["GRAPHS", "Graph", "cpu_codecs", "graph_for", "refuse_without_gpu"]
