"""loaders.dali on DALI's CPU backend: the same clips, crops, order and resume as the LMDB path.

No GPU here: the GPU graph (inflate on the device) is checked by
``python scripts/dali_check.py`` (``gpu_self_check``) on a machine with one;
its checking code runs here on the CPU backend.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali")

import lmdb  # noqa: E402

from convert.format import FormatError  # noqa: E402
from convert.format.lmdb import HANDLES, clip_key  # noqa: E402
from loaders import ClipDataset, ClipPreset, DistributedClipSampler, open_clips, to_model_input  # noqa: E402
from loaders.dali import DaliClipLoader, build_dali_loader  # noqa: E402

from .conftest import load_script  # noqa: E402
from .loaders_fixtures import payloads  # noqa: E402

gpu_self_check = load_script("dali_check").gpu_self_check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCALES = (1.0, 0.875, 0.75, 0.66)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, str]:
    """10 synthetic videos (18 clips of 16x128x171, an odd width) converted as raw, lz4, jpeg, vp9 and h264, plus
    lz4 by short side."""
    from convert.synth import synthetic_conversions
    from convert.worker.plan import ConvertConfig

    configs = {"raw": ConvertConfig(codec="raw"), "lz4": ConvertConfig(codec="lz4"),
               "jpeg": ConvertConfig(codec="jpeg"), "vp9": ConvertConfig(codec="vp9"),
               "h264": ConvertConfig(codec="h264"),
               "lz4_short": ConvertConfig(codec="lz4", size=None, short_side=120)}
    out = synthetic_conversions(str(tmp_path_factory.mktemp("dali")), configs, per_class=2, seconds=1.2, workers=2)
    return {name: out[name] for name in configs}


def _reference(root: str, preset: ClipPreset) -> ClipDataset:
    return ClipDataset(root, train=preset.train, preset=preset)


def _assert_same_as_lmdb(loader: DaliClipLoader, ds: ClipDataset, epoch: int) -> list[int]:
    """Every batch of one iteration equals the LMDB Dataset's batch for the same (epoch, indices)."""
    seen = []
    for batch in loader:
        items = [(epoch, int(i)) for i in batch["index"]]
        ref = ds.__getitems__(items).collated
        assert batch["clip"].dtype == torch.uint8 and batch["clip"].shape == ref["clip"].shape
        assert torch.equal(batch["clip"], ref["clip"])
        assert torch.equal(batch["label"], ref["label"]) and batch["label"].dtype == torch.int64
        assert batch["video_id"] == ref["video_id"]
        assert torch.equal(batch["clip_index"], ref["clip_index"])
        seen.extend(batch["index"].tolist())
    return seen


# -- values -------------------------------------------------------------------

