"""loaders.dali_native on DALI's CPU backend: DALI's own TFRecord reader, sharding, shuffling, resume, crops.

The GPU graph (nvJPEG, the GPU inflate) runs in ``python scripts/dali_check.py
--device 0``; everything else is checked here.
"""

from __future__ import annotations

import gc
import io
import os
import re

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali")

from loaders import ClipDataset, ClipPreset, open_clips, to_model_input  # noqa: E402
from loaders.dali import DaliClipLoader, build_dali_loader  # noqa: E402
from loaders.dali.native import DaliTFRecordLoader, padded_steps, shard_sizes  # noqa: E402
from loaders.presets import resize_bilinear  # noqa: E402

from .conftest import load_script  # noqa: E402
from .loaders_fixtures import converted, loader_base, raw_root, tfrecord_converted  # noqa: E402,F401

BS = 4
SIZE = (128, 171)  # the conversions test_format_tfrecord makes too (one conversion per session)
CROP = 112


@pytest.fixture(scope="module")
def tf_roots(synth_videos, loader_base) -> dict[str, str]:  # noqa: F811
    """The session's synthetic videos as TFRecord conversions (47 clips of 16 x 128 x 171, 3 shards).

    Through ``tfrecord_converted``: the same conversions the other TFRecord tests read. vp9's frames are coded
    128 x 172 and cropped back to 171 by the graph before the crop, whose anchors are relative to 171.
    """
    return {codec: tfrecord_converted(synth_videos, loader_base, codec) for codec in ("raw", "jpeg", "vp9")}


@pytest.fixture(scope="module")
def tf_lz4(synth_videos, loader_base) -> str:  # noqa: F811
    return tfrecord_converted(synth_videos, loader_base, "lz4")


def _epoch(loader: DaliTFRecordLoader) -> list[dict]:
    return [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()} for b in loader]


def _real(batches: list[dict]) -> list[int]:
    return [i for b in batches for i, pad in zip(b["index"].tolist(), b["padding"].tolist()) if not pad]


# -- values ------------------------------------------------------------------------

# vp9 on DALI's CPU backend equals open_clips' decode bit for bit (tolerance 0, measured): FORMAT.md's RGB is
# libswscale's conversion, which DALI's CPU video decoder uses.
@pytest.mark.parametrize("codec", ["raw", "jpeg", "vp9"])
@pytest.mark.parametrize("clip_len", [None, 8], ids=["all-frames", "window-8"])
def test_eval_equals_clip_dataset_centre_crops_bit_for_bit(tf_roots, codec, clip_len):
    """Two ranks in evaluation: every clip once, each the centre crop (and centre window) ClipDataset gives."""
    root = tf_roots[codec]
    preset = ClipPreset(train=False, clip_len=clip_len, crop_size=CROP)
    ds = ClipDataset(root, train=False, preset=preset)
    n = len(ds)
    seen = []
    for rank in (0, 1):
        with DaliTFRecordLoader(root, train=False, batch_size=BS, preset=preset, rank=rank, world_size=2) as loader:
            batches = _epoch(loader)
            assert len(batches) == loader.steps_per_epoch == padded_steps(n, 2, BS)
            assert sum(len(b["video_id"]) for b in batches) == shard_sizes(n, 2)[rank] == loader.num_real
            for b in batches:
                assert b["clip"].dtype == torch.uint8 and b["clip"].shape[1:] == (clip_len or 16, CROP, CROP, 3)
                assert not b["padding"].any()
                for k, i in enumerate(b["index"].tolist()):
                    ref = ds[i]
                    assert (b["video_id"][k], int(b["clip_index"][k])) == (ref["video_id"], ref["clip_index"])
                    assert int(b["label"][k]) == ref["label"]
                    assert torch.equal(b["clip"][k], ref["clip"]), (codec, i)
                seen.extend(b["index"].tolist())
    assert sorted(seen) == list(range(n))


def test_normalize_equals_to_model_input(tf_roots):
    preset = ClipPreset(train=False, crop_size=CROP)
    plain = _epoch(DaliTFRecordLoader(tf_roots["raw"], train=False, batch_size=BS, preset=preset))
    normed = _epoch(DaliTFRecordLoader(tf_roots["raw"], train=False, batch_size=BS, preset=preset, normalize=True))
    for a, b in zip(plain, normed):
        want = to_model_input(a["clip"], mean=preset.mean, std=preset.std)
        assert b["clip"].dtype == torch.float32
        assert b["clip"].shape == want.shape == (len(a["index"]), 3, 16, CROP, CROP)
        assert float((b["clip"] - want).abs().max()) <= 1e-5


