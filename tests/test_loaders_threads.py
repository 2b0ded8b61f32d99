"""Reader threads: the threaded loader's batches equal the DataLoader's, shard handles are thread-safe,
errors and hangs surface in the consumer, JPEG pixels stay libjpeg-turbo's, and the trainer uses it."""

from __future__ import annotations

import hashlib
import io
import os
import re
import struct
import threading

import numpy as np
import pytest
import torch

from convert.format import WRITE_CODECS, FormatError
from convert.format.codecs import JpegCodec
from convert.format.lmdb import HANDLES, clip_key
from loaders import (
    ClipDataLoader,
    ClipDataset,
    DistributedClipSampler,
    LoaderTimeout,
    ThreadedClipLoader,
    build_loader,
    default_threads,
    loader_meter,
    open_clips,
)

from .backend_params import ALL, SPECIFIED, TEST_BACKENDS
from .conftest import load_script
from .loaders_fixtures import (  # noqa: F401
    backend_converted,
    converted,
    copy_conversion,
    jpeg_root,
    loader_base,
    lz4_root,
    payloads,
    raw_root,
    rewrite_value,
    tfrecord_converted,
)

FIELDS = ("clip", "label", "clip_index", "index")


def _batches(loader, epoch: int = 0, position: int = 0) -> list[dict]:
    """Every batch of one pass, copied (a threaded batch is valid only until the next is asked for)."""
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
        loader.sampler.set_position(position)
    return [{k: (v.clone() if isinstance(v, torch.Tensor) else list(v)) for k, v in b.items()} for b in loader]


def _assert_same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w) == sorted(FIELDS + ("video_id",))
        for k in FIELDS:
            assert g[k].dtype == w[k].dtype and torch.equal(g[k], w[k]), k
        assert g["video_id"] == w["video_id"]


@pytest.mark.parametrize("backend, codec", [(b, c) for b in SPECIFIED for c in WRITE_CODECS]
                         + [(b, "raw") for b in TEST_BACKENDS])
