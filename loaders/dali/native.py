"""``DaliTFRecordLoader``: TFRecord conversions read, decoded and cropped by DALI's own operators.

No Python touches a sample: ``fn.readers.tfrecord`` reads the records of
every shard (through their index files; the feature spec derived from the
writer's schema) and shards them over ranks, the payload's DALI graph
decodes them (``loaders.dali.graphs``: nvJPEG for jpeg, the GPU inflate over
per-frame LZ4 blocks for lz4, the video decoder for h264 and vp9, which
decodes a clip's every frame cropped back to the stored size, a reshape for
raw), and
one ``fn.crop_mirror_normalize`` cuts the crop (and the temporal window),
flips and normalises on the device. With ``device_id=None`` the same graph
runs on DALI's CPU backend (raw, jpeg and vp9; DALI has no CPU inflate and no
CPU H.264 decoder, and an h264 conversion is refused without a GPU).

How an epoch is read:

- **Sharding**: rank r reads DALI shard r, the contiguous range
  ``[N*r // S, N*(r+1) // S)`` of the records in the epoch's file order
  (``stick_to_shard``; S = world size). ``pad_last_batch`` pads every shard
  to the same number of whole batches, ``ceil(ceil(N / S) / batch)``,
  by repeating the shard's last sample after all its real ones: every rank
  runs the same number of steps. Training keeps the padding (full batches;
  ``batch["padding"]`` marks it), evaluation drops it (each clip exactly
  once over all ranks; a batch may be short, and a batch of padding alone is
  skipped).
- **Shuffling** (training): the order of the record files is shuffled per
  epoch (``shuffle_after_epoch``, seeded from (seed, epoch), the same on
  every rank so the ranks split one order), and samples are drawn at random
  from a buffer of ``shuffle_buffer_mb`` of records (``random_shuffle``,
  ``initial_fill``). The shuffle is file-level plus local: clips stored
  close together (a video's clips, a part's videos) tend to meet in nearby
  batches.
- **Crops** (training): window start, scale (multi-scale only), row,
  column and flip are drawn per sample by ``fn.random.uniform``, as the
  ``ClipPreset`` describes them, but from DALI's generators, not from
  (seed, epoch, index): the crops differ from ``ClipDataset``'s. Evaluation
  takes the centre window and the centre square, rounded as torchvision's
  CenterCrop (``presets._centre``), so it equals ``ClipDataset(train=False)``
  bit for bit on the CPU (raw, jpeg) and within nvJPEG's grey level or two
  on the GPU.
- **One pipeline per epoch**, seeded from (seed, epoch): epoch e's order
  and crops depend on (seed, e, world size, batch size) only, whatever ran
  before. Every rank gets the same seeds (the crop draws are shifted per
  rank by a multiple of the golden ratio, so ranks do not cut alike), which
  makes the DALI state of every rank the same: rank 0's checkpoint restores
  every rank.

Resume: ``state_dict()`` holds DALI's checkpoint of the reader and of every
random generator (``Pipeline.checkpoint()``) taken after the batches handed
out so far; ``load_state_dict`` rebuilds the epoch's pipeline from it. With
the same world size, batch size and preset, the resumed run reads exactly
what the uninterrupted run would have read: the same clips in the same
order with the same crops and flips (bit-identical on the CPU; tested).
Without a usable checkpoint (another preset or DALI version, or a graph DALI
cannot checkpoint: the video decoder's, whose state then saves an empty one) a
position is reached by reading and dropping that many batches of the epoch's
pipeline, which is as exact, at the cost of the reading.

Elastic resume (another world size or batch size): DALI's reader deals an
epoch by both, so its checkpoint cannot carry over. The state records which
clips this rank has read this epoch (``read``; ``merge_rank_states`` merges
every rank's), and a loader of another configuration reads the clips not read
yet, in ``DistributedClipSampler``'s global order of the epoch dealt
round-robin to its ranks, through the source route (``DaliClipLoader`` with
``share``), padded to the epoch's remaining whole batches; over the two runs
every clip of the epoch is read once. Those clips are cropped by the keyed
preset (the source route's), not by DALI's generators.

The reader has no global clip index: batches carry ``video_id`` and
``clip_index`` from the records, and ``index`` is looked up from them in the
manifest's clip order (``open_clips``'s numbering).
"""

from __future__ import annotations

import base64
import functools
import operator
import os
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from convert.format import FormatError
from convert.format.manifest import DataSpec
from convert.format.tfrecord.schema import BY_NAME
from convert.store.cache import CacheSettings