def _find_crop(stored: np.ndarray, got: np.ndarray) -> tuple[int, int, int, bool] | None:
    """(t0, y0, x0, flip) such that ``got`` is that crop of ``stored`` (flipped when ``flip``), or None."""
    t, side = got.shape[0], got.shape[1]
    for flip in (False, True):
        want = got[:, :, ::-1] if flip else got
        corner = want[0, 0, 0]
        for t0 in range(stored.shape[0] - t + 1):
            ys, xs = np.nonzero((stored[t0] == corner).all(axis=-1))
            for y0, x0 in zip(ys.tolist(), xs.tolist()):
                if y0 + side <= stored.shape[1] and x0 + side <= stored.shape[2] and \
                        np.array_equal(stored[t0:t0 + t, y0:y0 + side, x0:x0 + side], want):
                    return t0, y0, x0, flip
    return None


def test_training_crops_are_windows_and_squares_of_the_stored_clip(tf_roots):
    """Each training sample is an 8-frame window and CROP square of its stored clip, some flipped, at varied places."""
    root = tf_roots["raw"]
    store = open_clips(root)
    preset = ClipPreset(train=True, clip_len=8, seed=5, crop_size=CROP)
    loader = DaliTFRecordLoader(root, train=True, batch_size=BS, preset=preset)
    found = []
    for b in _epoch(loader)[:4]:
        assert b["clip"].shape == (BS, 8, CROP, CROP, 3)
        for k, i in enumerate(b["index"].tolist()):
            where = _find_crop(store[i].clip, b["clip"][k].numpy())
            assert where is not None, f"clip {i} is no crop of its stored clip"
            found.append(where)
    assert {f[3] for f in found} == {False, True}
    assert len({f[:3] for f in found}) >= 12 and len({f[0] for f in found}) >= 3


def test_multiscale_is_a_resized_square(tf_roots):
    """multiscale=(1.0,) on 128 x 171 frames: the full-height square at a random column, resized to CROP."""
    root = tf_roots["raw"]
    store = open_clips(root)
    preset = ClipPreset(train=True, multiscale=(1.0,), seed=2, crop_size=CROP)
    b = next(iter(DaliTFRecordLoader(root, train=True, batch_size=BS, preset=preset)))
    assert b["clip"].shape == (BS, 16, CROP, CROP, 3)
    h, w = SIZE
    columns = set()
    for k, i in enumerate(b["index"].tolist()):
        stored, got = store[i].clip, b["clip"][k].numpy().astype(int)

        def diff(x0: int, f: int, frames: slice) -> int:
            square = np.ascontiguousarray(stored[frames, :, x0:x0 + h][:, :, ::f])
            return int(np.abs(resize_bilinear(square, (CROP, CROP)).astype(int) - got[frames]).max())

        # The column and flip whose first frame fits best, then every frame of that cut.
        _, x0, f = min((diff(x0, f, slice(0, 1)), x0, f) for x0 in range(w - h + 1) for f in (1, -1))
        assert diff(x0, f, slice(None)) <= 2, f"clip {i}: no column's resized square within 2 grey levels"
        columns.add(x0)
    assert len(columns) >= 2


# -- sharding, padding, shuffling --------------------------------------------------------

def test_two_ranks_read_every_clip_once_per_epoch_with_equal_batch_counts(tf_roots):
    """Training on 2 ranks: full batches, the same count on both; padding repeats a rank's last clip, and the
    real samples of both ranks are every clip exactly once, in an order that changes per epoch."""
    root = tf_roots["jpeg"]
    n = len(open_clips(root))
    assert n % 2 == 1  # the ranks' shards differ by one clip: padding is exercised
    orders = []
    for epoch in (0, 1):
        real = []
        for rank in (0, 1):
            loader = DaliTFRecordLoader(root, train=True, batch_size=BS, rank=rank, world_size=2,
                                        preset=ClipPreset(train=True, seed=3, crop_size=CROP))
            loader.set_epoch(epoch)
            batches = _epoch(loader)
            assert len(batches) == loader.steps_per_epoch == padded_steps(n, 2, BS)
            assert all(b["clip"].shape[0] == BS for b in batches)
            flat = [i for b in batches for i in b["index"].tolist()]
            pads = [p for b in batches for p in b["padding"].tolist()]
            mine = shard_sizes(n, 2)[rank]
            assert pads == [False] * mine + [True] * (len(flat) - mine)  # padding only after every real clip
            assert set(flat[mine:]) <= {flat[mine - 1]}  # DALI repeats the shard's last sample
            assert flat[:mine] == _real(batches)
            real.extend(flat[:mine])
            orders.append(flat[:mine])
            loader.close()
        assert sorted(real) == list(range(n))
    assert orders[0] != orders[2] and orders[1] != orders[3]  # reshuffled per epoch
    assert orders[0] != sorted(orders[0])


