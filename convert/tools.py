"""Sub-commands around a conversion: ``verify``, ``inspect`` and ``demo``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator

import numpy as np

from .format import FormatError, Manifest, read_manifest
from .format.options import OneLineParser, add_options
from .job.summary import describe_shape, print_summary
from .options import DemoOptions, InspectOptions, VerifyOptions
from .signals import STOP_SIGNALS, put_back, take_stop_signals
from .store import manifest_at, open_clips
from .store.cache import CacheSettings, add_cache_options
from .store.cache.verify import verify_url
from .store.remote import is_url
from .store.store import ClipStore
from .store.verify import verify
from .worker.sources import SourceError, csv_labels, csv_rows, label_conflicts, printable


def inspect_summary(out: str, *, cache: CacheSettings | None = None, listed: dict[str, str] | None = None) -> dict:
    """Classes, clips per class and per video, bytes per clip, the codec's ratio and the content fingerprint;
    with ``listed`` (``annotated_videos``), the conversion against that list (``against``)."""
    store = open_clips(out, cache=cache)
    try:
        return _summary(out, store, listed)
    finally:
        store.close()


def _summary(out: str, store: ClipStore, listed: dict[str, str] | None) -> dict:
    m = store.manifest
    per_class = np.bincount(store.labels(), minlength=len(store.classes)) if len(store) else np.zeros(0, int)
    n = max(len(store), 1)
    if len(store):
        sample = store[0].clip
        raw_per_clip = sample.nbytes if m.data.clip_shape else None
    else:
        raw_per_clip = None
    stored_per_clip = m.totals.value_bytes / n
    cpv = store.video_clips
    return {
        "root": out,
        "codec": m.data.codec,
        "clip_shape": list(m.data.clip_shape) if m.data.clip_shape else None,
        "clips": len(store),
        "videos_with_clips": len(store.video_ids),
        "classes": {c: int(k) for c, k in zip(store.classes, per_class)},
        "clips_per_video": {"min": int(cpv.min()) if cpv.size else 0, "mean": float(cpv.mean()) if cpv.size else 0.0,
                            "max": int(cpv.max()) if cpv.size else 0},
        "bytes_per_clip": stored_per_clip,
        "codec_ratio": (raw_per_clip / stored_per_clip) if raw_per_clip else None,
        "status_counts": m.status_counts,
        "fingerprint": m.fingerprint,
    } | ({"against": against(store, listed)} if listed is not None else {})


# What a video of the annotation list became, as ``inspect --against`` counts it (per class and in total).
AGAINST_COLUMNS = ("annotated", "converted", "missing", "failed", "short")


def annotated_videos(csv_path: str, *, split: str | None = None) -> dict[str, str]:
    """Video id -> class name of every usable row of a Kinetics annotation CSV (the ids ``python -m convert``
    gives its videos: ``<youtube_id>_<start:06d>_<end:06d>``); rows of another ``split`` left out. A row that
    names no clip (a bad time, no label) is no video of the list; one repeated with its label is the one video.
    SourceError for a file that is not such a CSV, and for two rows that label one video differently: which
    class it belongs to is not known, so neither count could be right."""
    named = list(csv_labels(csv_rows(csv_path), split))
    conflicts = label_conflicts(named)
    if conflicts:
        first = next(iter(conflicts.values()))  # the first found, reading the file from its top
        more = f" (and {len(conflicts) - 1} more video(s) labelled twice)" if len(conflicts) > 1 else ""
        raise SourceError(f"{csv_path}: {first.describe()}{more}: the comparison would be ambiguous; keep one "
                          f"label per video")
    return {vid: label for _, vid, label in named}


def against(store: ClipStore, listed: dict[str, str]) -> dict:
    """The conversion in ``store`` against an annotation list (``annotated_videos``): per class of the list and in
    total, how many videos it annotates and how many of those were converted (clips stored), are missing (no
    video record: no file, or refused when planned), failed (undecodable) or short (too few frames for a clip);
    and how many converted videos the list does not name."""
    status: dict[str, tuple[str, int]] = {}
    for shard in range(len(store.manifest.shards)):
        for rec in store.reader(shard).records():
            status[rec.video_id] = (rec.status, rec.clips)
    classes: dict[str, dict[str, int]] = {}
    for vid, name in sorted(listed.items()):
        row = classes.setdefault(name, dict.fromkeys(AGAINST_COLUMNS, 0))
        row["annotated"] += 1
        got, clips = status.get(vid, ("missing", 0))
        key = "converted" if clips > 0 else {"short": "short", "failed": "failed"}.get(got, "missing")
        row[key] += 1
    totals = {k: sum(row[k] for row in classes.values()) for k in AGAINST_COLUMNS}
    extra = sum(1 for vid, (_, clips) in status.items() if clips > 0 and vid not in listed)
    return {"classes": dict(sorted(classes.items())), "totals": totals, "not_annotated": extra}


def describe_ratio(codec: str, ratio: float | None) -> str:
    """How the stored clips compare with raw ones, as ``inspect`` says it after the bytes per clip.

    Raw clips are the raw bytes (plus a header): no ratio to speak of. A codec that made clips larger
    (JPEG of noise) says so rather than "0.8x smaller".
    """
    if codec == "raw" or not ratio:
        return ", uncompressed" if codec == "raw" else ""
    return f", {ratio:.2f}x smaller than raw" if ratio >= 1 else f", {1 / ratio:.2f}x larger than raw"


def contact_sheet(out: str, path: str, *, rows: int = 8, frames: int = 4, seed: int = 0) -> str:
    """A PNG with ``rows`` sample clips (one per class first), ``frames`` frames each, captioned."""
    from PIL import Image, ImageDraw

    store = open_clips(out)
    if not len(store):
        raise ValueError(f"{out}: no clips to draw")
    rng = np.random.default_rng(seed)
    labels = store.labels()
    picks = []
    for c in range(len(store.classes)):
        idx = np.flatnonzero(labels == c)
        if idx.size:
            picks.append(int(rng.choice(idx)))
    extra = rng.permutation(len(store))
    picks += [int(i) for i in extra if int(i) not in picks][: max(0, rows - len(picks))]
    picks = picks[:rows]
    samples = [store[i] for i in picks]
    th = max(s.clip.shape[1] for s in samples)
    tw = max(s.clip.shape[2] for s in samples)
    caption = 14
    sheet = Image.new("RGB", (frames * (tw + 2), len(samples) * (th + caption + 2)), (32, 32, 32))
    draw = ImageDraw.Draw(sheet)
    for r, s in enumerate(samples):
        y = r * (th + caption + 2)
        draw.text((2, y), f"{store.classes[s.label]} | {s.video_id} #{s.clip_index}", fill=(255, 255, 255))
        t = s.clip.shape[0]
        for k, fi in enumerate(np.linspace(0, t - 1, frames).round().astype(int)):
            sheet.paste(Image.fromarray(s.clip[fi]), (k * (tw + 2), y + caption))
    sheet.save(path)
    return path


def demo(out: str, *, per_class: int, seconds: float, workers: int, codec: str) -> int:
    """Synthesise the embedded dataset, convert it, and say what was written."""
    from .synth import synthetic_conversions
    from .worker.plan import ConvertConfig

    results = {}
    for split, count, seed in (("train", per_class, 0), ("val", max(2, per_class // 4), 1)):
        src = os.path.join(out, "videos", split)
        print(f"synthesising {count} videos per class into {src} and converting them ...", flush=True)
        dst = synthetic_conversions(out, {split: ConvertConfig(codec=codec)}, per_class=count, seconds=seconds,
                                    seed=seed, videos=os.path.join("videos", split), workers=workers,
                                    progress=sys.stderr.isatty(),
                                    report=lambda name, folder, result: print_summary(folder, result, False))[split]
        problems, _ = verify(dst)
        if problems:
            print("verify failed:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        results[split] = dst
    summary = inspect_summary(results["train"])
    print(f"verified. classes and clips per class: {summary['classes']}")
    sheet = contact_sheet(results["train"], os.path.join(out, "contact_sheet.png"))
    print(f"contact sheet: {sheet}")
    return 0


EXIT_CODES = ("Exit status: 0 sound; 1 OUT is a conversion but reading it failed or found problems (the "
              "messages name the shard); 2 bad arguments, or OUT missing or not a finished conversion.")


class _Stopped(BaseException):
    """A stop signal (SIGINT, SIGTERM, SIGHUP) during a command that stops cleanly (``verify``): unwinds like
    KeyboardInterrupt, for every one."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stops_raised() -> Iterator[None]:
    """Within: the stop signals raise ``_Stopped`` (in the main thread; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the stop
        raise _Stopped(signum)

    previous = take_stop_signals(stop)
    try:
        yield
    finally:
        put_back(previous)


def _usable_out(cmd: str, out: str) -> Manifest | None:
    """OUT's manifest, or None after saying in one line why OUT is no finished conversion."""
    if is_url(out):
        try:
            return manifest_at(out)
        except (FormatError, OSError, ValueError) as exc:  # RemoteError is an OSError; ValueError: no bucket
            print(f"{cmd}: error: {exc}", file=sys.stderr)
            return None
    if not os.path.isdir(out):
        what = "is not a folder" if os.path.exists(out) else "does not exist"
        print(f"{cmd}: error: {out}: {what}; give the OUT folder of a conversion", file=sys.stderr)
        return None
    try:
        return read_manifest(out)
    except (FormatError, OSError) as exc:
        print(f"{cmd}: error: {exc}", file=sys.stderr)
        return None


