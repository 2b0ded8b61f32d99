"""GPU check for the trainer: a full-size network (``--model``, C3D by default) from synthetic LMDB shards, bf16
and fp16, one table.

    python scripts/device_check.py            # on a CUDA machine (about 6 minutes on one H200; stops at 7.5)
    python scripts/device_check.py --smoke    # anywhere: tiny width and steps, CPU-only configurations

Every configuration runs the trainer itself (``train.main.run_argv``), so the
check covers the code paths a real run takes: channels_last, the LR plan,
the non-finite-loss guard, NVML logging. For each AMP dtype (bf16, fp16) the
reader-thread configuration (``--loader threads``, the trainer's default)
trains with ``--batch-size auto`` (the trainer's probe: largest batch within
85% of GPU memory); the DataLoader worker processes (``--loader processes``)
and DALI (when ``nvidia.dali`` imports) reuse that batch, so the three
loaders are compared at one batch. Each trains ``--steps`` optimizer
steps; the table gives clips/s, model FLOPs utilisation against the GPU's
dense bf16 peak (the model's FLOPs per clip counted by
``train.models.flops_per_clip``, times 3 for forward and backward), the
fraction of step time spent waiting for data, peak memory, GPU utilisation
from NVML (when ``nvidia-ml-py`` is installed) and the batch. Results also
go to WORK/device_check.json. A configuration that would start after
``--budget-s`` seconds is skipped (and said so), so the whole check stays
within its 8 minutes however slow the machine.

Before the trainer, the NVDEC rows (when ``nvidia.dali`` imports; ``--no-nvdec``
leaves them out): small synthetic h264 and vp9 conversions of 16x128x171
clips (an odd width: coded 172 wide, cropped back), their payloads decoded by
the DALI graph the loaders use (``loaders.dali.graphs``; "mixed": NVDEC) with
1 and 4 pipelines side by side, in clips/s, and the decoded clips against
``open_clips``' CPU decode: max and mean absolute error, the check failing
when the mean exceeds ``NVDEC_MEAN_TOLERANCE``; and the "model" columns, the
decoded clips against ``nvdec_model`` (DALI's GPU colour conversion computed
on the CPU): 0 there means the GPU's pixels are understood exactly.
A last row feeds the same h264 clips muxed into mp4 (``h264_in_mp4``): if
DALI's GPU decoder refuses the bare Annex-B stream, the same session says
whether the container form, a new codec id, would do. A row whose decoding
raises says so in one line and the check goes on to the trainer.
``--smoke`` runs the same rows on DALI's CPU backend, where vp9 must equal
``open_clips`` exactly and h264 is skipped (DALI has no CPU H.264 decoder);
its model columns are the model against ``open_clips``, the difference the
GPU is expected to show.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from convert.format.system import cpu_count  # noqa: E402
from convert.synth import synthetic_conversions  # noqa: E402
from convert.worker.plan import ConvertConfig  # noqa: E402
from loaders.dali import missing as dali_missing  # noqa: E402
from train import TrainError  # noqa: E402
from train.gpustats import PEAKS  # noqa: E402
from train.gpustats import peak_flops as gpu_peak  # noqa: E402
from train.main import run_argv  # noqa: E402
from train.models import MODELS, flops_per_clip  # noqa: E402

# Grey levels of mean absolute error allowed between a GPU-decoded video clip and open_clips' CPU decode: NVDEC's
# pixels go through DALI's own YUV-to-RGB kernel, not FORMAT.md's libswscale conversion, so they differ by its
# rounding (nvdec_model predicts how much: docs/benchmarks.md); a wrong matrix or range would move the mean by
# far more. The CPU backend is held to 0.
NVDEC_MEAN_TOLERANCE = 1.0
NVDEC_CODECS = ("h264", "vp9")
NVDEC_PIPELINES = (1, 4)


def _decode_pipe(items: list, graph, *, batch: int, device_id: int | None, start: int = 0):
    """A bare DALI pipeline decoding ``items`` ((header, payload) pairs, cycled from ``start``) with ``graph``."""
    from loaders.dali.base import Pipeline, fn, pipeline_options, types

    state = {"next": start}

    def source() -> tuple[list, list]:
        k = state["next"]
        state["next"] = k + batch
        picked = [items[(k + j) % len(items)] for j in range(batch)]
        return ([np.frombuffer(p, dtype=np.uint8) for _, p in picked],
                [np.asarray(h.shape, dtype=np.int32) for h, _ in picked])

    pipe = Pipeline(batch_size=batch, num_threads=2, device_id=device_id, seed=0, prefetch_queue_depth=2,
                    **pipeline_options())
    where = "cpu" if device_id is None else "gpu"
    with pipe:
        data, shape = fn.external_source(source=source, num_outputs=2, dtype=[types.UINT8, types.INT32],
                                         ndim=[1, 1])
        if where == "gpu" and not graph.host_input:
            data = data.gpu()
        pipe.set_outputs(graph.decode(data, shape=shape, offsets=None, sizes=None, frames=int(items[0][0].shape[0]),
                                      device=where))
    pipe.build()
    return pipe


def _run_until(pipe, stop: float, batch: int, done: list[int], i: int) -> None:
    while time.perf_counter() < stop:
        pipe.run()
        done[i] += batch


def _clips_per_s(items: list, graph, *, pipelines: int, batch: int, device_id: int | None, seconds: float) -> float:
    """Clips/s of ``pipelines`` decoding pipelines run side by side, each in its own thread, for ``seconds`` after
    a first untimed batch each."""
    import threading

    pipes = [_decode_pipe(items, graph, batch=batch, device_id=device_id, start=i * batch) for i in range(pipelines)]
    for p in pipes:
        p.run()
    done = [0] * pipelines
    t0 = time.perf_counter()
    threads = [threading.Thread(target=_run_until, args=(p, t0 + seconds, batch, done, i))
               for i, p in enumerate(pipes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if device_id is not None:
        torch.cuda.synchronize(device_id)
    rate = sum(done) / (time.perf_counter() - t0)
    pipes.clear()
    gc.collect()  # the pipelines' threads and memory, before the next count
    return round(rate, 1)


def _upsample_centred(plane: np.ndarray) -> np.ndarray:
    """A 4:2:0 chroma plane at full size as DALI's GPU kernel samples it: bilinear, chroma sited at the centre of
    each 2x2 block (weights 1/4 and 3/4 from the nearer neighbours, edges clamped), rounded to uint8."""
    def along(a: np.ndarray, axis: int) -> np.ndarray:
        n = a.shape[axis]
        before = np.take(a, np.clip(np.arange(n) - 1, 0, n - 1), axis=axis)
        after = np.take(a, np.clip(np.arange(n) + 1, 0, n - 1), axis=axis)
        pair = np.stack([0.25 * before + 0.75 * a, 0.75 * a + 0.25 * after], axis=axis + 1)
        shape = list(a.shape)
        shape[axis] *= 2
        return pair.reshape(shape)

    return np.clip(np.rint(along(along(plane.astype(np.float32), 0), 1)), 0, 255)


def nvdec_model(codec, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """What DALI's GPU video decoder should return for a video payload, computed on the CPU.

    NVDEC's YUV is the bitstream's, bit for bit (H.264 and VP9 decoding is
    exact), so the pictures are decoded here by FFmpeg; DALI's kernel then
    converts a full-range picture with the JPEG (BT.601 full range) matrix in
    float: luma taken as it is, chroma as ``_upsample_centred``, the result
    rounded. Set beside ``open_clips``' libswscale decode, this says how far
    the GPU may differ from FORMAT.md's pixels before any GPU has run
    (docs/benchmarks.md), and on a GPU whether its output is this model.
    """
    out = np.empty(shape, np.uint8)
    for k, frame in enumerate(codec.pictures(payload, shape)):
        y, u, v = (np.frombuffer(p, np.uint8).reshape(-1, p.line_size)[:p.height, :p.width] for p in frame.planes)
        cb, cr = _upsample_centred(u) - 128, _upsample_centred(v) - 128
        luma = y.astype(np.float32)
        rgb = np.stack([luma + 1.402 * cr, luma - 0.344136 * cb - 0.714136 * cr, luma + 1.772 * cb], -1)
        out[k] = np.clip(np.rint(rgb), 0, 255).astype(np.uint8)[:shape[1], :shape[2]]
    return out


def h264_in_mp4(payload: bytes) -> bytes:
    """An h264 payload's access units muxed into an mp4 file in memory (timestamps 0, 1, 2... at 25 per second),
    the same coded pictures: the form a new codec id would store if DALI's GPU decoder did not take the bare
    Annex-B stream."""
    import io
    from fractions import Fraction

    import av

    from convert.format.video import H264Codec

    units = [bytes(p) for p in H264Codec().coded_frames(payload, av.CodecContext.create("h264", "r"), ())]
    with av.open(io.BytesIO(payload), format="h264") as probe:
        width, height = probe.streams.video[0].codec_context.width, probe.streams.video[0].codec_context.height
    out = io.BytesIO()
    with av.open(out, "w", format="mp4", options={"fflags": "+bitexact"}) as mp4:
        stream = mp4.add_stream("h264", rate=25)
        stream.width, stream.height = width, height
        for i, unit in enumerate(units):
            packet = av.Packet(unit)
            packet.stream, packet.pts, packet.dts, packet.time_base = stream, i, i, Fraction(1, 25)
            packet.is_keyframe = i == 0
            mp4.mux(packet)
    return out.getvalue()


def nvdec_row(root: str, *, device_id: int | None, batch: int, seconds: float,
              wrap: Callable[[bytes], bytes] | None = None,
              label: str | None = None) -> dict:
    """One codec's NVDEC row: decoded clips against ``open_clips``' decode, then clips/s per pipeline count.

    ``wrap`` (with its ``label``) feeds DALI each payload rewrapped (``h264_in_mp4``), compared with the same
    references: a probe of another stream form, not the format's."""
    from convert.store import open_clips
    from loaders.dali.graphs import graph_for

    store = open_clips(root)
    codec = store.manifest.data.codec
    graph = graph_for(store.codec)
    if device_id is None and not graph.cpu:
        return {"codec": label or codec, "error": "skipped: DALI decodes it on the GPU only"}
    items: list = []
    items += [(clip.header, bytes(clip.payload)) for clip in store.read(range(len(store)))]
    fed = items if wrap is None else [(header, wrap(payload)) for header, payload in items]
    codec = label or codec
    # Values: every clip once, in order, against the CPU decode of FORMAT.md.
    pipe = _decode_pipe(fed, graph, batch=batch, device_id=device_id)
    # The GPU's decode is also set against nvdec_model's (what DALI's kernel should give): on the CPU backend,
    # the model against open_clips instead, the difference the GPU is expected to show.
    worst, total, count = 0, 0.0, 0
    model_worst, model_total = 0, 0.0
    for k in range(0, len(items), batch):
        (out,) = pipe.run()
        out = out.as_cpu() if device_id is not None else out
        for j in range(min(batch, len(items) - k)):
            header, payload = items[k + j]
            got = np.array(out[j]).astype(np.int16)
            want = store.codec.decode(payload, header.shape).astype(np.int16)
            if got.shape != want.shape:
                return {"codec": codec, "error": f"decoded {got.shape}, open_clips {want.shape}"}
            diff = np.abs(got - want)
            worst, total, count = max(worst, int(diff.max())), total + float(diff.sum()), count + diff.size
            model = nvdec_model(store.codec, payload, header.shape).astype(np.int16)
            off = np.abs(model - (got if device_id is not None else want))
            model_worst, model_total = max(model_worst, int(off.max())), model_total + float(off.sum())
    del pipe
    mean = total / max(count, 1)
    row: dict = {"codec": codec, "clips": len(items), "max_abs": worst, "mean_abs": round(mean, 4),
                 "model_max_abs": model_worst, "model_mean_abs": round(model_total / max(count, 1), 4)}
    allowed = 0.0 if device_id is None else NVDEC_MEAN_TOLERANCE
    if mean > allowed or (device_id is None and worst):
        row["error"] = f"{codec}: decoded clips differ from open_clips by mean {mean:.3f} (max {worst}), " \
                       f"allowed mean {allowed:g}"
    for n in NVDEC_PIPELINES:
        row[f"clips_s_{n}"] = _clips_per_s(fed, graph, pipelines=n, batch=batch, device_id=device_id,
                                           seconds=seconds)
    return row