def test_same_seed_same_epoch_same_batches_other_seed_other_order(tf_roots):
    root = tf_roots["raw"]

    def first(seed: int, epoch: int) -> list[int]:
        loader = DaliTFRecordLoader(root, train=True, batch_size=BS,
                                    preset=ClipPreset(train=True, seed=seed, crop_size=CROP))
        loader.set_epoch(epoch)
        got = [i for b in list(loader)[:3] for i in b["index"].tolist()]
        loader.close()
        return got

    assert first(1, 2) == first(1, 2)
    assert first(1, 2) != first(2, 2)


# -- resume ------------------------------------------------------------------------------

def _roundtrip(state: dict) -> dict:
    """Through torch.save / torch.load(weights_only=True), as the trainer's checkpoints go."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("codec", ["raw", "jpeg"])
def test_resume_from_checkpoint_continues_the_epoch_exactly(tf_roots, codec):
    """Stop after 3 batches, save, resume in a new loader: the rest of the epoch equals the unbroken run (clips,
    order, crops, flips); before + after hold every clip of the rank exactly once."""
    root = tf_roots[codec]
    preset = ClipPreset(train=True, clip_len=8, seed=4, crop_size=CROP)

    def make(rank: int) -> DaliTFRecordLoader:
        loader = DaliTFRecordLoader(root, train=True, batch_size=BS, preset=preset, rank=rank, world_size=2)
        loader.set_epoch(1)
        return loader

    whole = {rank: _epoch(make(rank)) for rank in (0, 1)}
    first = make(0)
    it = iter(first)
    before = [next(it) for _ in range(3)]
    state = _roundtrip(first.state_dict(consumed=3 * BS))
    first.close()
    assert state["epoch"] == 1 and state["position"] == 3 * BS and state["dali"]["checkpoint"]
    after = {}
    for rank in (0, 1):  # the trainer saves rank 0's state only: it must resume every rank
        resumed = make(rank)
        resumed.load_state_dict(state)
        resumed.set_epoch(1)
        resumed.set_position(3 * BS)  # what the trainer does after loading
        after[rank] = _epoch(resumed)
        assert len(after[rank]) == resumed.steps_per_epoch - 3
        for got, want in zip(after[rank], whole[rank][3:]):
            assert torch.equal(got["index"], want["index"]) and torch.equal(got["clip"], want["clip"])
        resumed.close()
    real = _real(before) + _real(after[0])
    assert sorted(real) == sorted(_real(whole[0])) and len(set(real)) == shard_sizes(len(open_clips(root)), 2)[0]


def test_vp9_training_batches_are_crops_of_the_stored_clips_and_resume_by_reading(tf_roots):
    """DALI cannot checkpoint its video decoder: the pipeline is built without checkpoints, a state saves an empty
    one, and the resume reads up to the position; the rest of the epoch equals the unbroken run's."""
    root = tf_roots["vp9"]
    store = open_clips(root)
    preset = ClipPreset(train=True, clip_len=8, seed=4, crop_size=CROP)

    def make() -> DaliTFRecordLoader:
        loader = DaliTFRecordLoader(root, train=True, batch_size=BS, preset=preset)
        loader.set_epoch(1)
        return loader

    whole = _epoch(make())
    for b in whole[:2]:
        assert b["clip"].shape == (BS, 8, CROP, CROP, 3) and b["label"].dtype == torch.int64
        for k, i in enumerate(b["index"].tolist()):
            assert int(b["label"][k]) == store[i].label
            assert _find_crop(store[i].clip, b["clip"][k].numpy()) is not None, f"clip {i} is no crop of its clip"
    first = make()
    it = iter(first)
    for _ in range(2):
        next(it)
    state = _roundtrip(first.state_dict(consumed=2 * BS))
    first.close()
    assert state["position"] == 2 * BS and state["dali"]["checkpoint"] == ""
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    resumed.set_position(2 * BS)
    rest = _epoch(resumed)
    resumed.close()
    assert [b["index"].tolist() for b in rest] == [b["index"].tolist() for b in whole[2:]]
    assert all(torch.equal(a["clip"], b["clip"]) for a, b in zip(rest, whole[2:]))


