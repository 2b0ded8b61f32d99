"""``python -m benchmarks.sampling``: many sampling geometries read from one conversion, against decoding on the fly.

Issue 37's claim, measured: one conversion at a short side (the default
clips: each video's frame timeline, FORMAT.md) serves every sampling
geometry at read time (``ClipDataset(spec=)``, ``loaders.sampling``), where
the usual alternative decodes the source videos for every sample. For each
geometry (``T x s @ crop``: T frames at step s from a random window, SlowFast's
``32x2a4`` and TSN's ``tsn8``) and each codec of the conversion, it times
reader-thread samples/s (``build_loader(threads=N)``) against the same
samples (the same frame indices and crops, drawn from the same keys)
decoded from the source videos per sample, in the same reader threads:

  PyAV      decode from the video's start up to the last frame a sample needs
            (mmaction2's PyAVDecode: no seek), only the frames kept resized to
            the conversion's frame size and converted to RGB in one libswscale
            call, then the preset's crop
  decord    ``VideoReader(width=, height=)`` + ``get_batch`` (seek to the
            keyframe before, decode, resize: VideoMAE's reader), then the crop;
            the column is skipped, saying so, where decord does not import

Every configuration runs ``--rounds`` times, rounds interleaved (the machine
may be shared), the best kept; each ratio is of the bests with, in
parentheses, the median of the ratios within each round. Then the bytes of
the one conversion against the conversions each geometry would need on its
own (converted here from the same videos with its clip settings: ``--clip-len
T --stride s``; geometries with the same settings share one), and a cProfile
of one geometry's reads, by function, for where the time goes. Nothing is
asserted; docs/benchmarks.md records and discusses the tables.
"""

from __future__ import annotations

import argparse
import cProfile
import math
import os
import pstats
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from benchmarks import scratch_folder
from benchmarks.conversion import DEFAULT_SHARED, build_tree
from benchmarks.loaders.common import Config, DatasetMaker, Results, Rounds, paired, run_rounds
from convert.format import FormatError, read_manifest
from convert.format.system import cpu_count
from convert.store import ClipStore, open_clips
from loaders import ClipDataset
from loaders.presets import ClipPreset, apply
from loaders.sampling import SampleSpec, VideoSamples

# Real footage of the shared test videos, each long enough for a 64-frame window: Kinetics (arm wrestling,
# 340x256 h264), UCF101 (320x240 MPEG-4 in AVI) and a film leader (294x240 h264).
VIDEOS = ["mmaction2__demo.mp4", "mmaction2__test.avi", "mmcv__test.mp4"]
GEOMETRIES = "16x1@112,16x4@224,32x2@224,64x1@224,32x2a4@224,tsn8@224"
AIM_GEOMETRY = "16x4@224"  # the aims: h264 at least 2x, jpeg 10x, the faster on-the-fly reader
READERS = ("pyav", "decord")
READER_NAMES = {"pyav": "PyAV", "decord": "decord"}
# The clip settings of the timeline conversion: ConvertConfig's default clips (16 frames, stride 1, tiling).
TIMELINE = (16, 1)


@dataclass(frozen=True, kw_only=True)
class Geometry:
    """One sampling geometry: which frames a sample is (``spec``), cropped to ``crop`` pixels square."""

    text: str  # as given: 16x4@224, 32x2a4@224, tsn8@224
    spec: SampleSpec
    crop: int

    @property
    def label(self) -> str:
        """The geometry as the table names it."""
        spec = self.spec
        if spec.rule == "segments":
            return f"TSN {spec.frames} segments @{self.crop}"
        if spec.alpha:
            return f"SlowFast {spec.frames}x{spec.step} a{spec.alpha} @{self.crop}"
        return f"{spec.frames}x{spec.step} @{self.crop}"

    @property
    def settings(self) -> tuple[int, int]:
        """(clip length, stride) of a conversion made for this geometry alone: its window as the stored clip;
        TSN's segments may fall on any frame, so they need every frame (the timeline's settings)."""
        if self.spec.rule == "segments":
            return TIMELINE
        return self.spec.length, self.spec.step


