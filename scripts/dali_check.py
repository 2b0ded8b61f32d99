"""``python scripts/dali_check.py``: the DALI routes checked against the plain readers (GPU by default).

Two routes, both checked unless ``--route`` picks one:

- ``source``: ``DaliClipLoader`` (``fn.external_source``) on small synthetic
  LMDB conversions (raw, lz4): train, multi-scale and eval batches over two
  epochs and a mid-epoch resume against ``ClipDataset``, then
  ``normalize=True`` against ``to_model_input``.
- ``native``: ``DaliTFRecordLoader`` (DALI's own TFRecord reader) on
  synthetic TFRecord conversions (raw, lz4, jpeg, h264, vp9; about 740 clips
  each): evaluation centre crops against ``open_clips`` through
  ``ClipDataset`` (exact for raw and lz4, within 2 grey levels for jpeg,
  whose pixels nvJPEG computes its own way; for h264 and vp9 on the GPU the
  largest difference is reported, ``decode_tolerance``), a resume from DALI's
  checkpoint against the uninterrupted epoch (exact; h264 and vp9 resume by
  reading up to the position, DALI having no checkpoint of its video
  decoder), and clips/s and GB/s of training batches (random crop, flip,
  normalise) at batch 32 and 128.

Exits 1 on any difference. ``--device cpu`` runs everything on DALI's CPU
backend (exact for every codec; the native route then skips lz4 and h264,
which DALI decodes on the GPU only);
``--smoke`` is a small CPU run (batches of 4 and 8) that also defines the
GPU graphs of every codec without building them (DALI checks operator
arguments and placements then), for machines without a GPU: the test suite
runs it. Give conversions as arguments to check those instead of synthetic
ones (LMDB ones take the source route, TFRecord ones both).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, when not installed

from convert.format import FormatError, Payload  # noqa: E402
from convert.format.system import cpu_count  # noqa: E402
from convert.store import open_clips  # noqa: E402
from loaders import ClipDataset, ClipPreset, to_model_input  # noqa: E402
from loaders.dali import DaliClipLoader, DaliTFRecordLoader  # noqa: E402
from loaders.dali.graphs import cpu_codecs  # noqa: E402

ROUTES = ("both", "native", "source")
NATIVE_CODECS = ("raw", "lz4", "jpeg", "h264", "vp9")


def _synth_roots(base: str, codecs: Sequence[str], *, backend: str = "lmdb", per_class: int = 2,
                 seconds: float = 1.2, **config) -> list[str]:
    """A small synthetic dataset converted once per codec under ``base`` (the videos are made once)."""
    from convert.synth import synthetic_conversions
    from convert.worker.plan import ConvertConfig

    out = synthetic_conversions(base, {f"{backend}-{codec}": ConvertConfig(backend=backend, codec=codec, **config)
                                       for codec in codecs},
                                per_class=per_class, seconds=seconds, videos=f"videos-{per_class}-{seconds}",
                                workers=min(16, cpu_count()))
    return [out[f"{backend}-{codec}"] for codec in codecs]


def decode_tolerance(payload: Payload, device_id: int | None) -> int | None:
    """Grey levels DALI's decode of ``payload`` may differ from ``open_clips``' by: 0 on the CPU backend and for
    lossless payloads; on the GPU 2 for JPEG frames (nvJPEG's own arithmetic), and None for video streams, whose
    RGB comes from DALI's own YUV conversion after NVDEC: the difference is reported, not judged here
    (``scripts/device_check.py``'s NVDEC rows judge its mean)."""
    if payload.lossless or device_id is None:
        return 0
    return None if payload.layout == "stream" else 2


def _check_against_lmdb(root: str, preset: ClipPreset, *, device_id: int | None, batch_size: int, workers: int,
                        tolerance: int | None) -> dict:
    """Two epochs and a resume of the DALI loader, each batch compared with ``ClipDataset``."""
    loader = DaliClipLoader(root, train=preset.train, batch_size=batch_size, preset=preset, device_id=device_id,
                            workers=workers)
    ds = ClipDataset(root, train=preset.train, preset=preset)
    worst, clips, start = 0, 0, time.perf_counter()
    with loader:
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
                if tolerance is not None and diff > tolerance:
                    raise RuntimeError(f"{root} {preset}: epoch {epoch} clips {batch['index'].tolist()} differ from "
                                       f"the LMDB path by up to {diff} (allowed {tolerance})")
                if not torch.equal(batch["label"].cpu(), ref["label"]) or batch["video_id"] != ref["video_id"]:
                    raise RuntimeError(f"{root}: labels or video ids differ at clips {batch['index'].tolist()}")
                seen.extend(batch["index"].tolist())
                clips += len(batch["index"])
            if seen != loader.indices(epoch, position).tolist():
                raise RuntimeError(f"{root}: epoch {epoch} from {position} read {seen}, "
                                   f"the sampler order is {loader.indices(epoch, position).tolist()}")
    if device_id is not None:
        torch.cuda.synchronize(device_id)
    return {"max_diff": worst, "clips": clips, "seconds": round(time.perf_counter() - start, 3)}


def _check_normalize(root: str, *, device_id: int | None, batch_size: int, workers: int,
                     tolerance: float | None = 1e-5) -> float:
    """Largest difference between DALI's normalised output and ``to_model_input`` of the LMDB batch (None:
    reported, not judged: the decode differs already, and the uint8 checks judged it)."""
    preset = ClipPreset(train=True, seed=1)
    ds = ClipDataset(root, train=True, preset=preset)
    worst = 0.0
    with DaliClipLoader(root, train=True, batch_size=batch_size, preset=preset, device_id=device_id,
                        workers=workers, normalize=True) as loader:
        for batch in loader:
            ref = ds.__getitems__([(0, int(i)) for i in batch["index"]]).collated["clip"]
            want = to_model_input(ref, mean=preset.mean, std=preset.std, device=batch["clip"].device)
            worst = max(worst, float((batch["clip"] - want).abs().max()))
    if tolerance is not None and worst > tolerance:
        raise RuntimeError(f"{root}: normalised DALI output differs from to_model_input by {worst}")
    return worst


def _device_name(device_id: int | None) -> str:
    if device_id is not None and not torch.cuda.is_available():
        raise RuntimeError("gpu_self_check: torch sees no CUDA device (pass device_id=None for the CPU backend)")
    return "cpu" if device_id is None else torch.cuda.get_device_name(device_id)


def gpu_self_check(root: str | None = None, *, device_id: int | None = 0, batch_size: int = 4, workers: int = 2,
                   codecs: Sequence[str] = ("lz4", "raw")) -> dict:
    """The source route (``DaliClipLoader``) against the LMDB path; raises RuntimeError on a difference.

    ``root``: a conversion to check (default: convert a small synthetic set
    once per codec in ``codecs`` into a temporary folder). For each: train
    (random crop + flip), train with multi-scale (allowed to differ by 2 grey
    levels), and eval presets, over two epochs and a mid-epoch resume; then
    ``normalize=True`` against ``to_model_input``. ``device_id=None`` runs the
    same checks on DALI's CPU backend.
    """
    import tempfile

    results: dict = {"device": _device_name(device_id)}
    with tempfile.TemporaryDirectory(prefix="dali_check_") as tmp:
        roots = [root] if root is not None else _synth_roots(tmp, codecs)
        for r in roots:
            name = open_clips(r).manifest.data.codec if root is None else r
            presets = {"train": (ClipPreset(train=True, seed=1, clip_len=8), 0),
                       "multiscale": (ClipPreset(train=True, seed=1, multiscale=(1.0, 0.875, 0.75, 0.66)), 2),
                       "eval": (ClipPreset(train=False, seed=1), 0)}
            decoding = decode_tolerance(open_clips(r).codec.payload, device_id)
            for label, (preset, resizing) in presets.items():
                tolerance = None if decoding is None else max(decoding, resizing)
                got = _check_against_lmdb(r, preset, device_id=device_id, batch_size=batch_size, workers=workers,
                                          tolerance=tolerance)
                results[f"{name}/{label}"] = got
                print(f"{name:>8} {label:<10} ok: {got['clips']} clips in {got['seconds']} s, "
                      f"max diff {got['max_diff']}", flush=True)
            worst = _check_normalize(r, device_id=device_id, batch_size=batch_size, workers=workers,
                                     tolerance=1e-5 if decoding == 0 else None)
            results[f"{name}/normalize"] = worst
            print(f"{name:>8} normalize  ok: max diff {worst:.2e}", flush=True)
    return results


# -- the native route ------------------------------------------------------------------------

def _crop_for(root: str) -> int:
    """C3D's 112, or less where the frames are smaller (small test conversions)."""
    data = open_clips(root).manifest.data
    short = min(data.clip_shape[1], data.clip_shape[2]) if data.clip_shape else data.frame_size.short_side
    return min(112, int(short or 112))


def define_gpu_graphs(root: str, device_id: int = 0) -> list[str]:
    """Define (not build) the native route's GPU graphs on ``root`` for every preset kind; their names.

    DALI validates operator arguments and CPU/GPU placements while a graph is
    defined, so this runs on a machine without CUDA; the codec of ``root``
    needs no CPU decoder here.
    """
    done = []
    crop = _crop_for(root)
    for label, preset in (("train", ClipPreset(train=True, clip_len=8, crop_size=crop)),
                          ("eval", ClipPreset(train=False, clip_len=8, crop_size=crop)),
                          ("multiscale", ClipPreset(train=True, multiscale=(1.0, 0.875, 0.75, 0.66), crop_size=crop))):
        for normalize in (False, True):
            loader = DaliTFRecordLoader(root, train=preset.train, batch_size=4, preset=preset, device_id=device_id,
                                        normalize=normalize)
            loader._pipeline(0, build=False)
            done.append(f"{label}{'+normalize' if normalize else ''}")
    return done


def _native_values(root: str, *, device_id: int | None, batch_size: int, threads: int, tolerance: int | None,
                   batches: int) -> int:
    """Largest difference of the first ``batches`` evaluation batches from ``ClipDataset`` (``open_clips``' clips)."""
    preset = ClipPreset(train=False, crop_size=_crop_for(root))
    ds = ClipDataset(root, train=False, preset=preset)
    worst = 0
    with DaliTFRecordLoader(root, train=False, batch_size=batch_size, device_id=device_id, threads=threads,
                            preset=preset) as loader:
        for k, batch in enumerate(loader):
            if k == batches:
                break
            if device_id is not None and batch["clip"].device != torch.device("cuda", device_id):
                raise RuntimeError(f"clips came back on {batch['clip'].device}, not cuda:{device_id}")
            got = batch["clip"].cpu()
            for j, i in enumerate(batch["index"].tolist()):
                ref = ds[i]
                if (ref["video_id"], ref["clip_index"], ref["label"]) != \
                        (batch["video_id"][j], int(batch["clip_index"][j]), int(batch["label"][j])):
                    raise RuntimeError(f"{root}: clip {i} came with the wrong video id, clip index or label")
                diff = int((got[j].int() - ref["clip"].int()).abs().max())
                if tolerance is not None and diff > tolerance:
                    raise RuntimeError(f"{root}: clip {i} ({ref['video_id']} #{ref['clip_index']}) differs from "
                                       f"open_clips' centre crop by up to {diff} (allowed {tolerance})")
                worst = max(worst, diff)
    return worst


def _native_resume(root: str, *, device_id: int | None, batch_size: int, threads: int) -> int:
    """Batches after a resume from DALI's checkpoint equal the uninterrupted epoch's: how many were compared."""
    preset = ClipPreset(train=True, seed=1, clip_len=8, crop_size=_crop_for(root))

    def loader() -> DaliTFRecordLoader:
        return DaliTFRecordLoader(root, train=True, batch_size=batch_size, preset=preset, device_id=device_id,
                                  threads=threads, world_size=2)

    with loader() as whole:
        want = [(b["index"].clone(), b["clip"].cpu()) for b in whole]
    first = loader()
    it = iter(first)
    next(it)
    state = first.state_dict(consumed=batch_size)
    first.close()
    with loader() as resumed:
        resumed.load_state_dict(state)
        got = [(b["index"].clone(), b["clip"].cpu()) for b in resumed]
    if len(got) != len(want) - 1 or any(not (torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
                                        for a, b in zip(got, want[1:])):
        raise RuntimeError(f"{root}: batches after a resume from DALI's checkpoint differ from the unbroken epoch")
    return len(got)


def _native_speed(root: str, *, device_id: int | None, batch_size: int, threads: int, epochs: int) -> dict:
    """clips/s and GB/s of training batches (random crop, flip, normalise), each epoch's first batch not timed."""
    store = open_clips(root)
    record_bytes = store.manifest.totals.value_bytes / len(store)
    clips, seconds = 0, 0.0
    preset = ClipPreset(train=True, seed=1, crop_size=_crop_for(root))
    with DaliTFRecordLoader(root, train=True, batch_size=batch_size, device_id=device_id, threads=threads,
                            preset=preset, normalize=True) as loader:
        out_bytes = int(np.prod(loader.clip_shape))  # the uint8 crop the float batch holds
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            t0 = None
            for batch in loader:
                if device_id is not None:
                    torch.cuda.synchronize(device_id)
                if t0 is None:  # the epoch's pipeline build and shuffle-buffer fill
                    t0 = time.perf_counter()
                    continue
                clips += batch["clip"].shape[0]
            if t0 is not None:
                seconds += time.perf_counter() - t0
    rate = clips / seconds if seconds else 0.0
    return {"clips_s": round(rate, 1), "in_gb_s": round(rate * record_bytes / 1e9, 3),
            "out_gb_s": round(rate * out_bytes / 1e9, 3), "clips": clips}


def native_self_check(roots: Sequence[str] | None = None, *, device_id: int | None = 0,
                      batch_sizes: Sequence[int] = (32, 128), threads: int | None = None,
                      codecs: Sequence[str] = NATIVE_CODECS, epochs: int = 3, check_batches: int = 2) -> dict:
    """The native route (``DaliTFRecordLoader``) per codec: values against ``open_clips``, resume, speed.

    ``roots``: TFRecord conversions to check (default: a synthetic one per
    codec in ``codecs``, about 740 clips of 16 x 128 x 171). Raises
    RuntimeError on a difference; returns ``{codec: {"max_diff", "resume",
    batch size: {"clips_s", "in_gb_s", "out_gb_s"}}}``. GB/s "in" counts the
    stored records read, "out" the uint8 crops delivered (the float batch is
    4x that). On the CPU backend lz4 and h264 are skipped (no CPU inflate, no CPU H.264 decoder in DALI).
    """
    import tempfile

    threads = threads or max(1, min(8, cpu_count()))
    results: dict = {"device": _device_name(device_id)}
    with tempfile.TemporaryDirectory(prefix="dali_native_check_") as tmp:
        if roots is None:
            todo = [c for c in codecs if device_id is not None or c in cpu_codecs()]
            # 20 videos of 3 s, a clip every 2 frames: ~740 clips, enough for batches of 128.
            roots = _synth_roots(tmp, todo, backend="tfrecord", per_class=4, seconds=3.0, step=2)
        for root in roots:
            store = open_clips(root)
            codec = store.manifest.data.codec
            if device_id is None and codec not in cpu_codecs():
                results[codec] = {"skipped": "no CPU decoder in DALI"}
                print(f"  native {codec:<5} skipped: DALI decodes it on the GPU only", flush=True)
                continue
            tolerance = decode_tolerance(store.codec.payload, device_id)
            row: dict = {"max_diff": _native_values(root, device_id=device_id, batch_size=min(batch_sizes),
                                                    threads=threads, tolerance=tolerance, batches=check_batches)}
            row["resume"] = _native_resume(root, device_id=device_id, batch_size=min(batch_sizes), threads=threads)
            for bs in batch_sizes:
                row[bs] = _native_speed(root, device_id=device_id, batch_size=bs, threads=threads, epochs=epochs)
                print(f"  native {codec:<5} batch {bs:4d}: {row[bs]['clips_s']:9.1f} clips/s "
                      f"{row[bs]['in_gb_s']:7.3f} GB/s read {row[bs]['out_gb_s']:7.3f} GB/s out "
                      f"(max diff {row['max_diff']}, resume ok)", flush=True)
            results[codec] = row
    return results


def main(argv: Sequence[str]) -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(prog="python scripts/dali_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("roots", nargs="*", help="conversions to check (default: small synthetic ones)")
    p.add_argument("--device", default="0", help="CUDA device number, or 'cpu' for DALI's CPU backend")
    p.add_argument("--route", choices=ROUTES, default="both")
    p.add_argument("--workers", type=int, default=2, help="source route: DALI Python workers")
    p.add_argument("--batch-size", type=int, default=4, help="source route: batch size")
    p.add_argument("--batch-sizes", default="32,128", help="native route: batch sizes timed (default 32,128)")
    p.add_argument("--smoke", action="store_true",
                   help="small CPU run (batches 4 and 8) plus definitions of every codec's GPU graphs")
    args = p.parse_args(argv)
    device_id = None if args.device == "cpu" or args.smoke else int(args.device)
    batch_sizes = (4, 8) if args.smoke else tuple(int(b) for b in args.batch_sizes.split(","))
    backends = {r: open_clips(r).manifest.data.backend for r in args.roots}
    try:
        if args.route in ("both", "source"):
            for root in args.roots or [None]:
                gpu_self_check(root, device_id=device_id, batch_size=args.batch_size,
                               workers=0 if args.smoke else args.workers)
        if args.route in ("both", "native"):
            tf_roots = [r for r in args.roots if backends[r] == "tfrecord"] or None
            if args.roots and tf_roots is None:
                print("native route: no TFRecord conversion given, skipped")
            else:
                native_self_check(tf_roots, device_id=device_id, batch_sizes=batch_sizes,
                                  epochs=1 if args.smoke else 3)
        if args.smoke:
            with tempfile.TemporaryDirectory(prefix="dali_graphs_") as tmp:
                roots = [r for r in args.roots if backends[r] == "tfrecord"] or \
                    _synth_roots(tmp, NATIVE_CODECS, backend="tfrecord", per_class=1)
                for root in roots:
                    codec = open_clips(root).manifest.data.codec
                    print(f"  gpu graphs {codec:<5} defined: {', '.join(define_gpu_graphs(root))}", flush=True)
    except (RuntimeError, ValueError, FormatError) as exc:
        print(f"DALI check FAILED: {exc}")
        return 1
    print("DALI check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