def test_a_position_without_checkpoint_is_reached_by_reading(tf_roots):
    root = tf_roots["raw"]
    preset = ClipPreset(train=True, seed=6, crop_size=CROP)
    whole = _epoch(DaliTFRecordLoader(root, train=True, batch_size=BS, preset=preset))
    loader = DaliTFRecordLoader(root, train=True, batch_size=BS, preset=preset)
    loader.set_position(2 * BS)
    rest = _epoch(loader)
    assert [b["index"].tolist() for b in rest] == [b["index"].tolist() for b in whole[2:]]
    assert all(torch.equal(a["clip"], b["clip"]) for a, b in zip(rest, whole[2:]))
    loader.set_position(2 * BS)
    next(iter(loader))  # a read-up-to position saves like any other
    assert loader.state_dict(consumed=3 * BS)["dali"]["checkpoint"]


def test_state_rules(tf_roots):
    preset = ClipPreset(train=True, seed=1, crop_size=CROP)
    loader = DaliTFRecordLoader(tf_roots["raw"], train=True, batch_size=BS, preset=preset)
    assert loader.state_dict() == {"epoch": 0, "position": 0, "world_size": 1, "global_position": 0}
    with pytest.raises(ValueError, match="multiple of the batch size 4"):
        loader.set_position(6)
    next(iter(loader))
    with pytest.raises(ValueError, match=r"saves where its pipeline stands \(epoch 0 position 4\)"):
        loader.state_dict(consumed=8)
    state = loader.state_dict(consumed=BS)
    other = DaliTFRecordLoader(tf_roots["raw"], train=True, batch_size=2 * BS, preset=preset)
    other.load_state_dict(state)  # another batch size: the checkpoint does not apply; position kept valid
    assert other.state_dict() == {"epoch": 0, "position": 0, "world_size": 1, "global_position": 0}
    loader.set_epoch(1)  # a new epoch starts at 0
    assert loader.state_dict() == {"epoch": 1, "position": 0, "world_size": 1, "global_position": 0}
    loader.close()


# -- errors, lifetime, routes -------------------------------------------------------------

def test_lz4_without_gpu_is_a_one_line_error_naming_the_cpu_codecs(tf_lz4):
    """Said for a user: what DALI cannot do here, what it reads instead, and the loader that reads lz4 on the
    CPU (no API words such as device_id=None)."""
    with pytest.raises(ValueError) as info:
        DaliTFRecordLoader(tf_lz4, train=False, batch_size=BS, preset=ClipPreset(train=False, crop_size=32))
    msg = str(info.value)
    assert "\n" not in msg and tf_lz4 in msg and "DALI decodes lz4 clips on a GPU only" in msg
    assert "raw and jpeg" in msg and msg.endswith("read this one with --loader threads, which decodes lz4 on the CPU")
    assert "device_id" not in msg


def test_h264_without_gpu_is_refused_in_one_line(synth_videos, loader_base):  # noqa: F811
    """DALI's CPU backend has no H.264 decoder: refused when the loader is made, saying so, what DALI reads on the
    CPU (vp9 among them) and the loader that reads this one there."""
    root = tfrecord_converted(synth_videos, loader_base, "h264")
    with pytest.raises(ValueError) as info:
        DaliTFRecordLoader(root, train=False, batch_size=BS, preset=ClipPreset(train=False, crop_size=32))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{root}: h264 clips need a GPU under DALI (DALI decodes H.264 with "
                                              f"NVDEC on a GPU only; its CPU backend has no H.264 decoder)")
    assert "there is none for it here; without one, DALI reads raw, jpeg and vp9 conversions" in msg
    assert msg.endswith("--loader threads reads this one on the CPU") and "device_id" not in msg


