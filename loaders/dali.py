"""``DaliClipLoader``: a conversion's clips through an NVIDIA DALI pipeline, in the sampler's order.

A picklable ``_ClipSource`` feeds ``fn.external_source`` one sample at a
time (in DALI's Python worker processes when ``workers > 0``). For each
sample it returns the stored payload of the crop's temporal window plus the
crop the ``ClipPreset`` draws for (seed, epoch, index), so the DALI path and
``ClipDataset`` cut the same pixels from the same clips in the same order
(``DistributedClipSampler``'s). This is the route for LMDB shards (DALI has
no LMDB clip reader); TFRecord conversions also have DALI's native reader
(``loaders.dali_native``).

The codec's own DALI stage decodes: LZ4 is inflated on the GPU (frame by
frame: the per-frame blocks of format version 2 decode in parallel), JPEG
by the image decoder (nvJPEG on the GPU, libjpeg-turbo in CPU mode), raw
payloads are copied up as they are. The square crop (``fn.slice``), flip
(``fn.flip``) and multi-scale resize (``fn.resize``) follow on the same
device. With ``device_id=None`` the graph runs on DALI's CPU backend;
inflate has no CPU version, so there LZ4 is decompressed in the source.

Exactness: in CPU mode every path is bit-identical to the ``ClipDataset``
path except the multi-scale resize, which DALI computes with its own
arithmetic and rounding (within a grey level or two of
``presets.resize_bilinear``). On the GPU, nvJPEG's pixels differ from
libjpeg-turbo's by a grey level or two.

The pipeline reads one endless sample stream (no DALI epochs): the epoch it
was built for, from the position it was built for, then whole epochs after
it. The usual loop (``set_epoch(e)``; iterate the whole epoch; ``set_epoch(e + 1)``)
just keeps reading, with prefetching running across the epoch boundary; a
jump elsewhere (resume, an abandoned epoch) builds a fresh pipeline.

Run ``python -m loaders.dali [ROOT]`` on a machine with a GPU for the
device check (``loaders.dali_check``).
"""

from __future__ import annotations

try:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali.backend import TensorGPU
    from nvidia.dali.pipeline import Pipeline
except (ImportError, OSError) as _exc:  # OSError: the wheel is there but a shared library is not
    raise ImportError(f"loaders.dali needs NVIDIA DALI: pip install nvidia-dali-cuda120 ({_exc})") from None

import gc
import weakref
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from convert.format import Codec, FormatError, read_manifest
from convert.system import cpu_count

from .clipstore import ClipStore, DatasetError, open_clips
from .dali_source import _ClipSource, _Order, _Stream
from .presets import ClipPreset
from .sampler import EpochPosition

START_METHODS = ("fork", "spawn")
_FORMAT_ERROR_PREFIX = f"{FormatError.__module__}.{FormatError.__qualname__}: "

__all__ = ["DaliClipLoader", "DaliLoaderBase", "PipeSlot", "build_dali_loader", "gpu_self_check", "pipeline_options"]


def pipeline_options() -> dict:
    """Executor options every pipeline of this package is built with.

    ``pipe.run(cuda_stream)`` hands outputs over on a CUDA stream only under
    DALI's dynamic executor; older releases default to the legacy one and
    then refuse the stream ("Asynchronous outputs require ..."). The keyword
    ``exec_dynamic`` exists from DALI 1.44 (before: ``experimental_exec_dynamic``).
    """
    return {"exec_dynamic": True}


class PipeSlot:
    """A loader's current pipeline, closed by ``close()``, when the loader is collected, or at exit.

    The finalizer holds the slot, never the loader, so a dropped loader is
    collected (and its pipeline's threads, worker processes and memory freed)
    even if nobody calls ``close()``.
    """

    def __init__(self, owner: object) -> None:
        self.pipe: Pipeline | None = None
        self._finalizer = weakref.finalize(owner, self.close)

    def close(self) -> None:
        pipe, self.pipe = self.pipe, None
        if pipe is not None:
            pool = getattr(pipe, "_py_pool", None)  # DALI closes it on garbage collection; do it now
            if pool is not None:
                pool.close()
            del pipe
            gc.collect()  # a pipeline can sit in reference cycles: free its threads and memory now