def _cache_settings(args: argparse.Namespace) -> CacheSettings:
    """The shard cache the parsed ``--cache-dir`` and ``--cache-limit`` say."""
    return CacheSettings(cache_dir=args.cache_dir, limit=args.cache_limit)


def print_against(result: dict, csv_path: str) -> None:
    """``inspect --against``'s table: per class of the list, then the totals."""
    print(f"against {csv_path}:")
    head = "".join(f"{c:>11}" for c in AGAINST_COLUMNS)
    print(f"  {head}  class")
    for name, row in result["classes"].items():
        print("  " + "".join(f"{row[c]:>11}" for c in AGAINST_COLUMNS) + f"  {printable(name)}")
    print("  " + "".join(f"{result['totals'][c]:>11}" for c in AGAINST_COLUMNS) + "  (all classes)")
    if result["not_annotated"]:
        print(f"  {result['not_annotated']} converted videos are not in the list")


def build_parser(cmd: str) -> OneLineParser:
    """The parser of sub-command ``cmd`` (``verify``, ``inspect`` or ``demo``), from the options' declarations."""
    p = OneLineParser(prog=f"python -m convert {cmd}", epilog=EXIT_CODES if cmd != "demo" else None)
    if cmd == "verify":
        p.description = ("Reopen every shard, check counts and checksums against the manifest, decode every value. "
                         "OUT may be a URL (s3://..., gs://..., http(s)://...): its shards are downloaded into a "
                         "shard cache, a few at a time, and checked there.")
        p.add_argument("out", metavar="OUT")
        add_options(p, VerifyOptions)
        add_cache_options(p)
    elif cmd == "inspect":
        p.description = "Summarise a conversion; with --sheet, draw sample clips into a PNG."
        p.add_argument("out", metavar="OUT")
        add_options(p, InspectOptions)
        add_cache_options(p)
    elif cmd == "demo":
        p.description = "Synthesise a small labelled dataset (no downloads), convert and verify it."
        add_options(p, DemoOptions)
    else:  # pragma: no cover - cli routes only known names
        raise ValueError(f"no sub-command {cmd!r}")
    return p