def one_line(exc: BaseException) -> str:
    """An exception as one line: DALI's errors run over many (pipeline, operator, C++ context)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: " + " | ".join(lines)[:400]


def nvdec_rows(work: str, *, device_id: int | None, cores: int, smoke: bool) -> list[dict]:
    """The NVDEC rows: an h264 and a vp9 conversion of the same small synthetic set, one row each, then the h264
    payloads in mp4 (a probe, so that one GPU session says whether that form would do if the bare stream fails).

    A row whose decoding raises records the error in one line and the check goes on: the trainer's rows after
    them are worth the device time whatever NVDEC does."""
    roots = synthetic_conversions(work, {f"nvdec_{c}": ConvertConfig(codec=c) for c in NVDEC_CODECS},
                                  per_class=1 if smoke else 2, seconds=1.2 if smoke else 4.0, videos="videos-nvdec",
                                  workers=cores)
    runs: list[tuple[str, str, Callable[[bytes], bytes] | None]] = [
        (codec, roots[f"nvdec_{codec}"], None) for codec in NVDEC_CODECS]
    runs.append(("h264 in mp4 (probe)", roots["nvdec_h264"], h264_in_mp4))
    rows = []
    for label, root, wrap in runs:
        try:
            row = nvdec_row(root, device_id=device_id, batch=4 if smoke else 16, seconds=0.5 if smoke else 3.0,
                            wrap=wrap, label=label)
        except (RuntimeError, ValueError, OSError) as exc:  # DALI's errors are RuntimeErrors
            row = {"codec": label, "error": one_line(exc)}
        rows.append(row)
        print(f"  nvdec {label:<5} " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "codec"), flush=True)
    return rows


def nvdec_table(rows: list[dict]) -> str:
    counts = " | ".join(f"clips/s, {n} pipeline{'s' if n > 1 else ''}" for n in NVDEC_PIPELINES)
    lines = [f"| codec | clips | max abs error | mean abs error | model: max | model: mean | {counts} | note |",
             "|" + "---|" * (7 + len(NVDEC_PIPELINES))]
    for r in rows:
        speeds = " | ".join(str(r.get(f"clips_s_{n}", "-")) for n in NVDEC_PIPELINES)
        lines.append(f"| {r['codec']} | {r.get('clips', '-')} | {r.get('max_abs', '-')} | {r.get('mean_abs', '-')} | "
                     f"{r.get('model_max_abs', '-')} | {r.get('model_mean_abs', '-')} | {speeds} | "
                     f"{r.get('error', '')} |")
    return "\n".join(lines)


def peak_flops(device: torch.device, given: float | None) -> float | None:
    """The GPU's dense bf16 peak in FLOP/s: ``--peak-tflops``, else from its name; None when unknown."""
    if given:
        return given * 1e12
    if device.type != "cuda":
        return PEAKS["H200"]  # the smoke run still prints the formula's numbers
    return gpu_peak(device)