def _build_pipeline(source: _ClipSource, *, codec: Codec, frames: int, batch_size: int, device_id: int | None,
                    workers: int, prefetch: int, start_method: str, preset: ClipPreset, normalize: bool,
                    hint: int) -> Pipeline:
    """The graph: source -> (codec's decode) -> slice -> flip -> (resize) -> (normalize); outputs clip, label, index."""
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
            with_shape = [types.INT32] if codec.dali_uses_shape else []
            # int32: DALI's int arguments (inflate's shape and chunk offsets/sizes) refuse int64.
            dtypes, ndims = dtypes + with_shape + [types.INT32, types.INT32], ndims + [1] * (len(with_shape) + 2)
        data, anchor, size, flip, label, index, *parts = fn.external_source(
            source=source, num_outputs=len(dtypes), batch=False, parallel=parallel, dtype=dtypes, ndim=ndims,
            layout=["" if source.in_dali else "FHWC"], **extra)
        clips = data
        if device_id is not None:
            label = label.gpu()
            if not source.in_dali:
                clips = clips.gpu()
        if source.in_dali:
            *shape, offsets, sizes = parts
            shape = shape[0] if shape else None
            where = "gpu" if device_id is not None else "cpu"
            # The image decoder reads from the CPU ("mixed" puts its output on the GPU); inflate reads GPU memory.
            if where == "gpu" and not codec.decode_on_host:
                clips = clips.gpu()
            clips = codec.dali_decode(clips, shape=shape, offsets=offsets, sizes=sizes, frames=frames, device=where)
        clips = fn.slice(clips, anchor, size, axis_names="FHW", normalized_anchor=False, normalized_shape=False,
                         out_of_bounds_policy="error")
        # Flip before the resize, as presets.apply does.
        clips = fn.flip(clips, horizontal=flip)
        if preset.train and preset.multiscale is not None:
            # Every cut is resized, including those already crop_size wide
            # (an identity: half-pixel centres map each pixel onto itself).
            side = preset.crop_size
            clips = fn.resize(clips, size=[side, side], interp_type=types.INTERP_LINEAR, antialias=False)
        if normalize:
            clips = fn.crop_mirror_normalize(clips, mean=list(preset.mean), std=list(preset.std),
                                             dtype=types.FLOAT, output_layout="CFHW")
        pipe.set_outputs(clips, label, index)
    pipe.build()
    return pipe


def _to_torch(tl: Any, device: torch.device | None, stream: Any) -> torch.Tensor:
    """A dense torch copy of a DALI TensorList: GPU outputs onto ``device`` (on ``stream``), CPU ones via numpy."""
    dense = tl.as_tensor()
    if not isinstance(dense, TensorGPU):
        return torch.from_numpy(np.array(dense))
    from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

    out = torch.empty(dense.shape(), dtype=to_torch_type[dense.dtype], device=device)
    feed_ndarray(dense, out, cuda_stream=stream)
    return out


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