from ..presets import ClipPreset, _centre
from ..sampler import DistributedClipSampler
from ..sampling import SampleSpec
from .base import (
    DaliLoaderBase,
    Pipeline,
    check_gpu,
    check_int,
    dali,
    dmath,
    fn,
    pipeline_options,
    run_pipeline,
    tfrec,
    to_torch,
    types,
)
from .graphs import cpu_codecs, graph_for, refuse_without_gpu
from .sharding import padded_steps, shard_sizes

_GOLDEN = 0.6180339887498949
# The features the pipeline reads, in FORMAT.md's schema (convert.format.tfrecord.schema).
READ = ("payload", "part_offsets", "part_sizes", "shape", "label", "video_id", "clip_index")


def reader_features(names: tuple[str, ...] = READ) -> dict[str, Any]:
    """``fn.readers.tfrecord``'s feature spec for ``names``, derived from the schema the writer uses."""
    spec = {}
    for name in names:
        f = BY_NAME[name]
        if f.kind == "bytes":
            spec[name] = tfrec.FixedLenFeature((), tfrec.string, "")
        elif f.length is None:
            spec[name] = tfrec.VarLenFeature(tfrec.int64, 0)
        else:
            spec[name] = tfrec.FixedLenFeature([f.length], tfrec.int64, -1)
    return spec


__all__ = ["READ", "DaliTFRecordLoader", "padded_steps", "reader_features", "shard_sizes"]


class _StreamGate:
    """The one Python step of the native route, for payloads whose decoder sizes its pictures by the stream:
    each payload's own headers are checked against its record's clip header (``DataSpec.shape_problem``, then
    the codec's ``check_framing``, nothing decoded) before DALI's video decoder sees it.

    Called by ``fn.python_function`` per sample, with the record's payload, shape, video id and clip index; it
    hands the payload on unchanged, or raises the one-line FormatError naming the shard and clip, which it also
    keeps (``refusal``) for the loader to raise as it is: DALI wraps the error in its own text. It holds the
    store, never the loader, so a dropped loader is still collected.
    """

    def __init__(self, *, store: Any, first: dict[str, int]) -> None:
        self.store, self.first = store, first
        self.refusal: FormatError | None = None

    def __call__(self, payload: np.ndarray, shape: np.ndarray, video_id: np.ndarray,
                 clip_index: np.ndarray) -> np.ndarray:
        header = tuple(int(x) for x in shape.reshape(-1))
        problem = self.store.manifest.data.shape_problem(header)
        if problem is None:
            try:
                codec = self.store.codec
                codec.check_framing(payload, header, *codec.parts(payload, header))
            except FormatError as exc:
                problem = str(exc)
        if problem is None:
            return payload
        video = bytes(video_id).decode("utf-8", "replace")
        first = self.first.get(video)
        where = self.store.where(first + int(clip_index.reshape(-1)[0])) if first is not None else \
            f"{self.store.root}: video {video!r}"
        self.refusal = FormatError(f"{where}: {problem}")
        raise self.refusal


def _pack(mask: np.ndarray) -> str:
    """A mask of clips as text for a state dict (base64 of its bits; a checkpoint holds plain values)."""
    return base64.b64encode(np.packbits(np.asarray(mask, dtype=bool)).tobytes()).decode("ascii") + f":{mask.size}"


def _unpack(text: Any) -> np.ndarray:
    """``_pack``'s mask back; ValueError when ``text`` is not one."""
    try:
        bits, size = str(text).rsplit(":", 1)
        raw = np.frombuffer(base64.b64decode(bits, validate=True), dtype=np.uint8)
        count = int(size)
        if not 0 <= count <= raw.size * 8:
            raise ValueError(f"{count} bits in {raw.size} bytes")
        return np.unpackbits(raw, count=count).astype(bool)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"a state's read clips are not a packed mask ({exc})") from None


def _seed(*key: int) -> int:
    """A 31-bit seed from ``key`` (DALI takes non-negative int seeds)."""
    return int(np.random.SeedSequence(list(key)).generate_state(1)[0] & 0x7FFFFFFF)


class _Draw:
    """Per-sample uniform draws in [0, 1): one named generator per quantity, shifted per rank."""

    def __init__(self, shift: float) -> None:
        self.shift = shift

    def __call__(self, what: str) -> Any:
        u = fn.random.uniform(range=[0.0, 1.0], name=f"draw_{what}") + self.shift
        # Even rank 0 (shift 0) gets these operators: DALI names operators by their position in the
        # graph, and a checkpoint restores only into a graph with the same names.
        return u - dmath.floor(u)

    @staticmethod
    def pick(u: Any, count: Any) -> Any:
        """An integer in 0..count-1 (float DataNode) from draw ``u``."""
        return dmath.min(dmath.floor(u * count), count - 1)


def _centre_node(slack: Any) -> Any:
    """``presets._centre`` in DALI arithmetic: round(slack / 2) with halves to even."""
    half = slack // 2
    return half + (slack & 1) * (half & 1)