# vp9: DALI's CPU video decoder, the stream cropped back from the even size it is coded at, equals open_clips'
# decode bit for bit (tolerance 0, measured).
@pytest.mark.parametrize("codec", ["raw", "lz4", "jpeg", "lz4_short", "vp9"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_batches_bit_identical_to_lmdb_dataset(shards, codec, train):
    preset = ClipPreset(train=train, seed=3, clip_len=8 if train else None)
    workers = 2 if codec in ("lz4", "lz4_short") else 0  # both source modes: DALI worker processes and in-process
    loader = DaliClipLoader(shards[codec], train=train, batch_size=4, preset=preset, workers=workers)
    ds = _reference(shards[codec], preset)
    try:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            seen = _assert_same_as_lmdb(loader, ds, epoch)
            assert seen == loader.indices(epoch).tolist()
            assert len(seen) == (16 if train else 18)  # train drops the last partial batch; eval keeps every clip
    finally:
        loader.close()


def test_flips_and_windows_really_vary(shards):
    """The equality above means something: training crops differ between epochs and include flips."""
    preset = ClipPreset(train=True, seed=3, clip_len=8)
    params = [preset.params(e, i, (16, 128, 171)) for e in (0, 1) for i in range(18)]
    assert {p.flip for p in params} == {True, False}
    assert len({(p.t0, p.y0, p.x0) for p in params}) > 10


def test_normalize_equals_to_model_input(shards):
    preset = ClipPreset(train=True, seed=1)
    loader = DaliClipLoader(shards["lz4"], train=True, batch_size=4, preset=preset, workers=0, normalize=True)
    ds = _reference(shards["lz4"], preset)
    batches = 0
    for batch in loader:
        ref = ds.__getitems__([(0, int(i)) for i in batch["index"]]).collated["clip"]
        want = to_model_input(ref, mean=preset.mean, std=preset.std)
        assert batch["clip"].dtype == torch.float32 and batch["clip"].shape == want.shape == (4, 3, 16, 112, 112)
        assert float((batch["clip"] - want).abs().max()) <= 1e-5
        batches += 1
    assert batches == 4


@pytest.mark.parametrize("codec", ["raw", "lz4_short"])
def test_multiscale_close_to_numpy_resize(shards, codec):
    """The one inexact path: DALI's bilinear resize rounds its own way (off by at most a grey level or two)."""
    preset = ClipPreset(train=True, seed=1, multiscale=SCALES)
    loader = DaliClipLoader(shards[codec], train=True, batch_size=4, preset=preset, workers=0)
    ds = _reference(shards[codec], preset)
    store = open_clips(shards[codec])
    sides = set()
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        for batch in loader:
            ref = ds.__getitems__([(epoch, int(i)) for i in batch["index"]]).collated["clip"]
            assert batch["clip"].shape == ref.shape == (4, 16, 112, 112, 3)
            diff = (batch["clip"].int() - ref.int()).abs()
            assert int(diff.max()) <= 2
            assert float((diff > 0).float().mean()) < 0.02
            for k, i in enumerate(batch["index"].tolist()):
                ((header, _),) = payloads(store, [i])
                p = preset.params(epoch, i, header.shape)
                sides.add(p.h)
                if p.out_size is None:  # a cut already crop_size wide: DALI's resize is an identity there
                    assert torch.equal(batch["clip"][k], ref[k])
    assert len(sides) >= 3  # several scales were drawn


# -- order ----------------------------------------------------------------------

def test_order_matches_distributed_sampler_for_two_ranks(shards):
    root = shards["raw"]
    n = len(open_clips(root))
    for epoch in (0, 3):
        per_rank = []
        for rank in (0, 1):
            loader = DaliClipLoader(root, train=True, batch_size=2, rank=rank, world_size=2, seed=5, workers=0)
            loader.set_epoch(epoch)
            got = [i for b in loader for i in b["index"].tolist()]
            sampler = DistributedClipSampler(n, num_replicas=2, rank=rank, shuffle=True, seed=5, drop_last=True)
            sampler.set_epoch(epoch)
            want = [i for _, i in sampler]
            assert got == want[:len(loader) * 2]
            assert len(loader) == len(sampler) // 2 == loader.steps_per_epoch
            per_rank.append(got)
        assert not set(per_rank[0]) & set(per_rank[1])


def test_eval_covers_every_clip_once_over_ranks(shards):
    root = shards["lz4"]
    n = len(open_clips(root))  # 18 clips: 3 ranks of 6, batches of 4 -> a short last batch on each
    seen = []
    for rank in range(4):  # 4 ranks do not divide 18: no rank may repeat a clip to pad its share
        loader = DaliClipLoader(root, train=False, batch_size=4, rank=rank, world_size=4, workers=0)
        got = [b["index"].tolist() for b in loader]
        assert [len(b) for b in got][:-1] == [4] * (len(got) - 1) and 1 <= len(got[-1]) <= 4
        flat = [i for b in got for i in b]
        assert flat == list(range(rank, n, 4)) and len(loader) == len(got)
        assert loader.num_clips == n
        seen.extend(flat)
    assert sorted(seen) == list(range(n))


def test_drop_last_decides_the_short_batch(shards):
    loader = DaliClipLoader(shards["raw"], train=False, batch_size=4, workers=0, drop_last=True)
    assert [len(b["index"]) for b in loader] == [4, 4, 4, 4] and len(loader) == 4
    loader = DaliClipLoader(shards["raw"], train=True, batch_size=4, workers=0, drop_last=False)
    batches = [b["index"].tolist() for b in loader]
    assert [len(b) for b in batches] == [4, 4, 4, 4, 2] and len(loader) == 5
    assert [i for b in batches for i in b] == loader.indices().tolist()


# -- resume and pipeline reuse ------------------------------------------------------

def test_set_position_resumes_the_same_remaining_order_and_crops(shards):
    root = shards["lz4"]
    preset = ClipPreset(train=True, seed=2)
    full = DaliClipLoader(root, train=True, batch_size=4, preset=preset, workers=0, drop_last=False)
    full.set_epoch(2)
    whole = {i: b["clip"][k] for b in full for k, i in enumerate(b["index"].tolist())}  # the epoch's 18 crops
    for position in (4, 6):  # a batch boundary, and a position inside a batch
        resumed = DaliClipLoader(root, train=True, batch_size=4, preset=preset, workers=2)
        resumed.load_state_dict({"epoch": 2, "position": position})
        assert resumed.state_dict() == {"epoch": 2, "position": position, "world_size": 1,  # loaded without one
                                        "global_position": position, "scheme": 2}
        got = []
        for b in resumed:
            for k, i in enumerate(b["index"].tolist()):
                assert torch.equal(b["clip"][k], whole[i])  # the same crop as in the unbroken epoch
                got.append(i)
        sampler = DistributedClipSampler(18, shuffle=True, seed=2, drop_last=True)
        sampler.load_state_dict({"epoch": 2, "position": position})
        want = [i for _, i in sampler]
        assert got == want[:len(want) // 4 * 4]  # the sampler's remaining order, in whole batches
        resumed.close()


def test_next_epoch_keeps_the_pipeline_and_a_jump_rebuilds_it(shards):
    root = shards["raw"]
    preset = ClipPreset(train=True, seed=4)
    loader = DaliClipLoader(root, train=True, batch_size=4, preset=preset, workers=2)
    ds = _reference(root, preset)
    loader.set_epoch(0)
    _assert_same_as_lmdb(loader, ds, 0)
    pipe = loader._pipe
    for epoch in (1, 2):  # the trainer's loop: set_epoch, set_position(0), a whole epoch
        loader.set_epoch(epoch)
        loader.set_position(0)
        assert _assert_same_as_lmdb(loader, ds, epoch) == loader.indices(epoch).tolist()
        assert loader._pipe is pipe  # read on from the prefetched stream, no new workers
    # An abandoned epoch (max-steps stop, an exception): the next one starts afresh and still matches.
    loader.set_epoch(3)
    next(iter(loader))
    loader.set_epoch(4)
    assert _assert_same_as_lmdb(loader, ds, 4) == loader.indices(4).tolist()
    assert loader._pipe is not pipe
    loader.close()


def test_eval_passes_reuse_the_pipeline(shards):
    loader = DaliClipLoader(shards["raw"], train=False, batch_size=4, workers=0)
    first = [b["index"].tolist() for b in loader]
    pipe = loader._pipe
    assert [b["index"].tolist() for b in loader] == first
    assert loader._pipe is pipe


def test_a_newer_iterator_supersedes_an_older_one(shards):
    loader = DaliClipLoader(shards["raw"], train=True, batch_size=4, workers=0)
    old = iter(loader)
    next(old)
    new = iter(loader)
    assert next(new)["index"].tolist() == loader.indices()[:4].tolist()
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)


def test_state_dict_is_the_samplers(shards):
    loader = DaliClipLoader(shards["raw"], train=True, batch_size=4, workers=0)
    sampler = DistributedClipSampler(18, shuffle=True, drop_last=True)
    for obj in (loader, sampler):
        obj.set_epoch(3)
        obj.set_position(8)
        obj.set_epoch(3)  # the same epoch keeps the position
    assert loader.state_dict() == sampler.state_dict() == {"epoch": 3, "position": 8, "world_size": 1,
                                                           "global_position": 8, "scheme": 2}
    assert loader.state_dict(consumed=12) == {"epoch": 3, "position": 12, "world_size": 1,
                                                    "global_position": 12, "scheme": 2}
    loader.set_epoch(4)
    assert loader.state_dict() == {"epoch": 4, "position": 0, "world_size": 1, "global_position": 0,
                                   "scheme": 2}
    with pytest.raises(ValueError, match=r"0\.\.18"):  # this rank's 18 clips, as the sampler counts them
        loader.set_position(19)
    with pytest.raises(ValueError, match="epoch and position"):
        loader.load_state_dict({"epoch": 1})


def test_close_stops_the_worker_processes(shards):
    loader = DaliClipLoader(shards["raw"], train=False, batch_size=4, workers=2)
    next(iter(loader))
    pids = loader._pipe._py_pool.pids()
    assert len(pids) == 2
    loader.close()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] in "ZX"


# -- the trainer's seam, errors, import ---------------------------------------------

def test_build_dali_loader_with_the_trainers_keywords(shards):
    from train.data import TrainData

    preset = ClipPreset(train=True, seed=7, crop_size=112, clip_len=None)
    loader = build_dali_loader(shards["lz4"], train=True, batch_size=4, preset=preset, rank=0, world_size=1,
                               device_id=None, seed=7, workers=0)
    assert loader.classes == open_clips(shards["lz4"]).classes and loader.steps_per_epoch == 4
    assert loader.num_clips == 18 and len(loader) == 4
    data = TrainData(loader, loader, list(loader.classes), preset.mean, preset.std, 4, int(loader.steps_per_epoch))
    data.set_epoch(1)
    data.set_position(8)
    batches = list(data)
    assert [b["index"].tolist() for b in batches] == [loader.indices(1, 8)[:4].tolist(),
                                                      loader.indices(1, 8)[4:].tolist()]
    assert data.state_dict(consumed=8) == {"epoch": 1, "position": 8, "world_size": 1, "global_position": 8,
                                                 "scheme": 2}


@pytest.mark.parametrize("kw, words", [
    ({"batch_size": 0}, "batch_size must be an int >= 1"),
    ({"rank": 2, "world_size": 2}, r"rank must be in 0\.\.1"),
    ({"workers": -1}, "workers must be an int >= 0"),
    ({"prefetch": 0}, "prefetch must be an int >= 1"),
    ({"start_method": "forkserver"}, "one of fork, spawn"),
    ({"drop_last": "yes"}, "None .* True or False"),
    ({"normalize": 1}, "normalize must be True or False"),
    ({"preset": ClipPreset(train=False)}, "preset has train=False"),
    ({"preset": ClipPreset(train=True, seed=2), "seed": 3}, "seed=3 disagrees"),
    ({"preset": ClipPreset(train=True, clip_len=17)}, "longer than the stored clips"),
    ({"preset": ClipPreset(train=True, crop_size=200)}, "does not fit"),
    ({"batch_size": 64}, "fewer than one batch"),
])
def test_constructor_validates_and_says_what_is_allowed(shards, kw, words):
    kw = {"batch_size": 4, "workers": 0, **kw}
    with pytest.raises(ValueError, match=words):
        DaliClipLoader(shards["raw"], train=True, **kw)


@pytest.mark.parametrize("workers", [0, 2])
def test_damaged_value_is_a_one_line_dataset_error_naming_the_key(shards, tmp_path, workers):
    import shutil

    root = str(tmp_path / "bad")
    shutil.copytree(shards["lz4"], root, ignore=shutil.ignore_patterns("lock.mdb"))
    store = open_clips(root)
    shards, refs = store.refs([5])
    path, key = store.shard_paths[int(shards[0])], clip_key(*refs[0])
    for p in store.shard_paths:
        HANDLES.forget(p)  # this process's read handles, so the shard can be opened for writing
    env = lmdb.open(path, lock=False, map_size=os.path.getsize(os.path.join(path, "data.mdb")) * 2 + (64 << 20))
    with env.begin(write=True) as txn:
        stored = txn.get(key)
        assert stored is not None
        value = bytearray(stored)
        value[-10] ^= 0xFF
        txn.put(key, bytes(value))
    env.close()
    loader = DaliClipLoader(root, train=False, batch_size=4, workers=workers, verify=True)
    with pytest.raises(FormatError, match=f"{path}: {key.decode()}: payload crc32") as info:
        for _ in loader:
            pass
    assert "\n" not in str(info.value)


def test_h264_without_a_gpu_is_refused_in_one_line_naming_what_reads_it(shards):
    """DALI has no CPU H.264 decoder and the source route does not fall back to decoding it in Python: refused when
    the loader is made, saying why, and what reads on the CPU instead."""
    root = shards["h264"]
    for make in (lambda: DaliClipLoader(root, train=False, batch_size=4, workers=0),
                 lambda: build_dali_loader(root, train=True, batch_size=4)):
        with pytest.raises(ValueError) as info:
            make()
        msg = str(info.value)
        assert "\n" not in msg and msg.startswith(f"{root}: h264 clips need a GPU under DALI (DALI decodes H.264 "
                                                  f"with NVDEC on a GPU only;")
        assert "DALI reads raw, jpeg and vp9 conversions" in msg and "device_id" not in msg
        assert msg.endswith("--loader threads reads this one on the CPU")


def test_a_graph_says_why_it_needs_a_gpu_exactly_when_it_has_no_cpu_fallback():
    from loaders.dali.graphs import GRAPHS, Graph

    decode = GRAPHS[("stream", "h264")].decode
    assert not GRAPHS[("stream", "h264")].cpu_fallback and GRAPHS[("stream", "vp9")].cpu
    with pytest.raises(ValueError, match="cpu_fallback=False needs cpu=False"):
        Graph(decode=decode, cpu=True, cpu_fallback=False, gpu_only="why")
    with pytest.raises(ValueError, match="gpu_only says why"):
        Graph(decode=decode, cpu=False, cpu_fallback=False)
    with pytest.raises(ValueError, match="gpu_only says why"):
        Graph(decode=decode, cpu=False, gpu_only="a reason nobody reads: the source route falls back")


def test_video_graph_crops_the_even_coded_frames_back_to_the_stored_size(shards):
    """The vp9 graph alone, on DALI's CPU backend: clips of 128 x 171 are coded 128 x 172; the graph gives the
    stored (T, H, W, C) and open_clips' decode of it, bit for bit."""
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline

    from loaders.dali.graphs import graph_for

    store = open_clips(shards["vp9"])
    graph = graph_for(store.codec)
    items = payloads(store, range(3))
    shape = items[0][0].shape
    assert shape[2] % 2 == 1  # the odd width the crop-back is for
    pipe = Pipeline(batch_size=3, num_threads=1, device_id=None, exec_dynamic=True)
    with pipe:
        data = fn.external_source(source=lambda: [np.frombuffer(p, np.uint8) for _, p in items],
                                  dtype=types.DALIDataType.UINT8, ndim=1)
        dims = fn.external_source(source=lambda: [np.asarray(h.shape, np.int32) for h, _ in items],
                                  dtype=types.DALIDataType.INT32, ndim=1)
        pipe.set_outputs(graph.decode(data, shape=dims, offsets=None, sizes=None, frames=shape[0], device="cpu"))
    pipe.build()
    (out,) = pipe.run()
    for k, (header, payload) in enumerate(items):
        got = np.array(out[k])
        assert got.shape == tuple(header.shape) and out.layout() == "FHWC"
        assert np.array_equal(got, store.codec.decode(payload, header.shape))
    del pipe


def test_dali_opens_an_h264_payload_from_memory_and_finds_its_h264_stream(shards, capfd):
    """What can be checked of the GPU route without a GPU: DALI's video decoder opens a stored Annex-B payload from
    memory and identifies its H.264 stream, so only the decoding is left to NVDEC. The CPU variant then refuses it
    by its codec (DALI has no CPU H.264 decoder, and says so in its log): a refusal naming h264, which bytes that
    are not a video do not get."""
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline

    store = open_clips(shards["h264"])
    (_, payload), = payloads(store, range(1))
    logs = []
    for data in (payload, bytes(range(256)) * 8):
        batch = [np.frombuffer(data, np.uint8)]
        pipe = Pipeline(batch_size=1, num_threads=1, device_id=None, exec_dynamic=True)
        with pipe:
            pipe.set_outputs(fn.decoders.video(fn.external_source(
                source=lambda: batch, dtype=types.DALIDataType.UINT8, ndim=1), device="cpu"))
        pipe.build()
        with pytest.raises(RuntimeError, match="Failed to create video decoder"):
            pipe.run()
        del pipe
        captured = capfd.readouterr()
        logs.append(captured.out + captured.err)
    assert "(h264) is not supported by the CPU variant" in logs[0]
    assert "h264" not in logs[1]


def test_missing_dali_is_a_one_line_import_error_and_loaders_never_imports_it():
    code = (
        "import sys\n"
        "import loaders, loaders.dataset, loaders.factory, loaders.presets, loaders.sampler\n"
        "assert not any(m.startswith('nvidia.dali') for m in sys.modules), 'loaders imported DALI'\n"
        "sys.modules['nvidia.dali'] = None\n"
        "import loaders.dali\n"  # the package imports no DALI; its loaders do
        "reason = loaders.dali.missing()\n"
        "try:\n"
        "    from loaders.dali import DaliClipLoader\n"
        "except ImportError as exc:\n"
        "    print('ERR', exc)\n"
        "    assert str(exc) == reason\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith("ERR") and "pip install nvidia-dali-cuda120" in line and "\n" not in line


def test_self_check_runs_on_the_cpu_backend(shards, capsys):
    """``gpu_self_check`` is meant for a GPU machine; its comparisons are exercised here on the CPU backend."""
    results = gpu_self_check(shards["lz4"], device_id=None, workers=0)
    assert results["device"] == "cpu"
    assert results[f"{shards['lz4']}/train"]["max_diff"] == 0 and results[f"{shards['lz4']}/eval"]["max_diff"] == 0
    assert results[f"{shards['lz4']}/multiscale"]["max_diff"] <= 2
    assert "normalize  ok" in capsys.readouterr().out


def test_gpu_self_check_refuses_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: run python scripts/dali_check.py instead")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        gpu_self_check("/nonexistent", device_id=0)


def test_a_gpu_device_without_a_gpu_is_a_one_line_error(shards):
    """Where DALI would fail, building the pipeline, with its own multi-line assertion: one line saying what to
    pass instead (the loader itself is made: a GPU graph can be defined without a GPU)."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    loader = DaliClipLoader(shards["raw"], train=True, batch_size=4, workers=0, device_id=0)
    with pytest.raises(ValueError) as info:
        next(iter(loader))
    loader.close()
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("device_id=0 needs a CUDA GPU and torch sees no CUDA GPU here")
    assert msg.endswith("pass device_id=None to run on DALI's CPU backend")


def test_pipelines_use_the_dynamic_executor_that_run_with_a_stream_needs(shards):
    """``pipe.run(stream)`` (the loaders' call on a GPU) is refused by DALI's legacy executor; every pipeline
    here asks for the dynamic one explicitly (DALI's default only in recent releases)."""
    from nvidia.dali import fn
    from nvidia.dali.pipeline import Pipeline

    from loaders.dali.base import pipeline_options

    def build(**kw) -> Pipeline:
        pipe = Pipeline(batch_size=2, num_threads=1, device_id=None, seed=1, **kw)
        with pipe:
            pipe.set_outputs(fn.random.uniform(range=[0.0, 1.0]))
        pipe.build()
        return pipe

    legacy = build(exec_dynamic=False)
    with pytest.raises(RuntimeError, match="Asynchronous outputs require"):
        legacy.run(0)  # stream 0 stands for the torch stream the loaders pass
    ours = build(**pipeline_options())
    assert ours.exec_dynamic is True
    try:
        ours.run(0)
    except RuntimeError as exc:  # without a GPU the stream then fails in CUDA, past the executor's check
        assert "Asynchronous outputs require" not in str(exc)
    loader = DaliClipLoader(shards["raw"], train=False, batch_size=4, workers=0)
    next(iter(loader))
    assert loader._pipe.exec_dynamic is True
    loader.close()