class DaliLoaderBase(EpochPosition):
    """What both DALI loaders share: argument checks, the preset, the conversion, the pipeline's lifetime."""

    def _setup(self, root: str, *, train: bool, batch_size: int, preset: ClipPreset | None, rank: int,
               world_size: int, device_id: int | None, seed: int, prefetch: int, normalize: bool) -> None:
        if not isinstance(train, bool):
            raise ValueError(f"train must be True or False, got {train!r}")
        batch_size = _check_int("batch_size", batch_size, 1)
        world_size = _check_int("world_size", world_size, 1)
        rank = _check_int("rank", rank, 0)
        if rank >= world_size:
            raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
        seed = _check_int("seed", seed, 0)
        prefetch = _check_int("prefetch", prefetch, 1)
        if device_id is not None:
            device_id = _check_int("device_id", device_id, 0)
        if not isinstance(normalize, bool):
            raise ValueError(f"normalize must be True or False, got {normalize!r}")
        if preset is None:
            preset = ClipPreset(train=train, seed=seed)
        elif not isinstance(preset, ClipPreset):
            raise ValueError(f"preset must be a ClipPreset or None, got {type(preset).__name__}")
        elif preset.train != train:
            raise ValueError(f"train={train} but the preset has train={preset.train}")
        elif seed not in (0, preset.seed):
            # One seed keys both the order and the crops, as on the LMDB path.
            raise ValueError(f"seed={seed} disagrees with the preset's seed {preset.seed}")
        self.root = root
        self.train = train
        self.preset = preset
        self.seed = preset.seed
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self.device_id = device_id
        self.device = torch.device("cuda", device_id) if device_id is not None else None
        self.prefetch = prefetch
        self.normalize = normalize
        self.store: ClipStore = open_clips(root)
        self.classes: list[str] = list(self.store.classes)
        self.codec: str = self.store.manifest["codec"]  # the manifest's name; the codec object is store.codec
        stored = int(self.store.manifest["clip"]["clip_len"])
        if preset.clip_len is not None and preset.clip_len > stored:
            raise ValueError(f"clip_len {preset.clip_len} is longer than the stored clips ({stored} frames)")
        shape = self.store.manifest.get("clip_shape")
        if shape:
            preset.params(0, 0, shape)  # a crop that cannot fit fails here, not inside DALI
        self._stored_frames = stored
        self._stored_shape = tuple(shape) if shape else None
        self.clip_shape: tuple[int, int, int, int] = preset.out_shape(stored)
        self.epoch = 0
        self.position = 0
        self._slot = PipeSlot(self)
        self._token = 0  # which iterator may read the pipeline

    @property
    def _pipe(self) -> Pipeline | None:
        return self._slot.pipe

    @property
    def num_clips(self) -> int:
        """Clips in the conversion (all ranks)."""
        return len(self.store)

    def close(self) -> None:
        """Stop the pipeline, its threads and worker processes (a later iteration builds a new one)."""
        self._slot.close()

    def __enter__(self) -> "DaliLoaderBase":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "cpu" if self.device_id is None else f"cuda:{self.device_id}"
        return (f"{type(self).__name__}({self.root!r}, {self.codec}, {self.num_clips} clips, rank {self.rank}/"
                f"{self.world_size}, batch {self.batch_size}, {where}, epoch {self.epoch}, "
                f"position {self.position}, {self.preset})")


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
    """

    def __init__(self, root: str, *, train: bool, batch_size: int, preset: ClipPreset | None = None, rank: int = 0,
                 world_size: int = 1, device_id: int | None = None, seed: int = 0, workers: int = 2,
                 prefetch: int = 2, normalize: bool = False, drop_last: bool | None = None,
                 start_method: str | None = None, verify: bool = False) -> None:
        workers = _check_int("workers", workers, 0)
        if not isinstance(verify, bool):
            raise ValueError(f"verify must be True or False, got {verify!r}")
        if drop_last is not None and not isinstance(drop_last, bool):
            raise ValueError(f"drop_last must be None (= train), True or False, got {drop_last!r}")
        if start_method is None:
            start_method = "fork" if device_id is None else "spawn"
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be None or one of {', '.join(START_METHODS)}, got {start_method!r}")
        self._setup(root, train=train, batch_size=batch_size, preset=preset, rank=rank, world_size=world_size,
                    device_id=device_id, seed=seed, prefetch=prefetch, normalize=normalize)
        self.workers, self.start_method = workers, start_method
        self.verify = verify
        self.drop_last = train if drop_last is None else drop_last
        self._order = _Order(len(self.store), world=self.world_size, rank=self.rank, seed=self.seed, train=train,
                             batch_size=self.batch_size, drop_last=self.drop_last)
        if train and self._order.batches(0) < 1:
            raise ValueError(f"{root}: {len(self.store)} clips give rank {self.rank} of {self.world_size} "
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

    def indices(self, epoch: int | None = None, position: int | None = None) -> np.ndarray:
        """The clip indices an iteration of ``epoch`` from ``position`` yields, in order (no padding)."""
        epoch = self.epoch if epoch is None else epoch
        position = self.position if position is None else position
        count = sum(self._order.valid(position, b) for b in range(self._order.batches(position)))
        return self._order.share(epoch)[position:position + count].copy()

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
        for b in range(count):
            if token != self._token:
                raise RuntimeError("this DaliClipLoader iterator was superseded by a newer iter() of the loader")
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
        codec = self.store.codec
        in_dali = codec.decode_in_dali and (self.device_id is not None or codec.dali_cpu)
        source = _ClipSource(self.store, self.preset, self._stream, in_dali=in_dali, verify=self.verify)
        hint = int(np.prod(self._stored_shape)) + 4096 if self._stored_shape else 0
        self._slot.pipe = _build_pipeline(
            source, codec=codec, frames=self.clip_shape[0], batch_size=self.batch_size, device_id=self.device_id,
            workers=self.workers, prefetch=self.prefetch, start_method=self.start_method, preset=self.preset,
            normalize=self.normalize, hint=max(hint, 1 << 20))
        self._next_batch = 0
        return self._slot.pipe

    def _run_pipe(self, pipe: Pipeline, stream: Any) -> Sequence[Any]:
        """The pipeline's next outputs; a data error from a worker comes back as a one-line ``DatasetError``."""
        try:
            return pipe.run(stream) if stream is not None else pipe.run()
        except FormatError:
            self.close()
            raise
        except Exception as exc:
            self.close()  # a pipeline whose source failed cannot go on
            # DALI re-raises a worker's exception as a plain Exception carrying
            # the worker's traceback text; its last FormatError line holds the
            # shard and key (DatasetError is FormatError).
            lines = [ln for ln in str(exc).splitlines() if ln.startswith(_FORMAT_ERROR_PREFIX)]
            if lines:
                raise DatasetError(lines[-1][len(_FORMAT_ERROR_PREFIX):]) from exc
            raise

    def _batch(self, outs: Sequence[Any], expected: np.ndarray, stream: Any) -> dict:
        clips_tl, labels_tl, index_tl = outs
        n = len(expected)
        index = torch.from_numpy(np.array(index_tl.as_tensor())).reshape(-1)[:n]
        if not np.array_equal(index.numpy(), expected):
            raise RuntimeError(f"DALI pipeline out of step: got clips {index.tolist()}, expected {expected.tolist()}")
        clips = _to_torch(clips_tl, self.device, stream)[:n]
        labels = _to_torch(labels_tl, self.device, stream).reshape(-1)[:n]
        where = [self.store.locate(int(i)) for i in expected]
        return {"clip": clips, "label": labels, "video_id": [self.store.video_ids[v] for v, _ in where],
                "clip_index": torch.tensor([c for _, c in where], dtype=torch.int64), "index": index}

    def close(self) -> None:
        """Stop the pipeline and its worker processes (a later iteration builds a new one)."""
        self._stream = None
        super().close()