def test_a_gpu_device_without_a_gpu_is_a_one_line_error(tf_roots):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    loader = DaliTFRecordLoader(tf_roots["raw"], train=False, batch_size=BS,
                                preset=ClipPreset(train=False, crop_size=32), device_id=0)
    loader._pipeline(0, build=False)  # a GPU graph is still defined without a GPU (scripts/dali_check.py --smoke)
    with pytest.raises(ValueError) as info:
        next(iter(loader))
    loader.close()
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("device_id=0 needs a CUDA GPU and torch sees no CUDA GPU here")


def test_lmdb_conversion_is_refused_with_the_route_to_use(raw_root):  # noqa: F811
    with pytest.raises(ValueError, match=r"holds lmdb shards; .* \(use loaders.dali.DaliClipLoader\)"):
        DaliTFRecordLoader(raw_root, train=False, batch_size=BS)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_close_and_collection_stop_the_pipeline_threads(tf_roots):
    gc.collect()
    before = _threads()
    preset = ClipPreset(train=False, crop_size=CROP)
    with DaliTFRecordLoader(tf_roots["raw"], train=False, batch_size=BS, threads=3, preset=preset) as loader:
        next(iter(loader))
        assert loader._slot.pipe is not None and loader._slot.pipe.exec_dynamic is True  # run(stream) on a GPU needs it
        assert _threads() >= before + 3  # DALI's worker threads
    assert loader._slot.pipe is None and _threads() == before
    loader = DaliTFRecordLoader(tf_roots["raw"], train=False, batch_size=BS, threads=3, preset=preset)
    next(iter(loader))
    del loader  # dropped without close(): its finalizer closes the pipeline
    gc.collect()
    assert _threads() == before


def test_the_source_route_closes_on_with_too(tf_roots):
    with DaliClipLoader(tf_roots["raw"], train=False, batch_size=BS, workers=2,
                        preset=ClipPreset(train=False, crop_size=CROP)) as loader:
        next(iter(loader))
        pids = loader._pipe._py_pool.pids()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] in "ZX"


def test_build_dali_loader_picks_the_route_by_backend(tf_roots, raw_root):  # noqa: F811
    kw = {"train": True, "batch_size": BS, "workers": 0, "preset": ClipPreset(train=True, crop_size=CROP)}
    assert isinstance(build_dali_loader(tf_roots["raw"], **kw), DaliTFRecordLoader)
    assert isinstance(build_dali_loader(tf_roots["raw"], route="source", **kw), DaliClipLoader)
    assert isinstance(build_dali_loader(raw_root, **kw), DaliClipLoader)
    with pytest.raises(ValueError, match="route must be one of auto, native, source"):
        build_dali_loader(raw_root, route="gpu", **kw)
    # Checking CRCs as values are read: the source route does it, the native route says it cannot.
    assert build_dali_loader(tf_roots["raw"], route="source", verify=True, **kw).verify is True
    with pytest.raises(ValueError, match=r"verify=True \(the trainer's --verify-data\) needs the source route"):
        build_dali_loader(tf_roots["raw"], verify=True, **kw)


@pytest.mark.parametrize("kw, words", [
    ({"batch_size": 0}, "batch_size must be an int >= 1"),
    ({"rank": 2, "world_size": 2}, r"rank must be in 0\.\.1"),
    ({"threads": 0}, "threads must be an int >= 1"),
    ({"shuffle_buffer_mb": 0}, "shuffle_buffer_mb must be a number > 0"),
    ({"preset": ClipPreset(train=False)}, "preset has train=False"),
    ({"preset": ClipPreset(train=True, clip_len=17)}, "longer than the stored clips"),
    ({"preset": ClipPreset(train=True, crop_size=200)}, "does not fit"),
    ({"world_size": 1000, "rank": 0}, "cannot be shared by 1000 ranks"),
])
def test_constructor_validates(tf_roots, kw, words):
    kw = {"batch_size": BS, "preset": ClipPreset(train=True, crop_size=CROP), **kw}
    with pytest.raises(ValueError, match=words):
        DaliTFRecordLoader(tf_roots["raw"], train=True, **kw)


# -- the trainer ---------------------------------------------------------------------------