def test_threaded_batches_equal_the_dataloader_batches(synth_videos, loader_base, backend, codec):  # noqa: F811
    root = backend_converted(synth_videos, loader_base, backend, codec)
    for train in (True, False):
        ds = ClipDataset(root, train=train, seed=3)
        n = len(ds)

        def sampler() -> DistributedClipSampler:
            return DistributedClipSampler(n, shuffle=train, seed=3, drop_last=train)

        # batch 5 leaves a short last batch in evaluation; epoch 2 and a mid-epoch position in training
        epoch, position = (2, 7) if train else (0, 0)
        want = _batches(build_loader(ds, batch_size=5, sampler=sampler(), train=train, workers=0), epoch, position)
        got = _batches(build_loader(ds, batch_size=5, sampler=sampler(), train=train, threads=2), epoch, position)
        assert sum(len(b["index"]) for b in want) == ((n - position) // 5 * 5 if train else n)
        if not train:
            assert len(want[-1]["index"]) == n % 5 or n % 5 == 0
        _assert_same(got, want)


def test_thread_count_and_prefetch_do_not_change_batches_and_worker_processes_agree(raw_root):  # noqa: F811
    ds = ClipDataset(raw_root, train=True)
    want = _batches(build_loader(ds, batch_size=4, workers=2), epoch=1)  # DataLoader worker processes
    for threads, prefetch in ((0, 1), (1, 1), (3, 2), (8, 4)):
        loader = build_loader(ds, batch_size=4, threads=threads, prefetch_factor=prefetch)
        _assert_same(_batches(loader, epoch=1), want)
        loader.close()


def test_ring_slots_are_reused_and_a_batch_holds_until_the_next_is_asked_for(raw_root):  # noqa: F811
    ds = ClipDataset(raw_root, train=True)
    loader = build_loader(ds, batch_size=4, threads=2, prefetch_factor=2, pin_memory=False)
    assert isinstance(loader, ThreadedClipLoader) and len(loader) == len(ds) // 4
    want = _batches(build_loader(ds, batch_size=4, workers=0), epoch=0)
    loader.sampler.set_epoch(0)
    pointers = set()
    for k, batch in enumerate(loader):
        pointers.add(batch["clip"].data_ptr())
        # the readers are already filling the other slots; this one must not change under us
        for _ in range(3):
            assert torch.equal(batch["clip"], want[k]["clip"])
            threading.Event().wait(0.01)
    assert len(pointers) == 3  # prefetch 2 + the one held: the same memory, epoch after epoch
    assert loader.stats(reset=False)["clips"] == len(want) * 4


def test_close_mid_epoch_ends_every_reader_thread_before_it_returns(raw_root):  # noqa: F811
    """A daemon reader thread still ending during interpreter finalization can abort the process (exit
    status 134); close() joins them, so a script that closes its loader and exits ends cleanly."""
    ds = ClipDataset(raw_root, train=True)
    loader = build_loader(ds, batch_size=4, threads=2, prefetch_factor=2, pin_memory=False)
    loader.sampler.set_epoch(0)
    batches = iter(loader)
    next(batches)
    readers = loader._pool.threads
    assert len(readers) == 2 and all(t.is_alive() for t in readers)
    loader.close()
    assert [t.is_alive() for t in readers] == [False, False]


def test_build_loader_is_a_context_manager_that_ends_its_threads_or_workers(raw_root):  # noqa: F811
    """``with build_loader(...) as loader:`` (docs/reading.md): the end of the block ends the reader threads,
    or the worker processes of the DataLoader path (persistent or not), also when the epoch was left mid-way;
    iterating after it starts fresh ones with the same batches."""
    ds = ClipDataset(raw_root, train=True)
    with build_loader(ds, batch_size=4, threads=2, prefetch_factor=2, pin_memory=False) as loader:
        assert isinstance(loader, ThreadedClipLoader)
        loader.sampler.set_epoch(0)
        next(iter(loader))
        readers = loader._pool.threads
        assert len(readers) == 2 and all(t.is_alive() for t in readers)
    assert [t.is_alive() for t in readers] == [False, False] and loader._pool is None

    want = _batches(build_loader(ds, batch_size=4, workers=0), epoch=0)
    for persistent in (True, False):
        with build_loader(ds, batch_size=4, workers=2, persistent_workers=persistent) as loader:
            assert isinstance(loader, ClipDataLoader)
            loader.sampler.set_epoch(0)
            batches = iter(loader)
            next(batches)
            workers = list(batches._workers)
            assert len(workers) == 2 and all(w.is_alive() for w in workers)
        assert [w.is_alive() for w in workers] == [False, False], persistent
        _assert_same(_batches(loader, epoch=0), want)  # closed, it still reads: with fresh workers
        loader.close()
    with build_loader(ds, batch_size=4, workers=0) as loader:  # no workers: nothing to end, closing is harmless
        _assert_same(_batches(loader, epoch=0), want)


@pytest.mark.parametrize("page", ["README.md", "docs/reading.md"])
def test_the_docs_training_example_runs_where_there_is_no_gpu(raw_root, page):  # noqa: F811
    """The README's (and docs/reading.md's) training example, run as written on a small conversion: it picks
    the device it has, so it runs on a machine without CUDA too."""
    from .conftest import ROOT

    text = open(os.path.join(ROOT, page)).read()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "to_model_input(batch" in b]
    assert len(blocks) == 1, page
    code = blocks[0].replace('"out/k400_train"', repr(raw_root)).replace("batch_size=32", "batch_size=4")
    namespace: dict = {"epochs": 1}
    exec(compile(code, page, "exec"), namespace)
    namespace["loader"].close()
    x = namespace["x"]
    assert x.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert x.dtype == torch.float32 and tuple(x.shape) == (4, 3, 16, 112, 112)