def _relative(anchor: Any, slack: Any) -> Any:
    """An integer anchor as crop_mirror_normalize's relative position ``anchor / slack``.

    DALI turns a position back into an anchor by rounding ``pos * slack`` to
    the nearest integer, which gives ``anchor`` exactly (float32 error is far
    below half a pixel; checked for every slack below 600).
    """
    if isinstance(slack, int):
        return anchor / max(slack, 1)
    return anchor / dmath.max(slack, 1)


def _build(*, files: list[str], indexes: list[str], codec: Any, spec: DataSpec, stored_frames: int,
           preset: ClipPreset, batch_size: int, threads: int, device_id: int | None, prefetch: int, shard: int,
           shards: int, seed: int, epoch: int, initial_fill: int, normalize: bool, checkpoint: bytes | None,
           gate: _StreamGate | None = None, build: bool = True) -> Pipeline:
    """The epoch's pipeline: reader -> decode -> crop/flip/normalise; outputs clip, label, video_id, clip_index
    and the record's shape (checked against ``spec`` by the loader: ``DataSpec.shape_problem``).

    ``gate``: where the payload's decoder sizes its pictures by the stream
    (``Graph.stream_sized``), the check each payload passes before it
    (required there). ``build=False`` returns it defined but not built: DALI
    checks operator arguments and placements while the graph is defined, so
    a GPU graph can be checked that far on a machine without CUDA.
    """
    if build:
        check_gpu(device_id)
    train = preset.train
    graph = graph_for(codec)
    pipe = Pipeline(batch_size=batch_size, num_threads=threads, device_id=device_id,
                    seed=_seed(seed, epoch, 1), prefetch_queue_depth=prefetch, enable_checkpointing=graph.checkpoints,
                    checkpoint=checkpoint if graph.checkpoints else None, **pipeline_options())
    where = "cpu" if device_id is None else "gpu"
    frames_all = stored_frames
    frames = preset.clip_len or frames_all
    side = preset.crop_size
    with pipe:
        if train:
            order = {"random_shuffle": True, "initial_fill": initial_fill, "shuffle_after_epoch": True,
                     "shuffle_after_epoch_seed": _seed(seed, epoch, 2)}
        else:
            order = {"stick_to_shard": True}
        rec = fn.readers.tfrecord(path=files, index_path=indexes, features=reader_features(), shard_id=shard,
                                  num_shards=shards, pad_last_batch=True, name="reader", **order)
        # Decoders that size their output by the record's shape (the raw reshape, the GPU inflate) get it clamped
        # into the conversion's bounds: a forged shape cannot make them allocate more than a clip may take. The
        # loader refuses such a record by its unclamped shape, in one line naming the clip (``_batch``).
        low, high = spec.shape_bounds()
        shape = dmath.clamp(rec["shape"], fn.constant(idata=list(low), dtype=types.INT64),
                            fn.constant(idata=list(high), dtype=types.INT64))
        h, w = shape[1], shape[2]
        draw = _Draw((shard * _GOLDEN) % 1.0)
        # Crop parameters, as ClipPreset.params draws them: window, scale, row, column, flip.
        if train:
            t0 = _Draw.pick(draw("window"), frames_all - frames + 1)
            if preset.multiscale is not None:
                short = dmath.min(h, w)
                k = _Draw.pick(draw("scale"), len(preset.multiscale))
                scale = sum(s * (k == i) for i, s in enumerate(preset.multiscale))
                side = dmath.clamp(dmath.floor(short * scale + 0.5), 1, short)
            y0 = _Draw.pick(draw("row"), h - side + 1)
            x0 = _Draw.pick(draw("column"), w - side + 1)
            flip = fn.cast(draw("flip") < 0.5, dtype=types.INT32) if preset.flip else 0
        else:
            t0 = _centre(frames_all, frames)
            y0, x0 = _centre_node(h - side), _centre_node(w - side)
            flip = 0
        # Per-frame codecs decode only the window's frames; the others decode all and crop in time below.
        data = rec["payload"]
        offsets = fn.cast(rec["part_offsets"], dtype=types.INT32)  # DALI's int arguments take int32 only
        sizes = fn.cast(rec["part_sizes"], dtype=types.INT32)
        decoded_frames = frames_all
        if codec.payload.layout == "frames" and frames < frames_all:
            if train:
                start = fn.cast(t0, dtype=types.INT32)
                offsets = fn.slice(offsets, start=start, shape=frames, axes=[0])
                sizes = fn.slice(sizes, start=start, shape=frames, axes=[0])
            else:
                offsets, sizes = offsets[t0:t0 + frames], sizes[t0:t0 + frames]
            t0, decoded_frames = 0, frames
        # What the payload's pictures say of their size (CPU, nothing decoded), checked by the loader (_batch).
        pictures = [] if graph.picture_sizes is None else [
            graph.picture_sizes(data, offsets=offsets, sizes=sizes, frames=decoded_frames)]
        if graph.stream_sized:
            # Nothing in DALI reads a stream's size before its video decoder allocates by it: the gate reads the
            # stream's headers in Python first (the decoder takes its input from host memory: nothing is copied).
            if gate is None:
                raise ValueError(f"{codec.name} payloads are decoded by the size their streams say: the pipeline "
                                 f"needs a gate checking them")
            data = fn.python_function(data, rec["shape"], rec["video_id"], rec["clip_index"], function=gate,
                                      num_outputs=1)
        if where == "gpu" and not graph.host_input:
            data = data.gpu()
        clips = graph.decode(data, shape=fn.cast(shape, dtype=types.INT32), offsets=offsets, sizes=sizes,
                                  frames=decoded_frames, device=where)
        # As a volume (D = time), one crop_mirror_normalize cuts the window and the square together.
        clips = fn.reshape(clips, layout="DHWC")

        crop = {"crop_d": frames, "crop_pos_z": _relative(t0, decoded_frames - frames), "crop_h": side,
                "crop_w": side, "crop_pos_y": _relative(y0, h - side), "crop_pos_x": _relative(x0, w - side),
                "rounding": "round"}  # the anchor rounding _relative relies on (DALI's default)
        if train and preset.multiscale is not None:
            clips = fn.crop(clips, **crop)
            clips = fn.resize(fn.reshape(clips, layout="FHWC"), size=[preset.crop_size, preset.crop_size],
                              interp_type=types.INTERP_LINEAR, antialias=False)
            clips = fn.reshape(clips, layout="DHWC")
            crop = {}
        if normalize:
            out = {"dtype": types.FLOAT, "mean": list(preset.mean), "std": list(preset.std), "output_layout": "CDHW"}
        else:
            out = {"dtype": types.UINT8, "output_layout": "DHWC"}
        clips = fn.crop_mirror_normalize(clips, mirror=flip, **crop, **out)
        label = rec["label"]
        if device_id is not None:
            label = label.gpu()
        pipe.set_outputs(clips, label, rec["video_id"], rec["clip_index"], rec["shape"], *pictures)
    if build:
        pipe.build()
    return pipe