def test_train_with_loader_dali_on_tfrecord_runs_and_resumes_exactly(synth_videos, loader_base, tmp_path,  # noqa: F811
                                                                     monkeypatch):
    """``python -m train --loader dali`` on a TFRecord conversion takes the native route (CPU backend here):
    4 steps straight equal 2 steps, a stop, and 2 more after ``--resume`` (mid-epoch, bit for bit)."""
    from train.errors import TrainError
    from train.main import run_argv

    root = converted(synth_videos, loader_base, "tf_tiny", backend="tfrecord", codec="raw", size=(40, 52),
                     max_clips=2)
    n = len(open_clips(root))

    def argv(out: str, *extra: str) -> list[str]:
        return ["--data", root, "--out", str(tmp_path / out), "--loader", "dali", "--model-width", "0.0625",
                "--crop-size", "32", "--workers", "0", "--threads", "1", "--no-progress", "--no-tensorboard",
                "--log-every", "1", "--device", "cpu", "--epochs", "1", "--batch-size", "8", "--optimizer", "adamw",
                "--lr", "1e-3", *extra]

    gc.collect()
    before = _threads()
    a = run_argv(argv("a", "--max-steps", "4", "--val-data", root))
    assert a["step"] == 4 and a["eval"]["clips"] == n
    assert _threads() == before  # the trainer's train and eval pipelines went with their loaders
    with pytest.raises(TrainError, match=f"^--data {re.escape(root)}: verify=True .*\\(--loader threads\\)"):
        run_argv(argv("v", "--max-steps", "1", "--verify-data"))
    # A run that fails after its training pipeline ran closes it on the way out, while the exception
    # (whose frames hold the loader) is still alive.
    import train.main

    def failing_eval(*args, **kw):
        raise RuntimeError("evaluation failed")

    monkeypatch.setattr(train.main, "_eval_and_log", failing_eval)
    with pytest.raises(RuntimeError, match="evaluation failed") as caught:
        run_argv(argv("w", "--max-steps", "2", "--val-data", root))
    assert _threads() == before and caught.value is not None
    run_argv(argv("b", "--max-steps", "2"))
    from train import checkpoint as ckpt_io

    mid = ckpt_io.load(ckpt_io.latest_path(str(tmp_path / "b")))
    assert mid["sampler"]["position"] == 16 and mid["sampler"]["dali"]["checkpoint"]
    b = run_argv(argv("b", "--max-steps", "4", "--resume"))
    assert b["step"] == 4
    wa = ckpt_io.load(ckpt_io.latest_path(str(tmp_path / "a")))["model"]
    wb = ckpt_io.load(ckpt_io.latest_path(str(tmp_path / "b")))["model"]
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_device_check_smoke_runs_the_native_route_and_defines_the_gpu_graphs(tf_roots, tf_lz4, capsys):
    """``python scripts/dali_check.py --smoke`` on these conversions: values exact on the CPU backend, the resume
    check passes, speeds are printed, lz4 is skipped on the CPU, and every codec's GPU graphs are defined."""
    _main = load_script("dali_check").main

    assert _main(["--smoke", "--route", "native", tf_roots["raw"], tf_roots["jpeg"], tf_lz4, tf_roots["vp9"]]) == 0
    out = capsys.readouterr().out
    for codec in ("raw", "jpeg", "vp9"):
        for bs in (4, 8):
            line = next(ln for ln in out.splitlines() if ln.startswith(f"  native {codec:<5} batch {bs:4d}:"))
            assert line.endswith("(max diff 0, resume ok)") and float(line.split()[4]) > 0
    assert "  native lz4   skipped: DALI decodes it on the GPU only" in out
    for codec in ("raw", "jpeg", "lz4", "vp9"):
        assert (f"  gpu graphs {codec:<5} defined: train, train+normalize, eval, eval+normalize, multiscale, "
                f"multiscale+normalize") in out
    assert out.rstrip().endswith("DALI check passed")


# -- the benchmark's new rows ------------------------------------------------------------------