def step_flops(opts: argparse.Namespace) -> float:
    """FLOPs of one clip's training step (3 forward passes) of ``--model`` at the check's width and crop."""
    return 3.0 * flops_per_clip(opts.model, clip_len=opts.clip_len, crop_size=opts.crop, width=opts.width)


def run_config(data: str, work: str, loader: str, amp: str, batch: int | str, opts: argparse.Namespace,
               device: torch.device) -> dict:
    """One trainer run; its speed, memory and batch as a table row (``error`` when it failed)."""
    out = os.path.join(work, f"run_{loader}_{amp}")
    argv = ["--data", data, "--out", out, "--overwrite", "--loader", loader, "--amp", amp,
            "--model", opts.model, "--clip-len", str(opts.clip_len), "--model-width", str(opts.width),
            "--crop-size", str(opts.crop), "--batch-size", str(batch),
            "--max-steps", str(opts.steps), "--epochs", "1000", "--eval-every", "0", "--log-every",
            str(opts.log_every), "--no-progress", "--no-tensorboard", "--lr", "0.003",
            # Speed only: no LR scaling or warm-up to the large auto batch (an lr of ~0.1 could diverge,
            # and a bf16 run stops on a non-finite loss).
            "--lr-scaling", "none", "--workers", str(opts.workers), "--device", device.type]
    if device.type == "cuda":
        argv.append("--channels-last")
        torch.cuda.reset_peak_memory_stats(device)
    row: dict = {"loader": loader, "amp": amp, "batch": batch}
    t0 = time.perf_counter()
    try:
        s = run_argv(argv)
    except TrainError as exc:
        return {**row, "error": str(exc)}
    row.update(batch=s["batch_size"], clips_per_s=s.get("clips_per_s"), data_wait=s.get("data_wait_frac"),
               peak_mb=s.get("peak_mem_mb"), gpu_util=s.get("gpu_util_pct"), seconds=time.perf_counter() - t0,
               final_loss=s.get("final_loss"), nonfinite=s.get("nonfinite_steps", 0),
               max_batch=(s.get("auto_batch") or {}).get("batch"))
    if row["clips_per_s"] is not None and opts.peak:
        row["mfu"] = row["clips_per_s"] * opts.step_flops / opts.peak
    gc.collect()  # drop the run's model and optimizer before the next configuration
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def table(rows: list[dict]) -> str:
    head = "| loader | amp | batch | clips/s | MFU | data wait | peak MiB | GPU busy | largest batch | note |"
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['loader']} | {r['amp']} | {r['batch']} | - | - | - | - | - | - | {r['error']} |")
            continue
        mb = r.get("max_batch")
        util = r.get("gpu_util")
        note = f"{r['nonfinite']} non-finite steps skipped" if r.get("nonfinite") else ""
        lines.append(f"| {r['loader']} | {r['amp']} | {r['batch']} | {r['clips_per_s']:.1f} | {_pct(r.get('mfu'))} | "
                     f"{r['data_wait']:.1%} | {r['peak_mb']:.0f} | {'-' if util is None else f'{util:.0f}%'} | "
                     f"{mb if mb is not None else 'n/a'} | {note} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/device_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny width, crop and steps; runs on the CPU")
    p.add_argument("--data", help="use this conversion instead of building synthetic shards")
    p.add_argument("--work", default="device_check_out", help="folder for shards, runs and device_check.json "
                   "(the compose service passes /out/device_check, the mounted output folder)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per configuration (default 20)")
    p.add_argument("--batch", default=None,
                   help="clips per step: a number or auto (default auto on a GPU: the trainer's probe; smoke 8)")
    p.add_argument("--workers", type=int, default=None,
                   help="reader threads (threads) or worker processes (processes) or DALI workers per "
                        "configuration (default: cores - 2, at most 14)")
    p.add_argument("--budget-s", type=float, default=450.0,
                   help="skip the configurations that would start after this many seconds (default 450, so the "
                        "check ends within 8 minutes)")
    p.add_argument("--model", default="c3d", choices=tuple(MODELS),
                   help="the network (train.models.MODELS; default c3d), at 16 frames and its own crop")
    p.add_argument("--no-nvdec", action="store_true", help="leave out the NVDEC rows (h264 and vp9 decoding)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the GPU's dense bf16 peak for MFU (default: from its name, e.g. H200 989)")
    return p