ROUTES = ("auto", "native", "source")


def build_dali_loader(root: str, *, train: bool, batch_size: int, preset: ClipPreset | None = None, rank: int = 0,
                      world_size: int = 1, device_id: int | None = None, seed: int = 0, workers: int | None = 2,
                      route: str = "auto", verify: bool = False, **kw: Any) -> Any:
    """The trainer's DALI loader for ``root``, with the trainer's keyword names.

    ``route``: ``"native"`` is ``loaders.dali_native.DaliTFRecordLoader``
    (DALI's own TFRecord reader; ``workers`` = DALI's CPU threads, at least
    1), ``"source"`` is ``DaliClipLoader`` (``fn.external_source``, sampler
    order, ``workers`` Python worker processes, ``None``: 2), ``"auto"`` the
    native route for TFRecord conversions and the source route for LMDB.
    ``verify``: check each value's CRC-32 as it is read (the source route
    only: DALI's TFRecord reader hands the bytes to the GPU without Python
    seeing them, so the native route refuses it with a ValueError).
    Other keywords go to the loader chosen.
    """
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
    if route == "auto":
        route = "native" if read_manifest(root).get("backend") == "tfrecord" else "source"
    common = {"train": train, "batch_size": batch_size, "preset": preset, "rank": rank, "world_size": world_size,
              "device_id": device_id, "seed": seed}
    if route == "native":
        if verify:
            raise ValueError("verify=True (the trainer's --verify-data) needs the source route (route='source') "
                             "or another loader (--loader threads): DALI's own TFRecord reader passes the bytes "
                             f"to the GPU unseen by Python; python -m convert verify {root} checks them all")
        from .dali_native import DaliTFRecordLoader

        return DaliTFRecordLoader(root, threads=max(1, workers or 1), **common, **kw)
    return DaliClipLoader(root, workers=2 if workers is None else workers, verify=verify, **common, **kw)


def gpu_self_check(*args, **kw) -> dict:
    """The device check (``loaders.dali_check.gpu_self_check``)."""
    from .dali_check import gpu_self_check as check

    return check(*args, **kw)


if __name__ == "__main__":
    import sys

    from loaders.dali_check import _main

    sys.exit(_main(sys.argv[1:]))
