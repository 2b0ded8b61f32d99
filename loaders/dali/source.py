"""``DaliClipLoader``: a conversion's clips through an NVIDIA DALI pipeline, in the sampler's order.

The source route, for any backend (LMDB has no DALI reader). A picklable
``_ClipSource`` (``loaders.dali.stream``) feeds ``fn.external_source`` one
sample at a time (in DALI's Python worker processes when ``workers > 0``).
For each sample it returns the stored payload of the crop's temporal window
plus the crop the ``ClipPreset`` draws for (seed, epoch, index), so the DALI
path and ``ClipDataset`` cut the same pixels from the same clips in the same
order (``DistributedClipSampler``'s).

The payload's own DALI graph decodes (``loaders.dali.graphs``, chosen from
what the codec declares its payload is): LZ4 is inflated on the GPU, frame by
frame; JPEG by the image decoder (nvJPEG on the GPU, libjpeg-turbo in CPU
mode); h264 and vp9 by the video decoder (NVDEC on the GPU, FFmpeg's VP9
decoder in CPU mode), the whole clip cropped back to the stored size and the
window's frames sliced after; raw payloads are copied up as they are. The square crop
(``fn.slice``), flip (``fn.flip``) and multi-scale resize (``fn.resize``)
follow on the same device. With ``device_id=None`` the graph runs on DALI's
CPU backend; where a payload has no CPU decoder in DALI (inflate), it is
decoded in the source, except h264 (no CPU H.264 decoder in DALI), which the
loader refuses without a GPU (``Graph.gpu_only``).

Exactness: in CPU mode every path is bit-identical to the ``ClipDataset``
path except the multi-scale resize, which DALI computes with its own
arithmetic and rounding (within a grey level or two of
``presets.resize_bilinear``); vp9 included, whose RGB conversion is the one
FORMAT.md fixes. On the GPU, nvJPEG's pixels differ from libjpeg-turbo's by a
grey level or two, and NVDEC's colour conversion from libswscale's
(``scripts/device_check.py`` measures by how much).

The pipeline reads one endless sample stream (no DALI epochs): the epoch it
was built for, from the position it was built for, then whole epochs after
it. The usual loop (``set_epoch(e)``; iterate the whole epoch; ``set_epoch(e + 1)``)
just keeps reading, with prefetching running across the epoch boundary; a
jump elsewhere (resume, an abandoned epoch) builds a fresh pipeline.

``python scripts/dali_check.py`` checks both routes against the plain
readers on a machine with a GPU.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from convert.format import FormatError
from convert.format.system import cpu_count
from convert.store.cache import CacheSettings

from ..prefetch import PrefetchPlan
from ..presets import ClipPreset
from ..sampling import SampleSpec
from .base import DaliLoaderBase, Pipeline, check_gpu, check_int, fn, pipeline_options, run_pipeline, to_torch, types
from .graphs import Graph, graph_for, refuse_without_gpu
from .stream import _ClipSource, _FrameSource, _Order, _Stream

START_METHODS = ("fork", "spawn")


class SampleSource(Protocol):
    """What ``_build_pipeline`` feeds ``fn.external_source`` with: ``_ClipSource``, or a test's stand-in."""

    in_dali: bool  # outputs the stored payload for the graph to decode, not the decoded window

    def __call__(self, info: Any) -> tuple[np.ndarray, ...]: ...