def main(argv: list[str] | None = None) -> int:
    """The check; ``argv`` as on the command line (default: the process's); returns the exit status."""
    opts = build_parser().parse_args(argv)
    cuda = torch.cuda.is_available() and not opts.smoke
    if not cuda and not opts.smoke:
        # Not a quiet fallback: a check asked for on a GPU and run on the CPU would read as a pass.
        print("device_check: error: no CUDA device here; pass --smoke for the small CPU run", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    cores = max(cpu_count(), 2)
    opts.width, opts.crop = (1.0, MODELS[opts.model].crop_size) if not opts.smoke else (0.0625, 32)
    opts.clip_len = 16  # what the synthetic conversion stores
    opts.step_flops = step_flops(opts)
    opts.steps = opts.steps or (20 if not opts.smoke else 4)
    opts.batch = opts.batch or ("auto" if cuda else "8")
    opts.log_every = 5 if not opts.smoke else 2
    opts.workers = opts.workers if opts.workers is not None else (min(14, max(cores - 2, 1)) if cuda else 0)
    opts.peak = peak_flops(device, opts.peak_tflops)
    os.makedirs(opts.work, exist_ok=True)
    t0 = time.perf_counter()
    if opts.data:
        data = opts.data
    else:
        # Full size: 5 classes x 24 videos of 12 s, about 2,600 clips of 16x128x171 (2.7 GB raw), more than
        # the largest batch a 141 GB GPU holds, so the auto batch gives at least one step per epoch.
        # 128x171 frames for the 112 crops of C3D and the ResNets; 256x341 (short side 256) for I3D's 224.
        size = (40, 52) if opts.smoke else (128, 171) if opts.crop <= 128 else (256, 341)
        per_class, seconds = (24, 12.0) if not opts.smoke else (2, 2.0)
        data = synthetic_conversions(opts.work, {"train": ConvertConfig(size=size)}, per_class=per_class,
                                     seconds=seconds, workers=cores)["train"]
    nvdec: list[dict] = []
    if dali_missing() is None and not opts.no_nvdec:
        print("--- NVDEC: h264 and vp9 through DALI's video decoder ---", flush=True)
        nvdec = nvdec_rows(opts.work, device_id=device.index or 0 if cuda else None, cores=cores, smoke=opts.smoke)
    print(f"data: {data} (ready in {time.perf_counter() - t0:.0f} s); device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if cuda else ""), flush=True)
    # The first loader probes the batch (auto); the others reuse its answer.
    loaders = ["threads", "processes"] + (["dali"] if dali_missing() is None else [])
    rows = []
    for amp in ("bf16", "fp16"):
        if amp == "fp16" and not cuda:
            rows.append({"loader": "all", "amp": amp, "batch": opts.batch, "error": "fp16 needs CUDA: skipped"})
            continue
        batch = opts.batch
        for loader in loaders:
            spent = time.perf_counter() - t0
            if spent > opts.budget_s:
                rows.append({"loader": loader, "amp": amp, "batch": batch,
                             "error": f"skipped: {spent:.0f} s spent, over --budget-s {opts.budget_s:g}"})
                continue
            print(f"--- {loader} {amp} (batch {batch}) ---", flush=True)
            row = run_config(data, opts.work, loader, amp, batch, opts, device)
            rows.append(row)
            if "error" not in row:
                batch = row["batch"]  # the next loaders reuse the batch the first one's probe found
    if "dali" not in loaders:
        rows.append({"loader": "dali", "amp": "-", "batch": "-", "error": "nvidia.dali not importable: skipped"})
    print()
    peak = f"{opts.peak:.3g} FLOP/s" if opts.peak else "unknown peak (pass --peak-tflops)"
    print(f"{opts.model} width {opts.width}, {opts.clip_len}x{opts.crop}x{opts.crop}, {opts.steps} steps per "
          f"configuration; MFU = clips/s x {opts.step_flops:.3g} FLOP (3 forward passes, counted) / {peak}")
    print(table(rows))
    if nvdec:
        print(f"\nNVDEC ({'DALI mixed' if cuda else 'DALI CPU backend'}): 16x128x171 clips against open_clips' decode")
        print(nvdec_table(nvdec))
    with open(os.path.join(opts.work, "device_check.json"), "w") as f:
        json.dump({"device": str(device), "name": torch.cuda.get_device_name(device) if cuda else "cpu",
                   "model": opts.model, "width": opts.width, "crop": opts.crop, "peak_flops": opts.peak,
                   "rows": rows, "nvdec": nvdec}, f, indent=1)
    print(f"total {time.perf_counter() - t0:.0f} s; results in {os.path.join(opts.work, 'device_check.json')}")
    failed = [r for r in rows + nvdec if "error" in r and "skipped" not in r["error"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
