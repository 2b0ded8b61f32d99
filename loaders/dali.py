"""``DaliClipLoader``: the LMDB clip shards through an NVIDIA DALI pipeline.

DALI has no reader for this format, so a picklable ``_ClipSource`` feeds
``fn.external_source`` one sample at a time (in DALI's Python worker
processes when ``workers > 0``). For each sample it returns the stored
payload plus the crop the ``ClipPreset`` draws for (seed, epoch, index), so
the DALI path and ``LmdbClipDataset`` cut the same pixels from the same clips
in the same order (``DistributedClipSampler``'s).

On the GPU (``device_id`` an int) LZ4 payloads are inflated on the device
(``fn.decoders.inflate``), raw payloads are copied up as they are, and the
temporal window + square crop (``fn.slice``), flip (``fn.flip``) and the
multi-scale resize (``fn.resize``) run there. With ``device_id=None`` the
same graph runs on DALI's CPU backend; inflate has no CPU version, so LZ4 is
decompressed in the source instead. JPEG payloads are decoded in the source
(on the CPU) in both modes.

Exactness: every path is bit-identical to the LMDB path except the
multi-scale resize, which DALI computes with its own arithmetic and rounding:
within a grey level or two of ``presets.resize_bilinear``, not equal.

The pipeline reads one endless sample stream (no DALI epochs): the epoch it
was built for, from the position it was built for, then whole epochs after
it. The usual loop (``set_epoch(e)``; iterate the whole epoch; ``set_epoch(e + 1)``)
just keeps reading, with prefetching running across the epoch boundary; a
jump elsewhere (resume, an abandoned epoch) builds a fresh pipeline.

Run ``python -m loaders.dali [ROOT]`` on a machine with a GPU for the
device check (``gpu_self_check``).
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
import os
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from convert.codecs import Lz4Codec, codec_for_id
from convert.format import FormatError, check_crc, unpack_header

from .clipstore import ClipStore, DatasetError, open_clips
from .presets import ClipPreset
from .sampler import DistributedClipSampler, EpochPosition

START_METHODS = ("fork", "spawn")
_FORMAT_ERROR_PREFIX = f"{FormatError.__module__}.{FormatError.__qualname__}: "

__all__ = ["DaliClipLoader", "build_dali_loader", "gpu_self_check"]


class _Order:
    """This rank's clips per epoch and how they are cut into batches.

    Training: ``DistributedClipSampler(n, shuffle=True, drop_last=True)``'s
    share. Evaluation: the sampler's (unshuffled) share without the wrapped
    padding it adds when ranks do not divide the clip count, so the ranks
    together hold every clip exactly once (train.data's ``RankSplit`` order).
    A short final batch is padded with its last clip and trimmed after DALI,
    whose batches have one size.
    """

    def __init__(self, n: int, *, world: int, rank: int, seed: int, train: bool, batch_size: int,
                 drop_last: bool) -> None:
        self.sampler = DistributedClipSampler(n, num_replicas=world, rank=rank, shuffle=train, seed=seed,
                                              drop_last=train, with_epoch=False)
        self.train = train
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.share_size = self.sampler.num_samples if train else len(range(rank, n, world))
        self._cache: dict[int, np.ndarray] = {}

    def share(self, epoch: int) -> np.ndarray:
        """This rank's clip indices for ``epoch``, from its first sample."""
        key = epoch if self.train else 0  # evaluation order does not depend on the epoch
        got = self._cache.get(key)
        if got is None:
            if len(self._cache) >= 2:  # workers move forward an epoch at a time: keep this one and the last
                self._cache.pop(next(iter(self._cache)))
            got = self._cache[key] = self.sampler.indices(key)[:self.share_size]
        return got

    def batches(self, position: int) -> int:
        """Batches of an epoch started at ``position``."""
        left = self.share_size - position
        return left // self.batch_size if self.drop_last else -(-left // self.batch_size)

    def valid(self, position: int, batch: int) -> int:
        """Real (not padding) samples in batch ``batch`` of an epoch started at ``position``."""
        return max(0, min(self.batch_size, self.share_size - position - batch * self.batch_size))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"] = {}  # rebuilt per worker; a shuffled epoch order can be large
        return state


class _Stream:
    """The samples one pipeline reads: ``epoch`` from ``position``, then every later epoch from its start."""

    def __init__(self, order: _Order, epoch: int, position: int) -> None:
        self.order = order
        self.epoch = epoch
        self.position = position
        self.first = order.batches(position)  # batches of the first segment
        self.every = order.batches(0)  # batches of each later one

    def segment(self, k: int) -> tuple[int, int]:
        """(epoch, start position) of the stream's ``k``-th epoch."""
        return self.epoch + k, self.position if k == 0 else 0

    def segment_at(self, batch: int) -> int | None:
        """Which segment starts at stream batch ``batch`` (None: ``batch`` is inside one)."""
        if batch == 0:
            return 0
        rest = batch - self.first
        if rest < 0 or self.every == 0 or rest % self.every:
            return None
        return 1 + rest // self.every

    def locate(self, sample: int) -> tuple[int, int]:
        """(epoch, clip index) of stream sample ``sample``; padding repeats a batch's last real clip."""
        bs = self.order.batch_size
        batch, j = divmod(sample, bs)
        if batch < self.first:
            k, b = 0, batch
        else:
            if self.every == 0:
                raise IndexError(f"stream sample {sample} is past the only epoch")
            k, b = 1 + (batch - self.first) // self.every, (batch - self.first) % self.every
        epoch, position = self.segment(k)
        j = min(j, self.order.valid(position, b) - 1)
        return epoch, int(self.order.share(epoch)[position + b * bs + j])


class _ClipSource:
    """``external_source`` callback: one stored clip and its crop for a ``SampleInfo``.

    Returns (data, anchor (t0, y0, x0), size (t, h, w), flip, label, index)
    and, when ``inflate``, the stored shape (T, H, W, C). ``data`` is then
    the 1-D LZ4 payload (the GPU decompresses it), else the decoded
    (T, H, W, C) frames (raw payloads are not copied here: DALI copies them
    once).
    Stateless apart from caches, as parallel sources must be.
    """

    def __init__(self, store: ClipStore, preset: ClipPreset, stream: _Stream, *, inflate: bool,
                 verify: bool) -> None:
        self.store = store
        self.preset = preset
        self.stream = stream
        self.inflate = inflate
        self.verify = verify
        self.num_classes = len(store.classes)

    def __call__(self, info: Any) -> tuple[np.ndarray, ...]:
        epoch, index = self.stream.locate(int(info.idx_in_epoch))
        (value,) = self.store.read_values([index])
        try:
            return self._sample(value, epoch, index)
        except FormatError as exc:
            shard, key = self.store.key(index)
            raise DatasetError(f"{self.store.shard_paths[shard]}: {key.decode(errors='replace')}: {exc}") from exc

    def _sample(self, value: bytes, epoch: int, index: int) -> tuple[np.ndarray, ...]:
        header = unpack_header(value)
        if self.verify:
            check_crc(value, header)
        if not 0 <= header.label < self.num_classes:
            raise FormatError(f"label {header.label} outside the {self.num_classes} classes of the manifest")
        try:
            p = self.preset.params(epoch, index, header.shape)
        except ValueError as exc:
            raise FormatError(f"stored clip of shape {header.shape} does not suit the preset: {exc}") from exc
        payload = memoryview(value)[header.offset:]
        if self.inflate:
            if header.codec_id != Lz4Codec.id:
                raise FormatError(f"codec id {header.codec_id} in a shard the manifest calls lz4")
            data = np.frombuffer(payload, dtype=np.uint8)
        else:
            data = codec_for_id(header.codec_id).decode(payload, header.shape)
        t = p.t if p.t is not None else header.shape[0] - p.t0
        out = (data, np.array([p.t0, p.y0, p.x0], dtype=np.int32), np.array([t, p.h, p.w], dtype=np.int32),
               np.array(p.flip, dtype=np.int32), np.array(header.label, dtype=np.int64),
               np.array(index, dtype=np.int64))
        return out + (np.asarray(header.shape, dtype=np.int32),) if self.inflate else out


def _inflate_op():
    # decoders.inflate replaced experimental.inflate (same arguments) in newer DALI.
    decoders = getattr(fn, "decoders", None)
    op = getattr(decoders, "inflate", None)
    return op if op is not None else fn.experimental.inflate


def _build_pipeline(source: _ClipSource, *, batch_size: int, device_id: int | None, workers: int, prefetch: int,
                    start_method: str, preset: ClipPreset, normalize: bool, hint: int) -> Pipeline:
    """The graph: source -> (inflate) -> slice -> flip -> (resize) -> (normalize); outputs clip, label, index."""
    threads = max(1, min(4, os.cpu_count() or 1))
    pipe = Pipeline(batch_size=batch_size, num_threads=threads, device_id=device_id, seed=0,
                    prefetch_queue_depth=prefetch, py_num_workers=max(1, workers), py_start_method=start_method)
    parallel = workers > 0
    extra = {"prefetch_queue_depth": prefetch, "bytes_per_sample_hint": hint} if parallel else {}
    with pipe:
        dtypes = [types.UINT8, types.INT32, types.INT32, types.INT32, types.INT64, types.INT64]
        ndims = [1 if source.inflate else 4, 1, 1, 0, 0, 0]
        if source.inflate:
            dtypes, ndims = dtypes + [types.INT32], ndims + [1]
        data, anchor, size, flip, label, index, *shape = fn.external_source(
            source=source, num_outputs=len(dtypes), batch=False, parallel=parallel, dtype=dtypes, ndim=ndims,
            layout=["" if source.inflate else "FHWC"], **extra)
        clips = data
        if device_id is not None:
            clips = clips.gpu()
            if source.inflate:
                clips = _inflate_op()(clips, shape=shape[0], algorithm="LZ4", dtype=types.UINT8, layout="FHWC")
            label = label.gpu()
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


class DaliClipLoader(EpochPosition):
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
        if not isinstance(train, bool):
            raise ValueError(f"train must be True or False, got {train!r}")
        batch_size = _check_int("batch_size", batch_size, 1)
        world_size = _check_int("world_size", world_size, 1)
        rank = _check_int("rank", rank, 0)
        if rank >= world_size:
            raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
        seed = _check_int("seed", seed, 0)
        workers = _check_int("workers", workers, 0)
        prefetch = _check_int("prefetch", prefetch, 1)
        if device_id is not None:
            device_id = _check_int("device_id", device_id, 0)
        for name, flag in (("normalize", normalize), ("verify", verify)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        if drop_last is not None and not isinstance(drop_last, bool):
            raise ValueError(f"drop_last must be None (= train), True or False, got {drop_last!r}")
        if start_method is None:
            start_method = "fork" if device_id is None else "spawn"
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be None or one of {', '.join(START_METHODS)}, got {start_method!r}")
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
        self.workers, self.prefetch, self.start_method = workers, prefetch, start_method
        self.normalize = normalize
        self.verify = verify
        self.drop_last = train if drop_last is None else drop_last
        self.store: ClipStore = open_clips(root)
        self.classes: list[str] = list(self.store.classes)
        self.codec: str = self.store.manifest["codec"]
        stored = int(self.store.manifest["clip"]["clip_len"])
        if preset.clip_len is not None and preset.clip_len > stored:
            raise ValueError(f"clip_len {preset.clip_len} is longer than the stored clips ({stored} frames)")
        shape = self.store.manifest.get("clip_shape")
        if shape:
            preset.params(0, 0, shape)  # a crop that cannot fit fails here, not in a worker
        self._stored_shape = tuple(shape) if shape else None
        self.clip_shape: tuple[int, int, int, int] = preset.out_shape(stored)
        self._order = _Order(len(self.store), world=world_size, rank=rank, seed=self.seed, train=train,
                             batch_size=batch_size, drop_last=self.drop_last)
        if train and self._order.batches(0) < 1:
            raise ValueError(f"{root}: {len(self.store)} clips give rank {rank} of {world_size} "
                             f"{self._order.share_size}, fewer than one batch of {batch_size}")
        self.epoch = 0
        self.position = 0
        self._pipe: Pipeline | None = None
        self._stream: _Stream | None = None
        self._next_batch = 0  # batches of the pipeline's stream handed out so far
        self._token = 0  # which iterator may read the pipeline

    # -- sizes ----------------------------------------------------------------
    @property
    def num_clips(self) -> int:
        """Clips in the conversion (all ranks)."""
        return len(self.store)

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
        inflate = self.codec == "lz4" and self.device_id is not None
        source = _ClipSource(self.store, self.preset, self._stream, inflate=inflate, verify=self.verify)
        hint = int(np.prod(self._stored_shape)) + 4096 if self._stored_shape else 0
        self._pipe = _build_pipeline(source, batch_size=self.batch_size, device_id=self.device_id,
                                     workers=self.workers, prefetch=self.prefetch, start_method=self.start_method,
                                     preset=self.preset, normalize=self.normalize, hint=max(hint, 1 << 20))
        self._next_batch = 0
        return self._pipe

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
        pipe, self._pipe, self._stream = self._pipe, None, None
        if pipe is not None:
            pool = getattr(pipe, "_py_pool", None)  # DALI closes it on garbage collection; do it now
            if pool is not None:
                pool.close()
            del pipe
            gc.collect()  # the pipeline sits in reference cycles: free its threads and memory now

    def __repr__(self) -> str:
        where = "cpu" if self.device_id is None else f"cuda:{self.device_id}"
        return (f"DaliClipLoader({self.root!r}, {self.codec}, {self.num_clips} clips, rank {self.rank}/"
                f"{self.world_size}, batch {self.batch_size}, {where}, epoch {self.epoch}, "
                f"position {self.position}, {self.preset})")


def build_dali_loader(root: str, *, train: bool, batch_size: int, preset: ClipPreset | None = None, rank: int = 0,
                      world_size: int = 1, device_id: int | None = None, seed: int = 0, workers: int | None = 2,
                      **kw: Any) -> DaliClipLoader:
    """``DaliClipLoader`` with the trainer's keyword names (``workers=None``: 2)."""
    return DaliClipLoader(root, train=train, batch_size=batch_size, preset=preset, rank=rank,
                          world_size=world_size, device_id=device_id, seed=seed,
                          workers=2 if workers is None else workers, **kw)


# -- device check ---------------------------------------------------------------

def _synth_roots(base: str, codecs: Sequence[str]) -> list[str]:
    """Convert a small synthetic dataset once per codec under ``base``."""
    from convert.job import JobOptions, run_job
    from convert.plan import ConvertConfig
    from convert.synth import make_dataset

    src = os.path.join(base, "videos")
    make_dataset(src, per_class=2, seconds=1.2, seed=0)
    roots = []
    for codec in codecs:
        out = os.path.join(base, codec)
        run_job(src, out, ConvertConfig(codec=codec), JobOptions(workers=min(8, os.cpu_count() or 1), progress=False))
        roots.append(out)
    return roots


def _check_against_lmdb(root: str, preset: ClipPreset, *, device_id: int | None, batch_size: int, workers: int,
                        tolerance: int) -> dict:
    """Two epochs and a resume of the DALI loader, each batch compared with ``LmdbClipDataset``."""
    import time

    from .dataset import LmdbClipDataset

    loader = DaliClipLoader(root, train=preset.train, batch_size=batch_size, preset=preset, device_id=device_id,
                            workers=workers)
    ds = LmdbClipDataset(root, train=preset.train, preset=preset)
    worst, clips, start = 0, 0, time.perf_counter()
    try:
        for epoch, position in ((0, 0), (1, 0), (1, batch_size)):
            loader.set_epoch(epoch)
            loader.set_position(position)
            seen = []
            for batch in loader:
                if device_id is not None and batch["clip"].device != torch.device("cuda", device_id):
                    raise RuntimeError(f"clips came back on {batch['clip'].device}, not cuda:{device_id}")
                ref = ds.__getitems__([(epoch, int(i)) for i in batch["index"]]).collated
                got = batch["clip"].cpu()
                if got.shape != ref["clip"].shape:
                    raise RuntimeError(f"{root}: DALI batch {tuple(got.shape)}, LMDB {tuple(ref['clip'].shape)}")
                diff = int((got.int() - ref["clip"].int()).abs().max()) if got.numel() else 0
                worst = max(worst, diff)
                if diff > tolerance:
                    raise RuntimeError(f"{root} {preset}: epoch {epoch} clips {batch['index'].tolist()} differ from "
                                       f"the LMDB path by up to {diff} (allowed {tolerance})")
                if not torch.equal(batch["label"].cpu(), ref["label"]) or batch["video_id"] != ref["video_id"]:
                    raise RuntimeError(f"{root}: labels or video ids differ at clips {batch['index'].tolist()}")
                seen.extend(batch["index"].tolist())
                clips += len(batch["index"])
            if seen != loader.indices(epoch, position).tolist():
                raise RuntimeError(f"{root}: epoch {epoch} from {position} read {seen}, "
                                   f"the sampler order is {loader.indices(epoch, position).tolist()}")
    finally:
        loader.close()
    if device_id is not None:
        torch.cuda.synchronize(device_id)
    return {"max_diff": worst, "clips": clips, "seconds": round(time.perf_counter() - start, 3)}


def _check_normalize(root: str, *, device_id: int | None, batch_size: int, workers: int) -> float:
    """Largest difference between DALI's normalised output and ``to_model_input`` of the LMDB batch."""
    from .dataset import LmdbClipDataset
    from .presets import to_model_input

    preset = ClipPreset(train=True, seed=1)
    loader = DaliClipLoader(root, train=True, batch_size=batch_size, preset=preset, device_id=device_id,
                            workers=workers, normalize=True)
    ds = LmdbClipDataset(root, train=True, preset=preset)
    worst = 0.0
    try:
        for batch in loader:
            ref = ds.__getitems__([(0, int(i)) for i in batch["index"]]).collated["clip"]
            want = to_model_input(ref, mean=preset.mean, std=preset.std, device=batch["clip"].device)
            worst = max(worst, float((batch["clip"] - want).abs().max()))
    finally:
        loader.close()
    if worst > 1e-5:
        raise RuntimeError(f"{root}: normalised DALI output differs from to_model_input by {worst}")
    return worst


def gpu_self_check(root: str | None = None, *, device_id: int | None = 0, batch_size: int = 4, workers: int = 2,
                   codecs: Sequence[str] = ("lz4", "raw")) -> dict:
    """Compare the DALI pipeline with the LMDB path; raises RuntimeError on a difference, returns what it saw.

    ``root``: a conversion to check (default: convert a small synthetic set
    once per codec in ``codecs`` into a temporary folder). For each: train
    (random crop + flip), train with multi-scale (allowed to differ by 2 grey
    levels), and eval presets, over two epochs and a mid-epoch resume; then
    ``normalize=True`` against ``to_model_input``. ``device_id=None`` runs the
    same checks on DALI's CPU backend.
    """
    import tempfile

    if device_id is not None and not torch.cuda.is_available():
        raise RuntimeError("gpu_self_check: torch sees no CUDA device (pass device_id=None for the CPU backend)")
    results: dict = {"device": "cpu" if device_id is None else torch.cuda.get_device_name(device_id)}
    with tempfile.TemporaryDirectory(prefix="dali_check_") as tmp:
        roots = [root] if root is not None else _synth_roots(tmp, codecs)
        for r in roots:
            name = open_clips(r).manifest["codec"] if root is None else r
            presets = {"train": (ClipPreset(train=True, seed=1, clip_len=8), 0),
                       "multiscale": (ClipPreset(train=True, seed=1, multiscale=(1.0, 0.875, 0.75, 0.66)), 2),
                       "eval": (ClipPreset(train=False, seed=1), 0)}
            for label, (preset, tolerance) in presets.items():
                got = _check_against_lmdb(r, preset, device_id=device_id, batch_size=batch_size, workers=workers,
                                          tolerance=tolerance)
                results[f"{name}/{label}"] = got
                print(f"{name:>8} {label:<10} ok: {got['clips']} clips in {got['seconds']} s, "
                      f"max diff {got['max_diff']}", flush=True)
            worst = _check_normalize(r, device_id=device_id, batch_size=batch_size, workers=workers)
            results[f"{name}/normalize"] = worst
            print(f"{name:>8} normalize  ok: max diff {worst:.2e}", flush=True)
    return results


def _main(argv: Sequence[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m loaders.dali",
                                description="Check the DALI pipeline against the LMDB path (GPU by default).")
    p.add_argument("root", nargs="?", help="a conversion to check (default: a small synthetic one)")
    p.add_argument("--device", default="0", help="CUDA device number, or 'cpu' for DALI's CPU backend")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    args = p.parse_args(argv)
    device_id = None if args.device == "cpu" else int(args.device)
    try:
        gpu_self_check(args.root, device_id=device_id, batch_size=args.batch_size, workers=args.workers)
    except (RuntimeError, ValueError, DatasetError) as exc:
        print(f"DALI check FAILED: {exc}")
        return 1
    print("DALI check passed")
    return 0


if __name__ == "__main__":
    import sys

    # Run the importable copy of this module, so spawned DALI workers find its classes by name.
    from loaders.dali import _main as _importable_main

    sys.exit(_importable_main(sys.argv[1:]))