def main(argv: list[str]) -> int:
    cmd, rest = argv[0], argv[1:]
    args = build_parser(cmd).parse_args(rest)
    if cmd == "verify":
        if _usable_out("verify", args.out) is None:
            return 2
        try:
            with _stops_raised():
                if is_url(args.out):
                    problems, counts = verify_url(args.out, cache=_cache_settings(args), fingerprint=args.fingerprint)
                else:
                    problems, counts = verify(args.out, fingerprint=args.fingerprint)
        except _Stopped as stop:  # the checkers are stopped by ``isolated`` as the exception leaves it
            print("verify: interrupted; nothing was changed (run verify again)", file=sys.stderr)
            return 128 + stop.signum
        except OSError as exc:  # the network or the cache disk, not the data: a problem of the machine
            print(f"verify: error: {exc}", file=sys.stderr)
            return 1
        if problems:
            for line in problems:
                print(f"verify: {line}", file=sys.stderr)
            return 1
        same = ", the fingerprint expected" if args.fingerprint else ""
        print(f"{args.out}: ok ({counts['shards']} shards, {counts['videos']} videos, {counts['clips']} clips{same})")
        return 0
    if cmd == "inspect":
        if args.split is not None and args.against is None:
            build_parser(cmd).error("--split compares with an annotation list: give --against CSV")
        manifest = _usable_out("inspect", args.out)
        if manifest is None:
            return 2
        sheet_dir = os.path.dirname(os.path.abspath(args.sheet)) if args.sheet else None
        if sheet_dir and not os.path.isdir(sheet_dir):
            print(f"inspect: error: {sheet_dir}: no such folder for --sheet", file=sys.stderr)
            return 2
        cache = _cache_settings(args)
        listed = None
        if args.against is not None:
            try:
                listed = annotated_videos(args.against, split=args.split)
            except SourceError as exc:
                print(f"inspect: error: {exc}", file=sys.stderr)
                return 2
        try:
            s = inspect_summary(args.out, cache=cache, listed=listed)
            if args.sheet:
                contact_sheet(args.out, args.sheet, rows=args.rows)
        except (ValueError, OSError) as exc:  # FormatError is a ValueError
            print(f"inspect: error: {exc} (python -m convert verify {args.out} checks every shard)", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(s, sort_keys=True))
            return 0
        data = manifest.data
        shape = describe_shape(data.clip_shape, data.clip.clip_len, data.frame_size.short_side)
        print(f"{s['root']}: {s['clips']} clips of shape {shape} from {s['videos_with_clips']} "
              f"videos, codec {s['codec']}")
        print(f"bytes per clip: {s['bytes_per_clip']:.0f}{describe_ratio(s['codec'], s['codec_ratio'])}")
        cpv = s["clips_per_video"]
        print(f"clips per video: min {cpv['min']}, mean {cpv['mean']:.1f}, max {cpv['max']}")
        print("clips per class:")
        for name, k in s["classes"].items():
            # Planning refuses control characters, not a right-to-left override; an older conversion may hold any.
            print(f"  {k:8d}  {printable(name)}")
        print(f"videos by status: {s['status_counts']}")
        print(f"content fingerprint: {s['fingerprint'] or 'none (written before fingerprints were recorded)'}")
        if "against" in s:
            print_against(s["against"], args.against)
        if args.sheet:
            print(f"contact sheet: {args.sheet}")
        return 0
    if cmd == "demo":
        return demo(args.out, per_class=args.per_class, seconds=args.seconds, workers=args.workers, codec=args.codec)
    raise AssertionError(cmd)  # pragma: no cover - cli routes only known names