def test_bench_tfrecord_package_reader_dali_rows_and_disk_table(tf_roots, tf_lz4, synth_videos):
    from benchmarks.loaders.common import timed
    from benchmarks.loaders.dataloader import TFRecordPackageDataset, disk_table, measure_dali_native
    from loaders.presets import apply

    root = tf_roots["jpeg"]
    store = open_clips(root)
    first = dict(zip(store.video_ids, (np.cumsum(store.video_clips) - store.video_clips).tolist()))
    items = list(TFRecordPackageDataset(root, crop_size=CROP))
    assert sorted(first[it["video_id"]] + it["clip_index"] for it in items) == list(range(len(store)))
    preset = ClipPreset(train=True, crop_size=CROP)
    for it in items[:6]:  # the package's bytes, decoded and cropped, equal the project's reader's
        stored = store[first[it["video_id"]] + it["clip_index"]]
        assert it["label"] == stored.label
        want = apply(stored.clip, preset.params(0, it["k"], stored.clip.shape))
        assert torch.equal(it["clip"], torch.from_numpy(want))

    r = measure_dali_native(tf_roots["raw"], batch_size=BS, threads=1, seconds=0.2, crop_size=CROP)
    assert r["clips"] > 0 and r["clips"] % BS == 0
    assert r["mb_s"] == pytest.approx(r["clips_s"] * 16 * CROP * CROP * 3 / 1e6)
    with pytest.raises(ValueError, match="fewer clips than one batch"):
        timed(lambda epoch: [], 1.0)

    # Both backends' rows filled from the TFRecord conversions at hand (the table reads what it is given).
    paths = {"videos": synth_videos}
    for codec, root in (("raw", tf_roots["raw"]), ("jpeg", tf_roots["jpeg"]), ("lz4", tf_lz4)):
        paths[codec] = paths[f"tfrecord_{codec}"] = root
    lines = disk_table(paths)
    rows = {tuple(ln.split()[:2]): ln.split() for ln in lines[1:]}
    assert set(rows) == {(b, c) for b in ("lmdb", "tfrecord") for c in ("raw", "lz4", "jpeg")} | {("source", "h264")}
    src = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(synth_videos) for f in fs)
    for codec in ("raw", "lz4", "jpeg"):
        m = open_clips(paths[codec]).manifest
        clips, value = m.totals.clips, m.totals.value_bytes
        row = rows[("tfrecord", codec)]
        assert int(row[2]) == clips and row[3] == f"{value / clips:,.0f}"
        disk = float(row[4].replace(",", ""))
        assert disk >= value / clips  # records add framing, Example fields and index lines
        assert row[5] == f"{disk / (src / clips):.1f}x"
    assert rows[("tfrecord", "raw")][6] == "1.00x" and rows[("source", "h264")][-1] == "1.0x"


def test_centre_anchors_and_relative_positions_are_exact_in_dali_arithmetic():
    """The graph's centre rule equals presets._centre (halves to even) and its relative crop positions give
    crop_mirror_normalize the exact anchor, for every slack 0..150 and every anchor of a few slacks."""
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline
    from nvidia.dali.tensors import TensorListCPU

    from loaders.dali.native import _centre_node, _relative
    from loaders.presets import _centre

    side = 3
    cases = [(s, _centre(s + side, side)) for s in range(151)] + [(s, a) for s in (7, 59, 128) for a in range(s + 1)]
    width = max(s for s, _ in cases) + side
    row = np.zeros((1, width, 3), np.uint8)
    row[0, :, 0], row[0, :, 1] = np.arange(width) % 256, np.arange(width) // 256
    images = [np.ascontiguousarray(row[:, :s + side]) for s, _ in cases]
    pipe = Pipeline(batch_size=len(cases), num_threads=1, device_id=None, seed=0)
    with pipe:
        slacks = [np.array(s, np.int64) for s, _ in cases]
        anchors = [np.array(a, np.int64) for _, a in cases]
        img, slack, anchor = fn.external_source(source=lambda: (images, slacks, anchors), num_outputs=3,
                                                layout=["HWC", "", ""])
        cut = fn.crop_mirror_normalize(img, crop_h=1, crop_w=side, crop_pos_y=0.0, crop_pos_x=_relative(anchor, slack),
                                       rounding="round", dtype=types.DALIDataType.UINT8, output_layout="HWC")
        pipe.set_outputs(_centre_node(slack), cut)
    pipe.build()
    centre, out = pipe.run()
    got_centre = [int(np.asarray(centre[i])) for i in range(151)]
    assert got_centre == [a for _, a in cases[:151]]
    assert isinstance(out, TensorListCPU)  # a CPU pipeline
    cut = out.as_array()
    assert (cut[:, 0, 0, 0].astype(int) + 256 * cut[:, 0, 0, 1].astype(int)).tolist() == [a for _, a in cases]