def parse_geometry(text: str) -> Geometry:
    """``TxS@C`` (T frames at step S, crop C), ``TxSaA@C`` (SlowFast, alpha A) or ``tsnN@C`` (N segments)."""
    m = re.fullmatch(r"(\d+)x(\d+)(?:a(\d+))?@(\d+)", text.strip())
    try:
        if m:
            frames, step, alpha, crop = m.groups()
            spec = SampleSpec(frames=int(frames), step=int(step), rule="window",
                              alpha=int(alpha) if alpha else None)
            return Geometry(text=text.strip(), spec=spec, crop=int(crop))
        m = re.fullmatch(r"tsn(\d+)@(\d+)", text.strip())
        if m:
            return Geometry(text=text.strip(), spec=SampleSpec(frames=int(m.group(1)), rule="segments"),
                            crop=int(m.group(2)))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"geometry {text!r}: {exc}") from exc
    raise argparse.ArgumentTypeError(f"geometry must be TxS@C, TxSaA@C or tsnN@C (e.g. 16x4@224), got {text!r}")


def _pyav_frames(path: str, indices: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Frames ``indices`` of the video at ``path``, resized to ``size``, as mmaction2's PyAVDecode reads them."""
    from convert.worker.decode import open_video

    h, w = size
    out = np.empty((len(indices), h, w, 3), dtype=np.uint8)
    rows: dict[int, list[int]] = {}
    for k, j in enumerate(indices.tolist()):
        rows.setdefault(j, []).append(k)
    last, n = max(rows), -1
    with open_video(path) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1  # one core per reader thread, as the conversion's readers
        for n, frame in enumerate(container.decode(stream)):
            if n in rows:
                first, *rest = rows[n]
                out[first] = frame.reformat(width=w, height=h, format="rgb24").to_ndarray()
                for k in rest:
                    out[k] = out[first]
            if n == last:
                break
    if n < last:
        raise FormatError(f"{path}: {n + 1} frames decoded, frame {last} asked")
    return out


def _decord_frames(path: str, indices: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Frames ``indices`` of the video at ``path``, resized to ``size``, as VideoMAE reads them (decord)."""
    import decord

    reader = decord.VideoReader(path, width=size[1], height=size[0], num_threads=1)
    frames: np.ndarray = reader.get_batch(indices.tolist()).asnumpy()
    return frames


DECODERS: dict[str, Callable[[str, np.ndarray, tuple[int, int]], np.ndarray]] = {
    "pyav": _pyav_frames, "decord": _decord_frames}


class OnTheFlySamples(Dataset):
    """The samples ``ClipDataset(spec=)`` reads from a conversion, decoded from its source videos per sample.

    The same frame indices (``VideoSamples`` over the conversion's timeline
    lengths, keyed by the same seed) and the same crops (the same preset), at
    the conversion's frame size; read by ``build_loader(threads=N)`` through
    ``batch_fields`` and ``read_into`` as ``ClipDataset`` is.
    """

    def __init__(self, *, store: ClipStore, paths: Sequence[str], geometry: Geometry, reader: str,
                 seed: int = 0) -> None:
        self.samples = VideoSamples(spec=geometry.spec, lengths=store.video_frames, train=True, seed=seed)
        self.preset = ClipPreset(train=True, crop_size=geometry.crop, clip_len=geometry.spec.length, seed=seed)
        self.paths = list(paths)
        self.sizes = [store.frame_shape(v) for v in range(len(self.paths))]
        self.decode = DECODERS[reader]

    def __len__(self) -> int:
        return len(self.samples)

    def batch_fields(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """What a batch holds: the crops, and each sample's index."""
        return {"clip": (self.preset.out_shape(self.samples.spec.length), torch.uint8), "index": ((), torch.int64)}

    def read_into(self, items: Sequence[Any], out: dict[str, np.ndarray]) -> dict[str, list]:
        """Decode each item's frames from its source video and crop them into its row of ``out``."""
        for pos, (epoch, i) in enumerate(items):
            v = self.samples.video(i)
            frames = self.decode(self.paths[v], self.samples.indices(epoch, i), self.sizes[v])
            apply(frames, self.preset.params(epoch, i, frames.shape), out=out["clip"][pos])
            out["index"][pos] = i
        return {}


def _decord_problem() -> str | None:
    """Why the decord column is skipped (None: it runs)."""
    try:
        import decord  # noqa: F401 - its import is the check
    except ImportError as exc:
        return f"decord does not import ({exc}; pip install decord)"
    return None


# -- the data ----------------------------------------------------------------------------------------------------------

def source_tree(args: argparse.Namespace, folder: str) -> tuple[str, str]:
    """(folder of class folders of videos, what they are): the real shared videos, or synthetic ones."""
    tree = os.path.join(folder, "videos")
    found = [n for n in args.names if os.path.exists(os.path.join(args.shared, n))]
    if found and not args.synthetic:
        build_tree(tree, args.shared, args.videos, names=found)
        return tree, f"{args.videos} real videos ({', '.join(found)} in turn)"
    from convert.synth import make_dataset

    per_class = max(1, math.ceil(args.videos / 5))  # convert.synth makes five motion classes
    paths = make_dataset(tree, per_class=per_class, seconds=args.synth_seconds, workers=args.workers)
    why = "asked for" if args.synthetic else f"none of {', '.join(args.names)} in {args.shared}"
    return tree, f"{len(paths)} synthetic videos of about {args.synth_seconds:g} s ({why})"


def convert(tree: str, out: str, *, codec: str, short_side: int, settings: tuple[int, int], workers: int,
            tail: str = "drop") -> int:
    """Convert ``tree`` into ``out`` at ``short_side`` with clips of ``settings`` (length, stride) and ``tail``
    (``--tail``: the timeline keeps every frame); its bytes."""
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    shutil.rmtree(out, ignore_errors=True)
    clip_len, stride = settings
    run_job(tree, out, ConvertConfig(codec=codec, size=None, short_side=short_side, clip_len=clip_len, stride=stride,
                                     tail=tail), JobOptions(workers=workers, progress=False))
    totals = read_manifest(out).totals
    if totals.videos == 0:
        raise SystemExit(f"{out}: the conversion stored no video")
    return totals.value_bytes


def video_paths(tree: str, store: ClipStore) -> list[str]:
    """The source file of each video number of ``store`` (a conversion of ``tree``)."""
    from convert.worker.sources import load_source

    by_id = {item.id: item.path for item in load_source(tree).items}
    return [by_id[vid] for vid in store.video_ids]


# -- the tables --------------------------------------------------------------------------------------------------------

def _name(geometry: Geometry, reader: str) -> str:
    return f"{geometry.text} {reader}"


def _ratio(best: Results, rounds: Rounds, a: str, b: str, n: int) -> str:
    """Rate ``a`` / rate ``b`` of the bests, with the median of the per-round ratios in parentheses."""
    if (a, n) not in best or (b, n) not in best:
        return "-"
    med = paired(rounds, ("threads", a, n), ("threads", b, n))
    return f"{best[(a, n)]['clips_s'] / best[(b, n)]['clips_s']:.1f}x ({med:.1f})" if med else "-"


def rate_table(geometries: list[Geometry], codecs: list[str], readers: list[str], best: Results, rounds: Rounds,
               n: int) -> None:
    """Samples/s of every geometry from each codec and each on-the-fly reader, and their ratios, side by side."""
    heads = [f"{c} /s" for c in codecs] + [f"{READER_NAMES[r]} /s" for r in readers]
    heads += [f"{c} x {READER_NAMES[r]}" for c in codecs for r in readers]
    print(f"\nSamples/s through build_loader(threads={n}), best of {len(rounds)} interleaved rounds; "
          f"a x b: the ratio of the bests (median of the ratios within each round)")
    print("| geometry | " + " | ".join(heads) + " |")
    print("|---" * (len(heads) + 1) + "|")
    for g in geometries:
        cells = [f"{best[(_name(g, x), n)]['clips_s']:.1f}" for x in [*codecs, *readers]]
        cells += [_ratio(best, rounds, _name(g, c), _name(g, r), n) for c in codecs for r in readers]
        print(f"| {g.label} | " + " | ".join(cells) + " |")
    aim = next((g for g in geometries if g.text == AIM_GEOMETRY), None)
    if aim is not None and readers:
        faster = max(readers, key=lambda r: best[(_name(aim, r), n)]["clips_s"])
        said = {"h264": "aim 2x", "jpeg": "aim 10x"}
        parts = [f"{c} {best[(_name(aim, c), n)]['clips_s'] / best[(_name(aim, faster), n)]['clips_s']:.1f}x"
                 f"{' (' + said[c] + ')' if c in said else ''}" for c in codecs]
        print(f"At {aim.label}, against the faster on-the-fly reader ({READER_NAMES[faster]}): {', '.join(parts)}.")


def bytes_table(geometries: list[Geometry], codecs: list[str], sizes: dict[tuple[str, tuple[int, int]], int],
                source_bytes: int) -> None:
    """The one conversion's bytes against the conversions each geometry would need on its own."""
    print("\nBytes of clip values (headers and payloads), MB: the one timeline conversion against one conversion "
          "per geometry (same videos, same short side)")
    print("| conversion | clip settings | " + " | ".join(f"{c} MB" for c in codecs) + " |")
    print("|---|---|" + "---|" * len(codecs))

    def row(what: str, settings: str, values: list[float]) -> None:
        print(f"| {what} | {settings} | " + " | ".join(f"{v:.1f}" for v in values) + " |")

    one = [sizes[(c, TIMELINE)] / 1e6 for c in codecs]
    row("one timeline (every geometry)", f"--clip-len {TIMELINE[0]}", one)
    seen: dict[tuple[int, int], str] = {}
    for g in geometries:
        t, s = g.settings
        shared = seen.get(g.settings)
        settings = f"--clip-len {t}" + (f" --stride {s}" if s > 1 else "") + (f" (as {shared})" if shared else "")
        seen.setdefault(g.settings, g.label)
        row(f"for {g.label} alone", settings, [sizes[(c, g.settings)] / 1e6 for c in codecs])
    distinct = sorted({g.settings for g in geometries})
    total = [sum(sizes[(c, st)] for st in distinct) / 1e6 for c in codecs]
    print(f"| sum of the per-geometry conversions ({len(distinct)} distinct settings) | | "
          + " | ".join(f"{v:.1f} ({v / o:.2f}x the one)" for v, o in zip(total, one)) + " |")
    print(f"Source videos: {source_bytes / 1e6:.1f} MB. A geometry's own conversion stores its windows at one "
          f"fixed phase (clip starts one span apart); the timeline serves windows starting at any frame.")


def _category(func: tuple[str, int, str]) -> str:
    path, _, name = func
    return name if path == "~" else f"{os.path.basename(path)}:{name}"


def decoded_frames(samples: VideoSamples, items: Sequence[tuple[int, int]], clip_len: int) -> dict[str, float]:
    """Frames each way of reading decodes per sample, on average over ``items``: a video codec's timeline
    (each clip touched from its start to its last frame asked), a per-frame codec's (each distinct frame
    asked) and PyAV from the video's start (up to the last frame asked)."""
    timeline = per_frame = from_start = 0
    for epoch, i in items:
        idx = samples.indices(epoch, i)
        chunk, within = np.divmod(idx, clip_len)
        timeline += sum(int(within[chunk == c].max()) + 1 for c in np.unique(chunk))
        per_frame += int(np.unique(idx).size)
        from_start += int(idx.max()) + 1
    n = max(1, len(items))
    return {"video codec timeline": timeline / n, "per-frame codec": per_frame / n,
            "PyAV from the start": from_start / n}


def profile_reads(geometry: Geometry, datasets: dict[str, Callable[[], Any]], samples: int, top: int,
                  store: ClipStore) -> None:
    """cProfile of ``samples`` samples read one by one in this thread by each reader: the functions taking
    the most of its own time (C calls from Python included: decoding, libswscale, copies), and the frames
    each way decodes per sample."""
    items = [(1, i % (len(store.video_ids) * geometry.spec.per_video(True))) for i in range(samples)]
    counts = decoded_frames(VideoSamples(spec=geometry.spec, lengths=store.video_frames, train=True), items,
                            store.manifest.data.clip.clip_len)
    print(f"\nWhere the time goes: {samples} samples of {geometry.label} read in one thread, cProfile, the "
          f"{top} functions with the most own time (share of the reads' time). Frames decoded per sample of "
          f"{geometry.spec.length} kept: " + ", ".join(f"{k} {v:.0f}" for k, v in counts.items()))
    for name, make in datasets.items():
        ds = make()
        fields = ds.batch_fields()
        out = {k: np.empty((1, *shape), dtype=torch.empty((), dtype=dt).numpy().dtype)
               for k, (shape, dt) in fields.items()}
        ds.read_into([(0, 0)], out)  # imports and first-use costs outside the profile
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for item in items:
            ds.read_into([item], out)
        prof.disable()
        wall = time.perf_counter() - t0
        stats: dict = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        total = sum(v[2] for v in stats.values()) or 1.0
        ranked = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
        cells = ", ".join(f"{_category(f)} {v[2] / total:.0%}" for f, v in ranked)
        print(f"- {name} ({samples / wall:.1f} samples/s in one thread): {cells}")


# -- the run -----------------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    """Convert, time every geometry from every codec and on the fly, print the tables."""
    geometries: list[Geometry] = args.geometries
    readers = list(args.readers)
    if "decord" in readers:
        problem = _decord_problem()
        if problem is not None:
            print(f"decord column skipped: {problem}", flush=True)
            readers.remove("decord")
    from convert.worker import forkserver

    with scratch_folder(args.tmp, "sampling-bench-") as folder:
        tree, what = source_tree(args, folder)
        source_bytes = sum(os.path.getsize(os.path.realpath(os.path.join(d, f)))
                           for d, _, names in os.walk(tree) for f in names)
        t = time.perf_counter()
        settings = [TIMELINE] + sorted({g.settings for g in geometries} - {TIMELINE}) if args.sizes else [TIMELINE]
        sizes: dict[tuple[str, tuple[int, int]], int] = {}
        roots = {}
        for codec in args.codecs:
            for st in settings:
                out = os.path.join(folder, f"{codec}_{st[0]}x{st[1]}")
                sizes[(codec, st)] = convert(tree, out, codec=codec, short_side=args.short_side, settings=st,
                                             workers=args.workers, tail="keep" if st == TIMELINE else "drop")
                if st == TIMELINE:
                    roots[codec] = out
        forkserver.stop()  # no idle server beside the timed readers
        store = open_clips(roots[args.codecs[0]])
        paths = video_paths(tree, store)
        print(f"{what}; short side {args.short_side}; {len(settings) * len(args.codecs)} conversions in "
              f"{time.perf_counter() - t:.0f} s; timeline frames per video {store.video_frames.tolist()}; "
              f"{args.threads} reader threads, batch {args.batch_size}, {args.seconds:g} s per configuration, "
              f"{args.rounds} rounds; {cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)

        def dataset(g: Geometry, reader: str) -> Callable[[], Dataset]:
            if reader in roots:
                return lambda: ClipDataset(roots[reader], train=True, preset=ClipPreset(train=True, crop_size=g.crop),
                                           spec=g.spec)
            return lambda: OnTheFlySamples(store=store, paths=paths, geometry=g, reader=reader)

        makers: dict[str, DatasetMaker] = {}
        configs: list[Config] = []
        for g in geometries:
            for reader in [*args.codecs, *readers]:
                makers[_name(g, reader)] = (dataset(g, reader), None)
                configs.append((_name(g, reader), "threads", args.threads))
        run_args = argparse.Namespace(rounds=args.rounds, batch_size=args.batch_size, seconds=args.seconds,
                                      start_method=None)
        _, best, rounds = run_rounds(configs, makers, {}, run_args)
        rate_table(geometries, args.codecs, readers, best, rounds, args.threads)
        if args.sizes:
            bytes_table(geometries, args.codecs, sizes, source_bytes)
        chosen = [g for g in geometries if g.text == args.profile]
        if chosen and args.profile_samples > 0:
            profile_reads(chosen[0], {x: dataset(chosen[0], x) for x in [*args.codecs, *readers]},
                          args.profile_samples, args.profile_top, store)
        print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    """The command line of ``python -m benchmarks.sampling``; the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.sampling", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--shared", default=DEFAULT_SHARED, help="folder of the shared test videos")
    p.add_argument("--names", type=_list, default=VIDEOS, help=f"videos of --shared used in turn "
                   f"(default {','.join(VIDEOS)})")
    p.add_argument("--synthetic", action="store_true",
                   help="synthetic videos (convert.synth) instead of the shared ones (used when those are absent)")
    p.add_argument("--synth-seconds", type=float, default=8.0, help="length of each synthetic video (default 8)")
    p.add_argument("--videos", type=int, default=6, help="videos (default 6)")
    p.add_argument("--short-side", type=int, default=256, help="the conversion's short side (default 256)")
    p.add_argument("--codecs", type=_list, default=["h264", "jpeg"], help="the conversion's codecs (default h264,jpeg)")
    p.add_argument("--geometries", type=lambda s: [parse_geometry(x) for x in _list(s)],
                   default=[parse_geometry(x) for x in _list(GEOMETRIES)],
                   help=f"comma-separated TxS@C, TxSaA@C (SlowFast) or tsnN@C (default {GEOMETRIES})")
    p.add_argument("--readers", type=_list, default=list(READERS),
                   help="on-the-fly readers: pyav, decord (default both; decord is skipped where absent)")
    p.add_argument("--threads", type=int, default=cpu_count(), help="reader threads (default one per core)")
    p.add_argument("--workers", type=int, default=cpu_count(), help="conversion processes (default one per core)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seconds", type=float, default=2.0, help="timed seconds per configuration (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds, the best kept (default 3)")
    p.add_argument("--no-sizes", dest="sizes", action="store_false",
                   help="skip the per-geometry conversions and the bytes table")
    p.add_argument("--profile", default=AIM_GEOMETRY,
                   help=f"the geometry whose reads are profiled (default {AIM_GEOMETRY}; none: no profile)")
    p.add_argument("--profile-samples", type=int, default=12, help="samples per reader in the profile (default 12)")
    p.add_argument("--profile-top", type=int, default=6, help="functions shown per reader (default 6)")
    p.add_argument("--tmp", help="folder for the videos and conversions (kept; default a temporary one, removed)")
    args = p.parse_args(argv)
    if min(args.videos, args.short_side, args.threads, args.workers, args.batch_size, args.rounds) < 1 \
            or args.seconds <= 0:
        p.error("--videos, --short-side, --threads, --workers, --batch-size, --rounds and --seconds must be positive")
    unknown = set(args.readers) - set(READERS)
    if unknown or not args.codecs:
        p.error(f"--readers: choose from {', '.join(READERS)}; --codecs: at least one")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