def test_many_threads_open_and_read_many_shards_at_once(synth_videos, tmp_path):  # noqa: F811
    """Fresh shard paths, so the threads race to open each LMDB environment and map each TFRecord part."""
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    threads = 12
    for backend in ALL:
        src = str(tmp_path / f"{backend}_src")
        run_job(synth_videos, src, ConvertConfig(backend=backend, codec="lz4", size=(40, 52)),
                JobOptions(workers=2, shards=10, progress=False))
        ref = open_clips(src)
        n = len(ref)
        want = [hashlib.sha256(ref[i].clip.tobytes()).hexdigest() for i in range(n)]
        assert len(ref.shard_paths) == 10
        for round_ in ("own store per thread", "one shared store"):
            root = copy_conversion(src, str(tmp_path / f"{backend}_{round_.replace(' ', '_')}"))
            shared = open_clips(root) if round_ == "one shared store" else None
            barrier = threading.Barrier(threads)
            results: list = [None] * threads

            def read(k: int) -> None:
                try:
                    barrier.wait()
                    store = shared if shared is not None else open_clips(root)
                    order = np.random.default_rng(k).permutation(n).tolist()
                    got = {order[clip.position]: hashlib.sha256(
                        store.codec.decode(clip.payload, clip.header.shape).tobytes()).hexdigest()
                        for clip in store.read(order)}
                    results[k] = [got[i] for i in range(n)]
                except Exception as exc:  # noqa: BLE001 - reported to the asserting thread
                    results[k] = exc

            pool = [threading.Thread(target=read, args=(k,)) for k in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join(timeout=120)
            for r in results:
                assert r == want, (backend, round_, r if isinstance(r, Exception) else "wrong data")
            store = shared or open_clips(root)
            if backend == "lmdb":
                # one environment per shard, whoever opened it
                envs = {os.path.realpath(p): HANDLES.get(p) for p in store.shard_paths}
                assert len({id(e) for e in envs.values()}) == 10
                assert all(os.path.realpath(p) in HANDLES._envs for p in store.shard_paths)
            elif backend == "tfrecord" and shared is not None:
                # one map per part of every shard, however many threads asked for it first
                for si in range(10):
                    reader = store.reader(si)
                    assert sorted(reader._maps) == sorted(p["part"] for p in reader._parts if p["records"])


def _damaged(raw_root, tmp_path, i: int, change) -> tuple[str, str, str]:  # noqa: F811
    store = open_clips(raw_root)
    shards, refs = store.refs([i])
    rel = store.manifest.shards[int(shards[0])].path
    key = clip_key(*refs[0])
    root = copy_conversion(raw_root, str(tmp_path / "damaged"))
    rewrite_value(os.path.join(root, rel), key, change)
    return root, os.path.join(root, rel), key.decode()


def _error(loader) -> str:
    loader.sampler.set_epoch(0)
    with pytest.raises(FormatError) as exc:
        for _ in loader:
            pass
    return str(exc.value)


@pytest.mark.parametrize("codec", ["raw", "jpeg"])
def test_bad_data_in_a_thread_is_the_same_one_line_error(request, tmp_path, codec):
    root_in = request.getfixturevalue(f"{codec}_root")

    def damage(value: bytes) -> bytes:
        b = bytearray(value)
        if codec == "raw":
            b[-1000] ^= 0xFF  # a pixel: the CRC-32 in the header no longer matches
        else:
            start = len(b) - len(b) // 3  # inside a JPEG's entropy-coded data, sizes unchanged
            b[start:start + 64] = bytes(64)
            b[start + 100:start + 400] = b"\xff\xd9" * 150
        return bytes(b)

    root, shard, key = _damaged(root_in, tmp_path, 6, damage)
    ds = ClipDataset(root, train=False)
    ds.verify_checksums = codec == "raw"  # per-read CRC checks (at construction it would check every shard)
    want = _error(build_loader(ds, batch_size=4, train=False, workers=0))
    assert "\n" not in want and shard in want and key in want
    assert ("crc32" in want) if codec == "raw" else ("jpeg frame" in want and "cannot be decoded" in want)
    threaded = build_loader(ds, batch_size=4, train=False, threads=3)
    assert _error(threaded) == want
    assert _error(threaded) == want  # and again on the next pass: the loader is still usable
    threaded.close()


def test_a_stuck_read_raises_a_timeout_naming_the_clip(raw_root):  # noqa: F811
    ds = ClipDataset(raw_root, train=False)
    release = threading.Event()
    real = ds.read_into

    def read_into(items, out):
        if 9 in [i for i in items]:
            release.wait(60)  # a read that hangs (a dead network filesystem) until the test lets go
        return real(items, out)

    ds.read_into = read_into
    loader = ThreadedClipLoader(ds, batch_size=4, sampler=DistributedClipSampler(len(ds), shuffle=False,
                                                                                 with_epoch=False),
                                threads=2, prefetch=2, timeout=0.5)
    it = iter(loader)
    assert [int(i) for i in next(it)["index"]] == [0, 1, 2, 3]
    assert [int(i) for i in next(it)["index"]] == [4, 5, 6, 7]
    with pytest.raises(LoaderTimeout) as exc:
        next(it)
    msg = str(exc.value)
    release.set()
    assert "\n" not in msg and "no batch after 0.5 s" in msg
    assert f"clip 8 ({ds.store.where(8)})" in msg  # the stuck slice: clips 8 and 9
    # the loader leaves the stuck thread and its slot behind and starts afresh
    assert [int(i) for b in loader for i in b["index"]] == list(range(len(ds)))


def test_jpeg_pixels_are_libjpeg_turbos_default_decode(jpeg_root):  # noqa: F811
    from PIL import Image

    store = open_clips(jpeg_root)
    codec = JpegCodec()
    frames = 0
    for header, payload in payloads(store, range(0, len(store), 5)):
        offsets, sizes = codec.parts(payload, header.shape)
        pillow = [np.asarray(Image.open(io.BytesIO(payload[a:a + n])).convert("RGB"))
                  for a, n in zip(offsets.tolist(), sizes.tolist())]
        for j, (a, n) in enumerate(zip(offsets.tolist(), sizes.tolist())):
            assert np.array_equal(codec.decode_frame(memoryview(payload)[a:a + n], header.shape, j), pillow[j])
            frames += 1
        # the reader's path decodes each frame in place, into a window of the clip
        assert np.array_equal(codec.window(payload, header.shape, 3, 9), np.stack(pillow[3:12]))
    assert frames == 16 * len(range(0, len(store), 5))
    # a frame of another size than the header's: the same one-line error on both paths
    header, payload = payloads(store, [0])[0]
    small = codec.encode(np.zeros((1, 8, 8, 3), np.uint8))
    with pytest.raises(FormatError, match=r"jpeg frame 0 is \(8, 8, 3\), header says \(128, 171, 3\)"):
        codec.window(small, (1, *header.shape[1:]), 0, 1)


def test_lz4_frames_decode_in_place_as_python_lz4_decodes_them(lz4_root):  # noqa: F811
    import lz4.block

    store = open_clips(lz4_root)
    codec = store.codec
    header, payload = payloads(store, [len(store) // 2])[0]
    t, h, w, c = header.shape
    offsets, sizes = codec.parts(payload, header.shape)
    parts = [payload[a:a + n] for a, n in zip(offsets.tolist(), sizes.tolist())]
    want = np.stack([np.frombuffer(lz4.block.decompress(p, uncompressed_size=h * w * c), np.uint8).reshape(h, w, c)
                     for p in parts])
    assert np.array_equal(codec.window(payload, header.shape, 0, t), want)
    assert np.array_equal(codec.decode_frame(memoryview(parts[5]), header.shape, 5), want[5])
    wide = np.zeros((4, h, w + 1, c), np.uint8)  # a window that is not contiguous: decoded, then copied
    assert np.array_equal(codec.window(payload, header.shape, 2, 4, out=wide[:, :, :w]), want[2:6])
    damaged = bytearray(payload)
    a, n = int(offsets[3]), int(sizes[3])
    damaged[a:a + n] = b"\xff" * n
    with pytest.raises(FormatError, match=f"lz4 frame 3 does not decompress to {h * w * c} bytes"):
        codec.window(bytes(damaged), header.shape, 0, t)
    short = lz4.block.compress(bytes(h * w * c // 2), store_size=False)  # decodes to half a frame
    with pytest.raises(FormatError, match=f"lz4 frame 0 decompressed to {h * w * c // 2} bytes, needs {h * w * c}"):
        codec.window(struct.pack("<II", 1, len(short)) + short, (1, h, w, c), 0, 1)


def test_build_loader_threads_options(raw_root, monkeypatch):  # noqa: F811
    ds = ClipDataset(raw_root, train=True)
    with pytest.raises(ValueError, match="choose reader threads or worker processes"):
        build_loader(ds, batch_size=4, threads=2, workers=2)
    with pytest.raises(ValueError, match="takes no collate_fn"):
        build_loader(ds, batch_size=4, threads=2, collate_fn=list)
    with pytest.raises(ValueError, match="threads must be an int >= 0"):
        build_loader(ds, batch_size=4, threads=-1)
    with pytest.raises(ValueError, match="needs a dataset with batch_fields and read_into"):
        build_loader(list(range(10)), batch_size=4, threads=2)
    loader = build_loader(ds, batch_size=4, threads=2, timeout=7)
    assert (loader.timeout, loader.prefetch, loader.drop_last, loader.pin_memory) == (7.0, 4, True,
                                                                                      torch.cuda.is_available())
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(40)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert default_threads() == 10
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert default_threads() == 16  # capped
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert default_threads() == 1


def test_loader_meter_counts_what_the_readers_did(raw_root):  # noqa: F811
    for kw in ({"threads": 2, "prefetch_factor": 3}, {"workers": 2}, {"workers": 0}):
        ds = ClipDataset(raw_root, train=True)
        loader = build_loader(ds, batch_size=4, **kw)
        meter = loader_meter(loader)
        loader.sampler.set_epoch(0)
        batches = sum(1 for _ in loader)
        row = meter()
        assert row["loader_clips_per_s"] > 0
        if "threads" in kw:
            assert 0 <= row["loader_queue_depth"] <= 3
            assert loader.stats()["clips"] == 0  # the meter took (and reset) the counts
        else:
            assert "loader_queue_depth" not in row
            assert ds.read_work()[0] == len(ds) // 4 * 4  # every worker's clips reached the shared counts
        assert meter()["loader_clips_per_s"] is None  # nothing read since
        assert batches == len(ds) // 4


def test_bench_read_copy_bound_reads_the_stored_values_through_threads(raw_root):  # noqa: F811
    from benchmarks.loaders.common import ReadCopyDataset

    bound = ReadCopyDataset(raw_root)
    store = open_clips(raw_root)
    loader = build_loader(bound, batch_size=5, threads=2, train=False)
    seen = 0
    for batch in loader:
        indices = list(range(seen, seen + len(batch["bytes"])))
        values = [payload for _, payload in payloads(store, indices)]
        assert batch["bytes"].tolist() == [len(v) for v in values]
        for row, value in zip(batch["clip"], values):
            assert bytes(row[:len(value)].numpy()) == value
        seen += len(values)
    assert seen == len(store)


def test_threads_check_compares_every_batch_with_the_dataloader_path(raw_root, capsys):  # noqa: F811
    main = load_script("threads_check").main

    assert main([raw_root, "--device", "cpu", "--epochs", "2"]) == 0
    # 47 clips in batches of 8, drop_last: 5 batches per epoch
    assert f"threads_check: {raw_root}: 10 batches on cpu (pinned ring: False), 0 differ" in capsys.readouterr().out
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="pin_memory=True but CUDA is not available"):
            loader = build_loader(ClipDataset(raw_root, train=True), batch_size=4, threads=1, pin_memory=True)
        assert loader.pin_memory is False