def _build_pipeline(source: SampleSource, *, graph: Graph, frames: int, batch_size: int, device_id: int | None,
                    workers: int, prefetch: int, start_method: str, preset: ClipPreset, normalize: bool,
                    hint: int) -> Pipeline:
    """The graph: source -> (codec's decode) -> slice -> flip -> (resize) -> (normalize); outputs clip, label, index."""
    check_gpu(device_id)
    threads = max(1, min(4, cpu_count()))
    pipe = Pipeline(batch_size=batch_size, num_threads=threads, device_id=device_id, seed=0,
                    prefetch_queue_depth=prefetch, py_num_workers=max(1, workers), py_start_method=start_method,
                    **pipeline_options())
    parallel = workers > 0
    extra = {"prefetch_queue_depth": prefetch, "bytes_per_sample_hint": hint} if parallel else {}
    with pipe:
        dtypes = [types.UINT8, types.INT32, types.INT32, types.INT32, types.INT64, types.INT64]
        ndims = [1 if source.in_dali else 4, 1, 1, 0, 0, 0]
        if source.in_dali:
            extra_outputs = int(graph.needs_shape) + 2 * int(graph.needs_parts)
            # int32: DALI's int arguments (inflate's shape and chunk offsets/sizes) refuse int64.
            dtypes, ndims = dtypes + [types.INT32] * extra_outputs, ndims + [1] * extra_outputs
        data, anchor, size, flip, label, index, *parts = fn.external_source(
            source=source, num_outputs=len(dtypes), batch=False, parallel=parallel, dtype=dtypes, ndim=ndims,
            layout=["" if source.in_dali else "FHWC"], **extra)
        clips = data
        if device_id is not None:
            label = label.gpu()
            if not source.in_dali:
                clips = clips.gpu()
        if source.in_dali:
            shape = parts.pop(0) if graph.needs_shape else None
            offsets, sizes = parts if graph.needs_parts else (None, None)
            where = "gpu" if device_id is not None else "cpu"
            # The image decoder reads from the CPU ("mixed" puts its output on the GPU); inflate reads GPU memory.
            if where == "gpu" and not graph.host_input:
                clips = clips.gpu()
            clips = graph.decode(clips, shape=shape, offsets=offsets, sizes=sizes, frames=frames, device=where)
        clips = fn.slice(clips, anchor, size, axis_names="FHW", normalized_anchor=False, normalized_shape=False,
                         out_of_bounds_policy="error")
        # Flip before the resize, as presets.apply does.
        clips = fn.flip(clips, horizontal=flip)
        if preset.resizes:
            # Every cut is resized, including those already crop_size wide
            # (an identity: half-pixel centres map each pixel onto itself).
            side = preset.crop_size
            # The short-side scale and the random-resized crop are filtered as a downscale should be
            # (presets.resize_antialiased); the multi-scale crop is OpenCV's INTER_LINEAR, unfiltered.
            clips = fn.resize(clips, size=[side, side], interp_type=types.INTERP_LINEAR,
                              antialias=preset.multiscale is None)
        if normalize:
            clips = fn.crop_mirror_normalize(clips, mean=list(preset.mean), std=list(preset.std),
                                             dtype=types.FLOAT, output_layout="CFHW")
        pipe.set_outputs(clips, label, index)
    pipe.build()
    return pipe