class DaliTFRecordLoader(DaliLoaderBase):
    """Batches of a TFRecord conversion from DALI's own reader, decoded and cropped by DALI.

    Yields ``{"clip", "label", "video_id", "clip_index", "index", "padding"}``:
    ``clip`` uint8 (N, T, H, W, C), or with ``normalize`` float (N, C, T, H, W)
    = ``(x - mean) / std``; ``label`` int64; ``video_id`` a list of str and
    ``clip_index`` int64 from the records; ``index`` the clip's number in
    ``open_clips(root)``; ``padding`` bool, True for the padding samples of a
    training epoch's last batch (always False in evaluation, which drops
    them). With ``device_id`` set, ``clip`` and ``label`` are on
    ``cuda:device_id``; the rest stays on the CPU.

    ``preset`` (default ``ClipPreset(train=train, seed=seed)``) gives the crop
    size, clip length, flip, multi-scale and mean/std; ``seed`` keys the
    shuffle and the crop draws per epoch. ``threads``: DALI's CPU threads;
    ``prefetch``: batches prepared ahead; ``shuffle_buffer_mb``: the random
    shuffle's buffer, in MB of records (at least one batch, at most a shard).

    ``set_epoch``/``set_position`` (whole batches)/``state_dict``/
    ``load_state_dict`` as the sampler's; the state also carries DALI's
    checkpoint (see the module docstring for what resumes exactly).
    ``close()`` (or ``with``) stops the pipeline; a later iteration builds a
    new one.
    """

    def __init__(self, root: str, *, train: bool, batch_size: int, preset: ClipPreset | None = None, rank: int = 0,
                 world_size: int = 1, device_id: int | None = None, seed: int = 0, threads: int = 2,
                 prefetch: int = 2, normalize: bool = False, shuffle_buffer_mb: float = 256.0,
                 cache: CacheSettings | None = None, spec: SampleSpec | None = None) -> None:
        threads = check_int("threads", threads, 1)
        if preset is not None and (preset.short_side is not None or preset.random_resized is not None):
            raise ValueError(f"{root}: DALI's native TFRecord route draws its crops with DALI's own generators and "
                             f"has no short-side scale or random-resized crop; such a preset is read by the source "
                             f"route (route='source': DaliClipLoader) or by ClipDataset's readers")
        if spec is not None and spec.rule != "clips":
            # DALI's reader hands over one record at a time: a sample assembled from several of a video's clips
            # (and drawn per video, not per record) is not one it can make.
            raise ValueError(f"{root}: DALI's native TFRecord route reads stored clips, one record a sample; "
                             f"samples of {spec} are assembled by the source route (route='source': "
                             f"DaliClipLoader) or by ClipDataset's readers")
        if isinstance(shuffle_buffer_mb, bool) or not isinstance(shuffle_buffer_mb, (int, float)) \
                or not shuffle_buffer_mb > 0:
            raise ValueError(f"shuffle_buffer_mb must be a number > 0, got {shuffle_buffer_mb!r}")
        self._setup(root, train=train, batch_size=batch_size, preset=preset, rank=rank, world_size=world_size,
                    device_id=device_id, seed=seed, prefetch=prefetch, normalize=normalize, cache=cache, spec=spec)
        self.threads = threads
        manifest = self.store.manifest
        if manifest.data.backend != "tfrecord":
            raise ValueError(f"{root}: holds {manifest.data.backend} shards; DALI's native reader reads "
                             f"TFRecord conversions only (use loaders.dali.DaliClipLoader)")
        refuse_without_gpu(root, self.store.codec, device_id)
        if device_id is None and not graph_for(self.store.codec).cpu:
            raise ValueError(f"{root}: DALI decodes {self.codec} clips on a GPU only, and there is none for it here "
                             f"(without one, DALI's TFRecord reader takes {' and '.join(cpu_codecs())} "
                             f"conversions); read this one with --loader threads, which decodes {self.codec} on "
                             f"the CPU")
        preset = self.preset
        if not self._stored_shape:
            short = int(manifest.data.frame_size.short_side or 0)
            if preset.multiscale is None and preset.crop_size > short:
                raise ValueError(f"crop_size {preset.crop_size} does not fit frames of short side {short}")
        self._files, self._indexes = [], []
        for s in manifest.shards:
            for f in s.extras.get("files", []):
                self._files.append(os.path.join(self.store.root, s.path, f["path"]))
                self._indexes.append(os.path.join(self.store.root, s.path, f["index"]))
        n, world = len(self.store), self.world_size
        if n < world:
            raise ValueError(f"{root}: {n} clips cannot be shared by {world} ranks")
        # DALI's shards: contiguous ranges, each padded to the largest one, in whole batches.
        self._real = shard_sizes(n, world)[self.rank]
        self._steps = padded_steps(n, world, self.batch_size)
        # The shuffle buffer holds whole records: size it in bytes (raw clips are ~1 MB, jpeg ~50 kB).
        mean_bytes = manifest.totals.value_bytes / max(1, n)
        self.initial_fill = int(min(max(shard_sizes(n, world)), max(self.batch_size,
                                                                     shuffle_buffer_mb * 2**20 // mean_bytes)))
        firsts = np.cumsum(self.store.video_clips) - self.store.video_clips
        self._first = dict(zip(self.store.video_ids, firsts.tolist()))
        self._at: tuple[int, int] | None = None  # (epoch, samples read) of the pipeline in the slot
        # A checkpoint to build (epoch, position) from, and the clips this rank had read by then (None: unknown).
        self._resume: tuple[int, int, bytes, np.ndarray | None] | None = None
        # The clips of epoch _at[0] read so far (this rank's; after an elastic resume, every rank's of both runs).
        self._read: np.ndarray | None = None
        # An epoch to finish through the source route after a resume on another configuration: (epoch, the
        # clips every rank of the saving run had read).
        self._elastic: tuple[int, np.ndarray] | None = None
        self._source: Any = None  # the source-route loader reading that rest
        self._gate: _StreamGate | None = None  # the current pipeline's check of video streams (Graph.stream_sized)

    # -- sizes ----------------------------------------------------------------
    @property
    def num_real(self) -> int:
        """Clips this rank reads per epoch, padding not counted."""
        return self._real

    @property
    def num_samples(self) -> int:
        """Samples this rank reads per epoch, padding included (``steps_per_epoch * batch_size``)."""
        return self._steps * self.batch_size

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch, the same on every rank."""
        return self._steps

    def __len__(self) -> int:
        return self._steps

    # -- position and state ---------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if self._resume is not None and self._resume[0] != self.epoch:
            self._resume = None
        if self._elastic is not None and self._elastic[0] != self.epoch:
            self._elastic = None

    def set_position(self, position: int) -> None:
        """Start this epoch's iteration after ``position`` samples (a whole number of batches)."""
        if operator.index(position) % self.batch_size:
            raise ValueError(f"position must be a multiple of the batch size {self.batch_size} on the native "
                             f"DALI route, got {position}")
        super().set_position(position)

    def _config(self) -> dict:
        # What a checkpoint depends on: the sharding, the batches, the graph (its operator names) and DALI.
        return {"world_size": self.world_size, "batch_size": self.batch_size, "seed": self.seed,
                "clips": self.num_clips, "files": len(self._files), "preset": repr(self.preset),
                "gpu": self.device_id is not None, "normalize": self.normalize, "dali": dali.__version__}

    def state_dict(self, consumed: int | None = None) -> dict:
        """``{"epoch", "position"}``, plus DALI's checkpoint (``"dali"``) when the position is inside the epoch.

        ``consumed``: samples of this epoch used (default: the position set);
        it must be where the pipeline stands (every batch handed out used) or
        the position a checkpoint was loaded for.
        """
        state = super().state_dict(consumed)
        position = state["position"]
        if position == 0 or position >= self.num_samples:
            return state
        read = self._read
        if self._slot.pipe is not None and self._at == (self.epoch, position):
            # A graph DALI cannot checkpoint saves an empty one: the resume then reads up to the position.
            ckpt = self._slot.pipe.checkpoint() if graph_for(self.store.codec).checkpoints else b""
        elif self._resume is not None and self._resume[:2] == (self.epoch, position):
            ckpt, read = self._resume[2], self._resume[3]
        elif self._elastic is not None and self._at == (self.epoch, position):
            ckpt = None  # inside the rest of an elastic epoch: no DALI reader stands anywhere
        elif self._elastic is not None and self._elastic[0] == self.epoch and self.position == position:
            ckpt, read = None, self._elastic[1]  # loaded, not yet read on
        else:
            at = f"epoch {self._at[0]} position {self._at[1]}" if self._at else "nothing read"
            raise ValueError(f"the native DALI route saves where its pipeline stands ({at}), not at epoch "
                             f"{self.epoch} position {position}")
        if ckpt is not None:
            state["dali"] = {"checkpoint": base64.b64encode(ckpt).decode("ascii"), **self._config()}
        if read is not None:
            state["read"] = _pack(read)
        return state

    @staticmethod
    def merge_rank_states(states: list[dict]) -> dict:
        """One state for every rank of a run from each rank's ``state_dict`` (in rank order): rank 0's (its DALI
        checkpoint restores every rank, which share one seed) with ``read``, the clips of the epoch read so far,
        over all ranks. What a resume on another world size or batch size needs to read the rest of the epoch
        exactly (``load_state_dict``); without every rank's ``read`` the merged state has none."""
        if not states:
            raise ValueError("merge_rank_states needs the state of every rank, got none")
        merged = dict(states[0])
        merged.pop("read", None)
        if all("read" in st for st in states):
            masks = [_unpack(st["read"]) for st in states]
            if len({m.size for m in masks}) == 1:
                merged["read"] = _pack(np.logical_or.reduce(masks))
        return merged

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``; its DALI checkpoint is used when it was made with this configuration."""
        saved = state.get("dali")
        same = isinstance(saved, dict) and {k: saved.get(k) for k in self._config()} == self._config()
        if not same and "position" in state:
            # Saved with another batch size or world size: the same global position (samples of all ranks),
            # in whole batches of this run. DALI deals an epoch by world size and batch, so the rest of the
            # epoch is exact only through the clips the state says were read (``read``, below); a state
            # without them goes on at this position of this run's sharding (the module docstring).
            saved_world = int(state.get("world_size", self.world_size))
            where = int(state.get("global_position", int(state["position"]) * saved_world))
            p = min(where // self.world_size, self.num_samples)
            p -= p % self.batch_size
            state = {**state, "position": p, "world_size": self.world_size,
                     "global_position": p * self.world_size}
        super().load_state_dict(state)  # through set_position: a whole number of batches
        self._resume = self._elastic = None
        read = _unpack(state["read"]) if "read" in state else None
        if read is not None and read.size != self.num_clips:
            raise ValueError(f"the state's read clips are of {read.size} clips; {self.root} holds {self.num_clips}")
        if same and self.position and isinstance(saved, dict):
            self._resume = (self.epoch, self.position, base64.b64decode(saved["checkpoint"]), read)
        elif self.position and read is not None:
            # Another world size or batch (or saved inside such an epoch's rest): DALI's reader would deal the
            # epoch otherwise, so the clips not read yet are read through the source route instead.
            self._elastic = (self.epoch, read)

    # -- iteration ------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        self._token += 1
        first = self.position // self.batch_size
        if first >= self._steps:
            return iter(())
        if self._elastic is not None and self._elastic[0] == self.epoch and self.position:
            return self._rest(self._token, self.epoch, first)
        return self._batches(self._token, self.epoch, first)

    def rest_of_epoch(self, epoch: int, read: np.ndarray, first: int) -> tuple[np.ndarray, int]:
        """This rank's clips for batches ``first..`` of an epoch of which the clips ``read`` (a mask, all
        ranks) were read on another configuration: the clips not read, in the sampler's global order of the
        epoch (``DistributedClipSampler``, seed, epoch), dealt round-robin over this run's ranks, then padded
        with this rank's last one to the epoch's remaining whole batches (``steps_per_epoch`` is the same on
        every rank, so the ranks stay in step). Returns (the clips, how many of them are real: the rest pad)."""
        order = DistributedClipSampler(self.num_clips, num_replicas=1, rank=0, seed=self.seed,
                                       with_epoch=False).global_order(epoch)
        left = order[~read[order]]
        mine = left[self.rank::self.world_size]
        size = (self._steps - first) * self.batch_size
        if mine.size > size:
            raise ValueError(f"{self.root}: {left.size} clips of epoch {epoch} are left, more than {self.world_size} "
                             f"rank(s) read in the {self._steps - first} batches of {self.batch_size} left")
        last = mine[-1] if mine.size else order[-1]
        return np.concatenate([mine, np.full(size - mine.size, last, dtype=np.int64)]), int(mine.size)

    def _rest(self, token: int, epoch: int, first: int) -> Iterator[dict]:
        """The rest of an epoch begun on another configuration, read through the source route (``_elastic``)."""
        from .source import DaliClipLoader

        self.close()
        read = self._elastic[1].copy() if self._elastic is not None else np.zeros(self.num_clips, dtype=bool)
        share, real = self.rest_of_epoch(epoch, read, first)
        padding = np.arange(share.size) >= real  # the real clips come first
        self._source = DaliClipLoader(self.root, train=True, batch_size=self.batch_size, preset=self.preset,
                                      rank=self.rank, world_size=self.world_size, device_id=self.device_id,
                                      seed=self.seed, workers=0, prefetch=self.prefetch, normalize=self.normalize,
                                      drop_last=True, share=share)
        self._source.set_epoch(epoch)
        self._read, self._at = read, (epoch, first * self.batch_size)
        bs = self.batch_size
        for b, batch in enumerate(self._source):
            if token != self._token:
                raise RuntimeError("this DaliTFRecordLoader iterator was superseded by a newer iter() of the loader")
            pad = torch.from_numpy(padding[b * bs:(b + 1) * bs].copy())
            read[batch["index"][~pad].numpy()] = True
            self._at = (epoch, (first + b + 1) * bs)
            yield {**batch, "padding": pad}

    def _batches(self, token: int, epoch: int, first: int) -> Iterator[dict]:
        pipe = self._attach(epoch, first * self.batch_size)
        stream = torch.cuda.current_stream(self.device) if self.device is not None else None
        for b in range(first, self._steps):
            if token != self._token:
                raise RuntimeError("this DaliTFRecordLoader iterator was superseded by a newer iter() of the loader")
            outs = self._run(pipe, stream)
            self._at = (epoch, (b + 1) * self.batch_size)
            batch = self._batch(outs, b * self.batch_size, stream)
            self._mark_read(batch)
            if batch is not None:
                yield batch

    def _attach(self, epoch: int, position: int) -> Pipeline:
        """A pipeline whose next batch is (epoch, position): the one in the slot, or a new one."""
        at = self._at
        if self._slot.pipe is not None and at is not None:
            if at == (epoch, position):
                return self._slot.pipe
            if not self.train and position == 0 and at[1] == self.num_samples:
                return self._slot.pipe  # evaluation passes are all alike: read on into the next
        self.close()
        ckpt = None
        if self._resume is not None and self._resume[:2] == (epoch, position):
            ckpt = self._resume[2] or None  # empty: saved from a graph without checkpoints, read up to it below
        build = functools.partial(self._pipeline, epoch)
        try:
            self._slot.pipe = pipe = build(checkpoint=ckpt)
        except RuntimeError as exc:
            if ckpt is None:
                raise
            warnings.warn(f"{self.root}: DALI refused the saved checkpoint ({str(exc).splitlines()[0]}); "
                          f"reading up to position {position} of epoch {epoch} instead", RuntimeWarning, stacklevel=2)
            ckpt = None
            self._slot.pipe = pipe = build(checkpoint=None)
        meta = pipe.reader_meta("reader")
        padded = self.world_size * max(shard_sizes(self.num_clips, self.world_size))
        if (meta["epoch_size"], meta["epoch_size_padded"]) != (self.num_clips, padded):
            self.close()
            raise RuntimeError(f"{self.root}: DALI's reader sees {meta['epoch_size']} records "
                               f"({meta['epoch_size_padded']} padded); the manifest lists {self.num_clips} clips "
                               f"({padded} padded)")
        self._at = (epoch, position if ckpt is not None else 0)
        loaded = self._resume[3] if ckpt is not None and self._resume is not None else None
        self._read = (loaded.copy() if loaded is not None else None) if ckpt is not None else \
            np.zeros(self.num_clips, dtype=bool)
        # No checkpoint for this position: read up to it (exact, but it costs the reading).
        for b in range(self._at[1] // self.batch_size, position // self.batch_size):
            self._mark_read(self._batch(self._run(pipe, None), b * self.batch_size, None, pixels=False))
        self._at = (epoch, position)
        return pipe

    def _mark_read(self, batch: dict | None) -> None:
        """Count the real clips of a batch this rank read (``_read``, what ``state_dict`` saves as ``read``)."""
        if batch is not None and self._read is not None:
            self._read[batch["index"][~batch["padding"]].numpy()] = True

    def _pipeline(self, epoch: int, checkpoint: bytes | None = None, build: bool = True) -> Pipeline:
        """Epoch ``epoch``'s pipeline for this rank (``build=False``: defined only)."""
        if build:
            # A remote conversion: DALI's reader opens the part and index files itself, so every shard the
            # pipeline may read is fetched and held in the cache first (refused in one line when they cannot
            # all fit): DALI's own file-level shuffle decides which parts each epoch reads.
            self.store.hold_all(range(len(self.store.manifest.shards)))
        self._gate = _StreamGate(store=self.store, first=self._first)
        return _build(files=self._files, indexes=self._indexes, codec=self.store.codec, spec=self.store.manifest.data,
                      stored_frames=self._stored_frames, preset=self.preset, batch_size=self.batch_size,
                      threads=self.threads, device_id=self.device_id, prefetch=self.prefetch, shard=self.rank,
                      shards=self.world_size, seed=self.seed, epoch=epoch, initial_fill=self.initial_fill,
                      normalize=self.normalize, checkpoint=checkpoint, gate=self._gate, build=build)

    def _run(self, pipe: Pipeline, stream: Any) -> Any:
        """The pipeline's next outputs; on a failure the pipeline is closed and ``run_pipeline``'s FormatError
        raised."""
        try:
            return run_pipeline(pipe, stream, self.root)
        except FormatError:
            self.close()
            refusal = self._gate.refusal if self._gate is not None else None
            if refusal is not None:
                raise refusal from None  # the gate's own line, not DALI's wrapping of it
            raise

    def _batch(self, outs: Any, start: int, stream: Any, *, pixels: bool = True) -> dict | None:
        """The batch of pipeline outputs ``outs`` that starts at sample ``start`` of this rank's epoch (None: a
        batch of evaluation padding only); ``pixels=False`` leaves out ``clip`` and ``label``, for batches that
        are only counted (read up to a position)."""
        clips_tl, labels_tl, ids_tl, index_tl, shapes_tl, *pictures_tl = outs
        bs = self.batch_size
        real = max(0, min(bs, self._real - start))
        n = bs if self.train else real
        if n == 0:
            return None  # evaluation: a batch of padding only
        video_ids = [bytes(np.asarray(ids_tl[i])).decode("utf-8") for i in range(n)]
        clip_index = torch.from_numpy(np.array(index_tl.as_tensor()).reshape(-1)[:n].astype(np.int64))
        try:
            index = torch.tensor([self._first[v] + c for v, c in zip(video_ids, clip_index.tolist())],
                                 dtype=torch.int64)
        except KeyError as exc:
            raise FormatError(f"{self.root}: a record holds video {exc.args[0]!r}, which the manifest's shards "
                               f"do not list") from None
        spec = self.store.manifest.data
        for k in range(n):
            shape = tuple(np.asarray(shapes_tl[k]).tolist())
            problem = spec.shape_problem(shape)
            if problem is None and pictures_tl:
                # The frames handed to the decoder (the window's, where only those are decoded), in order.
                sizes = [tuple(row) for row in np.asarray(pictures_tl[0][k]).reshape(-1, 3).tolist()]
                j = next((j for j, size in enumerate(sizes) if size != shape[1:]), None)
                if j is not None:
                    problem = f"{self.codec} frame {j} is {sizes[j]}, header says {shape[1:]}"
            if problem is not None:
                self.close()
                raise FormatError(f"{self.store.where(int(index[k]))}: {problem}")
        batch = {"video_id": video_ids, "clip_index": clip_index, "index": index, "padding": torch.arange(n) >= real}
        if not pixels:
            return batch
        return {"clip": to_torch(clips_tl, self.device, stream)[:n],
                "label": to_torch(labels_tl, self.device, stream).reshape(-1)[:n], **batch}

    def close(self) -> None:
        """Stop the pipeline and free its threads and memory (a later iteration builds a new one)."""
        if self._source is not None:
            self._source.close()
            self._source = None
        super().close()
        self._at = None