class DaliClipLoader(DaliLoaderBase):
    """Batches of a conversion's clips from a DALI pipeline, in ``DistributedClipSampler`` order.

    Yields ``{"clip", "label", "video_id", "clip_index", "index"}``: ``clip``
    uint8 (N, T, H, W, C), or with ``normalize`` float (N, C, T, H, W) =
    ``(x - mean) / std`` (what ``to_model_input`` gives); ``label``,
    ``clip_index`` and ``index`` int64; ``video_id`` a list of str. With
    ``device_id`` set, ``clip`` and ``label`` are on ``cuda:device_id`` and
    ``clip_index`` / ``index`` stay on the CPU.

    ``train``: shuffled order from (seed, epoch), cropped by the preset (by
    default ``ClipPreset(train=train, seed=seed)``); each rank gets
    ``DistributedClipSampler(n, num_replicas=world_size, rank=rank,
    shuffle=True, seed=seed, drop_last=True)``'s share. Evaluation: every
    clip of this rank's share (``rank, rank + world_size, ...``) once, the
    last batch shorter. ``drop_last`` (default: ``train``) drops an epoch's
    final partial batch. ``workers``: DALI Python worker processes reading
    and decoding (0: in this process); ``prefetch``: batches prepared ahead.
    ``start_method`` of the workers: ``fork`` is the default without a GPU;
    with one, ``spawn`` (the default there), because forking a process that
    holds a CUDA context is unsafe. ``verify``: check each value's CRC-32.

    Resume like the sampler: ``set_epoch``, ``set_position`` (samples of this
    rank's epoch already used), ``state_dict``/``load_state_dict``. Iterating
    gives the rest of the current epoch.

    ``share``: read exactly these clip indices, in this order, every epoch,
    instead of the sampler's share (``rank``/``world_size`` then only name
    the reader); the crops still follow (seed, epoch, index). The native
    route reads the rest of an epoch interrupted on another number of ranks
    so (``DaliTFRecordLoader``).

    ``spec`` (``loaders.sampling.SampleSpec``): which frames a sample is, as
    for ``ClipDataset``; with rule ``"window"`` or ``"segments"`` the source
    assembles each sample from its video's timeline on the CPU
    (``ClipStore.frames``, any codec) and DALI crops, flips and normalises
    it: the samples are ``ClipDataset``'s, in the sampler's order.
    """

    def __init__(self, root: str, *, train: bool, batch_size: int, preset: ClipPreset | None = None, rank: int = 0,
                 world_size: int = 1, device_id: int | None = None, seed: int = 0, workers: int = 2,
                 prefetch: int = 2, normalize: bool = False, drop_last: bool | None = None,
                 start_method: str | None = None, verify: bool = False,
                 share: Sequence[int] | np.ndarray | None = None, cache: CacheSettings | None = None,
                 spec: SampleSpec | None = None) -> None:
        workers = check_int("workers", workers, 0)
        if not isinstance(verify, bool):
            raise ValueError(f"verify must be True or False, got {verify!r}")
        if drop_last is not None and not isinstance(drop_last, bool):
            raise ValueError(f"drop_last must be None (= train), True or False, got {drop_last!r}")
        if start_method is None:
            start_method = "fork" if device_id is None else "spawn"
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be None or one of {', '.join(START_METHODS)}, got {start_method!r}")
        self._setup(root, train=train, batch_size=batch_size, preset=preset, rank=rank, world_size=world_size,
                    device_id=device_id, seed=seed, prefetch=prefetch, normalize=normalize, cache=cache, spec=spec)
        if self.samples is None:  # samples of videos are decoded by the source, on the CPU: any codec
            refuse_without_gpu(root, self.store.codec, device_id)
        self.workers, self.start_method = workers, start_method
        self.verify = verify
        self.drop_last = train if drop_last is None else drop_last
        fixed = None
        n = len(self.store) if self.samples is None else len(self.samples)
        if share is not None:
            fixed = np.asarray(share, dtype=np.int64).reshape(-1)
            if fixed.size and (fixed.min() < 0 or fixed.max() >= n):
                raise ValueError(f"share must be sample indices 0..{n - 1} of {root}")
        self._order = _Order(n, world=self.world_size, rank=self.rank, seed=self.seed, train=train,
                             batch_size=self.batch_size, drop_last=self.drop_last, fixed=fixed)
        if train and self._order.batches(0) < 1:
            raise ValueError(f"{root}: {n} samples give rank {self.rank} of {self.world_size} "
                             f"{self._order.share_size}, fewer than one batch of {self.batch_size}")
        self._stream: _Stream | None = None
        self._next_batch = 0  # batches of the pipeline's stream handed out so far

    # -- sizes ----------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Clips this rank reads per epoch (before ``drop_last``)."""
        return self._order.share_size

    @property
    def steps_per_epoch(self) -> int:
        """Batches in a whole epoch."""
        return self._order.batches(0)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def state_dict(self, consumed: int | None = None) -> dict:
        """The sampler's ``{"epoch", "position", "scheme"}``: the order is ``DistributedClipSampler``'s."""
        return {**super().state_dict(consumed), "scheme": self._order.sampler.scheme}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()`` (a state without ``scheme`` is of the sampler's own scheme)."""
        super().load_state_dict(state)
        self._order.sampler.load_state_dict({"epoch": 0, "position": 0,
                                             **{k: v for k, v in state.items() if k == "scheme"}})
        self._order.forget()
        self.close()  # a pipeline built for another position's order must not be read on

    def indices(self, epoch: int | None = None, position: int | None = None) -> np.ndarray:
        """The clip indices an iteration of ``epoch`` from ``position`` yields, in order (no padding)."""
        epoch = self.epoch if epoch is None else epoch
        position = self.position if position is None else position
        count = sum(self._order.valid(position, b) for b in range(self._order.batches(position)))
        indices: np.ndarray = self._order.share(epoch)[position:position + count].copy()
        return indices

    # -- iteration ------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        epoch, position = self.epoch, self.position
        count = self._order.batches(position)
        self._token += 1
        if count == 0:
            return iter(())
        return self._batches(self._token, epoch, position, count)

    def _batches(self, token: int, epoch: int, position: int, count: int) -> Iterator[dict]:
        pipe = self._attach(epoch, position)
        stream = torch.cuda.current_stream(self.device) if self.device is not None else None
        share = self._order.share(epoch)
        bs = self.batch_size
        # From a URL: the shard cache prefetches in this order; the source reads up to the pipeline's
        # prefetch (and the batch being made) ahead of the batches handed out.
        plan = (PrefetchPlan(self.store, share[position:], ahead=bs * (self.prefetch + 1))
                if self.store.cache is not None else None)
        for b in range(count):
            if token != self._token:
                raise RuntimeError("this DaliClipLoader iterator was superseded by a newer iter() of the loader")
            if plan is not None:
                plan.at(b * bs)
            outs = self._run_pipe(pipe, stream)
            self._next_batch += 1
            n = self._order.valid(position, b)
            start = position + b * bs
            yield self._batch(outs, share[start:start + n], stream)

    def _attach(self, epoch: int, position: int) -> Pipeline:
        """A pipeline whose next batch is the first of (epoch, position): the current one read on, or a new one."""
        if self._pipe is not None and self._stream is not None:
            k = self._stream.segment_at(self._next_batch)
            if k is not None:
                want_epoch, want_position = self._stream.segment(k)
                if want_position == position and (want_epoch == epoch or not self.train):
                    return self._pipe
        self.close()
        if self.workers > 0 and self.start_method == "fork":
            # A forked worker inherits this process's uncollected garbage; a
            # DALI pipeline among it (a dropped loader, one held by an old
            # traceback) would be finalised in the worker, where its threads
            # do not exist, and hang or abort it. Collect it here first.
            gc.collect()
        self._stream = _Stream(self._order, epoch, position)
        graph = graph_for(self.store.codec)
        in_dali = graph.in_dali and (self.device_id is not None or graph.cpu)
        source: SampleSource
        if self.samples is not None:
            source = _FrameSource(self.store, self.preset, self._stream, self.samples, verify=self.verify)
        else:
            source = _ClipSource(self.store, self.preset, self._stream, in_dali=in_dali, verify=self.verify,
                                 needs_shape=graph.needs_shape, needs_parts=graph.needs_parts)
        hint = int(np.prod(self._stored_shape)) // self._stored_frames * self.clip_shape[0] + 4096 \
            if self._stored_shape else 0
        self._slot.pipe = _build_pipeline(
            source, graph=graph, frames=self.clip_shape[0], batch_size=self.batch_size, device_id=self.device_id,
            workers=self.workers, prefetch=self.prefetch, start_method=self.start_method, preset=self.preset,
            normalize=self.normalize, hint=max(hint, 1 << 20))
        self._next_batch = 0
        return self._slot.pipe

    def _run_pipe(self, pipe: Pipeline, stream: Any) -> Sequence[Any]:
        """The pipeline's next outputs; on a failure the pipeline is closed (it cannot go on) and the
        one-line ``FormatError`` of ``run_pipeline`` raised."""
        try:
            return run_pipeline(pipe, stream, self.root)
        except FormatError:
            self.close()
            raise

    def _batch(self, outs: Sequence[Any], expected: np.ndarray, stream: Any) -> dict:
        clips_tl, labels_tl, index_tl = outs
        n = len(expected)
        index = torch.from_numpy(np.array(index_tl.as_tensor())).reshape(-1)[:n]
        if not np.array_equal(index.numpy(), expected):
            raise RuntimeError(f"DALI pipeline out of step: got clips {index.tolist()}, expected {expected.tolist()}")
        clips = to_torch(clips_tl, self.device, stream)[:n]
        labels = to_torch(labels_tl, self.device, stream).reshape(-1)[:n]
        samples = self.samples
        where = [self.store.locate(int(i)) for i in expected] if samples is None else \
            [(samples.video(int(i)), int(i) % samples.per_video) for i in expected]
        return {"clip": clips, "label": labels, "video_id": [self.store.video_ids[v] for v, _ in where],
                "clip_index": torch.tensor([c for _, c in where], dtype=torch.int64), "index": index}

    def close(self) -> None:
        """Stop the pipeline and its worker processes (a later iteration builds a new one)."""
        self._stream = None
        super().close()


__all__ = ["START_METHODS", "DaliClipLoader"]
