"""Hostile and damaged conversions: every reader and ``verify`` answer in one line naming what they read.

A manifest that is not one (missing fields, wrong types, nested without end, a
FIFO, an endless device), records and headers that disagree with it, LMDB
meta pages and trees damaged in many places, a shard rewritten under an open
reader, video ids too long for LMDB keys: none of these may give a traceback,
a hang, an impossible label, or a ``verify`` that passes what readers refuse.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import lmdb
import numpy as np
import pytest

from convert.format import FormatError
from convert.format.layout import pack_header, unpack_header
from convert.format.lmdb import HANDLES, clip_key, done_key
from convert.store import open_clips
from convert.store.verify import verify

from .conftest import ROOT
from .convert_helpers import signal_and_wait
from .loaders_fixtures import converted, copy_conversion, loader_base, raw_root, rewrite_value  # noqa: F401


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


def _edit_manifest(root: str, change) -> str:
    path = os.path.join(root, "manifest.json")
    with open(path) as fh:
        manifest = json.load(fh)
    change(manifest)
    with open(path, "w") as fh:
        json.dump(manifest, fh)
    return path


def _del(*keys):
    def change(m):
        for key in keys:
            del m[key]
    return change


def _shard0(change):
    def apply(m):
        change(m["shards"][0])
    return apply


BROKEN_MANIFESTS = {
    "no shards": (_del("shards"), "lacks 'shards'"),
    "no totals": (_del("totals"), "lacks 'totals'"),
    "shards null": (lambda m: m.update(shards=None), "shards is null, expected list"),
    "entry without name": (_shard0(lambda s: s.pop("name")), "shards[0]: lacks 'name'"),
    "entry without path": (_shard0(lambda s: s.pop("path")), "shards[0]: lacks 'path'"),
    "path leaving OUT": (_shard0(lambda s: s.update(path="../elsewhere")), "leaves the conversion folder"),
    "clips as text": (_shard0(lambda s: s.update(clips="12")), "clips is \"12\", expected int"),
    "classes not names": (lambda m: m.update(classes=[1, 2, 3, 4, 5]), "classes must be a list of names"),
    "clip shape of 3": (lambda m: m.update(clip_shape=[16, 128, 171]), "clip_shape is [16, 128, 171]"),
}


@pytest.mark.parametrize("case", list(BROKEN_MANIFESTS))
def test_a_manifest_that_is_not_one_is_one_line_in_verify_and_the_readers(raw_root, tmp_path, case):  # noqa: F811
    change, words = BROKEN_MANIFESTS[case]
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    path = _edit_manifest(root, change)
    problems, _ = verify(root)
    assert len(problems) == 1 and words in problems[0] and path in problems[0], problems
    with pytest.raises(FormatError) as exc:
        open_clips(root)
    msg = _one_line(exc)
    assert words in msg and path in msg


def test_a_deeply_nested_manifest_is_one_line(raw_root, tmp_path):  # noqa: F811
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    with open(os.path.join(root, "manifest.json"), "w") as fh:
        fh.write("[" * 100_000 + "]" * 100_000)  # RecursionError in json, caught
    problems, _ = verify(root)
    assert len(problems) == 1 and "not valid JSON: RecursionError" in problems[0]
    with pytest.raises(FormatError, match="not valid JSON"):
        open_clips(root)


def _run(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_manifest_that_is_no_regular_file_is_refused_unread(raw_root, tmp_path, kind):  # noqa: F811
    """A FIFO would hang a reader that opens it, /dev/zero exhaust its memory: both are refused before a read
    (each in a child with a timeout, so a regression fails instead of hanging the suite)."""
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    path = os.path.join(root, "manifest.json")
    os.remove(path)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)
    for cmd in ("from convert.store.verify import verify; print(verify(%r)[0])",
                "from loaders import open_clips\ntry:\n    open_clips(%r)\nexcept ValueError as e:\n    print(e)"):
        got = _run(cmd % root, timeout=60)
        assert got.returncode == 0, got.stderr
        assert "the manifest is not a regular file" in got.stdout and path in got.stdout


def _write_record(shard: str, video_id: str, change) -> None:
    """Rewrite one video record of an LMDB shard in place (``change(record dict)``)."""
    HANDLES.forget(shard)
    env = lmdb.open(shard, subdir=True, max_dbs=0, lock=False,
                    map_size=os.path.getsize(os.path.join(shard, "data.mdb")) * 2 + (64 << 20))
    with env.begin(write=True) as txn:
        stored = txn.get(done_key(video_id))
        assert stored is not None
        rec = json.loads(stored)
        change(rec)
        txn.put(done_key(video_id), json.dumps(rec).encode())
    env.close()


def test_verify_refuses_a_record_label_the_readers_refuse(raw_root, tmp_path):  # noqa: F811
    """verify ok must mean every reader reads every clip: a record's label outside the classes fails both."""
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    store = open_clips(raw_root)
    vid, shard = store.video_ids[0], os.path.join(root, store.manifest.shards[int(store.video_shard[0])].path)
    _write_record(shard, vid, lambda r: r.update(label=77))
    problems, _ = verify(root)
    assert any(f"video record {vid!r}: label 77 outside the 5 classes" in p for p in problems), problems
    with pytest.raises(FormatError, match="label 77 outside the 5 classes"):
        open_clips(root)


def test_verify_and_the_readers_refuse_a_header_label_that_is_not_its_records(raw_root, tmp_path):  # noqa: F811
    """A clip whose header label is another class than its video's record: verify and every read say so."""
    from loaders import ClipDataset

    root = copy_conversion(raw_root, str(tmp_path / "c"))
    store = open_clips(raw_root)
    shards, refs = store.refs([0])
    shard = os.path.join(root, store.manifest.shards[int(shards[0])].path)
    key = clip_key(*refs[0])
    other = (int(store.video_labels[0]) + 1) % len(store.classes)

    def relabel(value: bytes) -> bytes:
        h = unpack_header(value)
        payload = value[h.offset:]
        return pack_header(codec_id=h.codec_id, shape=h.shape, label=other, clip_index=h.clip_index,
                           start_frame=h.start_frame, video_id=h.video_id, payload=payload) + payload

    HANDLES.forget(shard)
    rewrite_value(shard, key, relabel)
    problems, _ = verify(root)
    assert any(f"label {other}, its video record says" in p for p in problems), problems
    damaged = open_clips(root)
    with pytest.raises(FormatError) as exc:
        damaged[0]
    assert f"label {other}, its video record says {int(store.video_labels[0])}" in _one_line(exc)
    with pytest.raises(FormatError):
        ClipDataset(root, train=False)[0]


def test_an_impossible_stored_label_never_comes_out_of_open_clips(raw_root, tmp_path):  # noqa: F811
    """open_clips(...)[i] returned label 77 with 3 classes: every read path checks the header's label now."""
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    store = open_clips(raw_root)
    shards, refs = store.refs([3])
    shard = os.path.join(root, store.manifest.shards[int(shards[0])].path)

    def relabel(value: bytes) -> bytes:
        h = unpack_header(value)
        payload = value[h.offset:]
        return pack_header(codec_id=h.codec_id, shape=h.shape, label=77, clip_index=h.clip_index,
                           start_frame=h.start_frame, video_id=h.video_id, payload=payload) + payload

    HANDLES.forget(shard)
    rewrite_value(shard, clip_key(*refs[0]), relabel)
    damaged = open_clips(root)
    with pytest.raises(FormatError) as exc:
        damaged[3]
    msg = _one_line(exc)
    assert shard in msg and "label 77 outside the 5 classes" in msg
    assert damaged[2].label == store[2].label  # the others read as before


def test_a_shard_rewritten_under_an_open_reader_is_refused_in_one_line(raw_root, tmp_path):  # noqa: F811
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    store = open_clips(root)
    first = store[0].clip
    shards, refs = store.refs([0])
    shard = store.shard_paths[int(shards[0])]
    # Another process rewrites the value as it is (a write transaction: the file changes), as a conversion
    # running again would; this process keeps its reader open.
    code = ("import sys; from tests.loaders_fixtures import rewrite_value; "
            f"rewrite_value({shard!r}, {clip_key(*refs[0])!r}, lambda value: value)")
    assert _run(code).returncode == 0
    with pytest.raises(FormatError) as exc:
        store[0]
    msg = _one_line(exc)
    assert shard in msg and "changed since it was opened" in msg
    store.close()
    HANDLES.forget(shard)
    assert np.array_equal(open_clips(root)[0].clip, first)  # opened again: read as it is now


def test_a_tfrecord_shard_rewritten_under_an_open_reader_is_refused(synth_videos, loader_base):  # noqa: F811
    from .loaders_fixtures import tfrecord_converted

    root = tfrecord_converted(synth_videos, loader_base, "raw")
    store = open_clips(root)
    store[0]
    shard = store.shard_paths[0]
    marker = os.path.join(shard, "complete.json")
    os.rename(marker, marker + ".moved")  # what a --retry-failed rerun does first: the summary goes
    try:
        with pytest.raises(FormatError, match="changed since it was opened"):
            store[0]
    finally:
        os.rename(marker + ".moved", marker)


# -- structural damage to LMDB shards --------------------------------------------------------------------------

_DAMAGE_CHILD = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from convert.format import FormatError
from convert.store import open_clips
from convert.store.verify import verify
from loaders import ClipDataset, build_loader

for root in sys.argv[1:]:
    shard = os.path.join(root, "shards", "shard-00000")
    outcome = {}
    for name, read in (
        ("open_clips", lambda: [open_clips(root)[i].label for i in range(len(open_clips(root)))]),
        ("ClipDataset", lambda: ClipDataset(root, train=False, crop_size=24).__getitems__(list(range(4)))),
        ("threads", lambda: list(build_loader(ClipDataset(root, train=False, crop_size=24), batch_size=4,
                                              threads=1, train=False))),
        ("verify", lambda: verify(root, workers=0)),
    ):
        print(json.dumps({"root": root, "reading": name}), flush=True)  # where a crash happened, if one does
        try:
            got = read()
            if name == "verify" and got[0]:
                outcome[name] = "problems" if all("\n" not in p for p in got[0]) else "multi-line"
            else:
                outcome[name] = "ok"
        except FormatError as exc:
            text = str(exc)
            outcome[name] = "format-error" if "\n" not in text and (shard in text or root in text) else "bad-message"
        except Exception as exc:  # noqa: BLE001 - what the test looks for: anything else leaked
            outcome[name] = f"leaked {type(exc).__name__}: {exc}"
    print(json.dumps({"root": root, "outcome": outcome}), flush=True)
"""


def _damage(path: str, offset: int, span: int = 8) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        old = fh.read(span)
        fh.seek(offset)
        fh.write(bytes(b ^ 0xA5 for b in old))


@pytest.fixture(scope="module")
def one_shard(synth_videos, tmp_path_factory):  # noqa: F811
    """A small raw conversion in one shard (its LMDB pages are what the damage tests hit)."""
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    out = str(tmp_path_factory.mktemp("one") / "raw1")
    run_job(synth_videos, out, ConvertConfig(size=(32, 40)), JobOptions(workers=1, shards=1, progress=False))
    return out


def test_damaged_lmdb_meta_pages_and_trees_give_one_line_errors_everywhere(one_shard, tmp_path):
    """Bytes flipped in both meta pages and across the tree's pages: each reader (plain, Dataset, reader
    threads, verify; DataLoader workers and DALI's source route read through the same shard readers, and
    their damaged-value tests are in test_loaders_errors and test_loaders_dali) reads on, reports problems,
    or raises one FormatError naming the shard; none lets an lmdb exception, KeyError or TypeError through.
    A child that dies by a signal (a page pointing past the file can crash LMDB itself) is counted apart:
    that is verify's isolation's business, not a leak."""
    data = os.path.join(one_shard, "shards", "shard-00000", "data.mdb")
    size = os.path.getsize(data)
    page = 4096
    # Meta pages 0 and 1 (their header, database records and last page number), then page headers and
    # bodies across the file.
    offsets = [o for base in (0, page) for o in (16, 24, 40, 56, 72, 88, 104, 120, 128, 136)]
    offsets += [p * page + d for p in range(2, size // page, max(1, (size // page) // 12)) for d in (0, 10, 24)]
    roots = {}
    for k, offset in enumerate(offsets):
        root = roots[offset] = str(tmp_path / f"d{k}")
        shutil.copytree(one_shard, root, ignore=shutil.ignore_patterns("lock.mdb"))
        _damage(os.path.join(root, "shards", "shard-00000", "data.mdb"), offset)
    # One child reads the damaged copies in turn; one that dies of a signal is started again after the
    # copy it died on.
    leaks, outcomes, todo = [], {}, list(roots.values())
    while todo:
        got = subprocess.run([sys.executable, "-c", _DAMAGE_CHILD, *todo], cwd=ROOT, capture_output=True,
                             text=True, timeout=600)
        lines = [json.loads(line) for line in got.stdout.splitlines() if line.startswith("{")]
        done = [line for line in lines if "outcome" in line]
        for line in done:
            outcomes[line["root"]] = line["outcome"]
            leaks += [f"{line['root']}: {reader}: {what}" for reader, what in line["outcome"].items()
                      if what not in ("ok", "format-error", "problems")]
        finished = {line["root"] for line in done}
        todo = [r for r in todo if r not in finished]
        if got.returncode == 0 or not todo:
            break
        assert got.returncode < 0, got.stderr[-2000:]  # only a signal may end a reader early
        outcomes[todo[0]] = f"signal {-got.returncode} while reading {lines[-1].get('reading')}"
        todo = todo[1:]
    assert leaks == [], leaks
    damaged = [o for o in outcomes.values() if isinstance(o, dict) and "format-error" in o.values()]
    assert len(damaged) >= 5, outcomes  # the damage reached the readers, not only unused bytes


# -- video ids too long for LMDB keys ----------------------------------------------------------------------------

def test_a_video_id_too_long_for_lmdb_keys_is_rejected_at_planning(synth_videos, tmp_path):
    """Nested folders make an id of more bytes than LMDB's keys take: the video is rejected with its reason
    before any work (it used to fail every rerun as a machine error); TFRecord, which has no such keys, keeps it."""
    from convert.format.lmdb.writer import MAX_KEY_BYTES
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    env = lmdb.open(str(tmp_path / "probe"), map_size=1 << 20)
    assert env.max_key_size() == MAX_KEY_BYTES
    env.close()
    src = tmp_path / "src"
    deep = src / "spin" / ("d" * 120) / ("e" * 120) / ("f" * 120) / ("g" * 140)
    deep.mkdir(parents=True)
    for cls in ("spin", "move_up"):
        (src / cls).mkdir(exist_ok=True)
        name = sorted(os.listdir(os.path.join(synth_videos, cls)))[0]
        os.symlink(os.path.join(synth_videos, cls, name), src / cls / name)
    os.symlink(os.path.join(synth_videos, "spin", sorted(os.listdir(os.path.join(synth_videos, "spin")))[1]),
               deep / "v.mp4")
    long_id = os.path.relpath(deep / "v", src)
    assert len(long_id.encode()) > MAX_KEY_BYTES - 13
    result = run_job(str(src), str(tmp_path / "lmdb"), ConvertConfig(size=(32, 40)),
                     JobOptions(workers=1, shards=1, progress=False))
    assert result["status_counts"]["rejected"] == 1 and result["totals"]["videos"] == 2
    with open(tmp_path / "lmdb" / "report.jsonl") as fh:
        (rec,) = [json.loads(line) for line in fh if json.loads(line)["id"] == long_id]
    assert rec["status"] == "rejected" and "too long for an LMDB shard" in rec["reason"]
    assert verify(str(tmp_path / "lmdb"))[0] == []
    kept = run_job(str(src), str(tmp_path / "tf"), ConvertConfig(size=(32, 40), backend="tfrecord"),
                   JobOptions(workers=1, shards=1, progress=False))
    assert kept["totals"]["videos"] == 3 and long_id in open_clips(str(tmp_path / "tf")).video_ids


# -- the GPU check on a machine without one ------------------------------------------------------------------------

def test_the_device_check_without_a_gpu_says_so_and_fails_unless_smoke_is_asked_for(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the device check would run for real")
    got = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "device_check.py"), "--work",
                          str(tmp_path / "w")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert got.returncode == 2
    assert got.stderr.strip() == "device_check: error: no CUDA device here; pass --smoke for the small CPU run"
    assert not (tmp_path / "w").exists()  # nothing built or written


_SLOW_VERIFY = """
import sys, time
import convert.store.verify as v
real = v.verify_shard
def slow(*a, **k):
    time.sleep(60)
    return real(*a, **k)
v.verify_shard = slow
from convert.tools import main
sys.exit(main(["verify", sys.argv[1]]))
"""


@pytest.mark.parametrize("sig, to_group", [(2, True), (15, False)], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_during_verify_is_one_line_and_no_checker_is_left(raw_root, sig, to_group):  # noqa: F811
    """Ctrl-C reaches verify's checkers too (its process group): they ignore it, verify stops them and says so in
    one line, 128 + the signal."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-c", _SLOW_VERIFY, raw_root], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    children = f"/proc/{proc.pid}/task/{proc.pid}/children"
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        with open(children) as fh:
            if fh.read().split():
                break
        time.sleep(0.05)
    time.sleep(0.3)  # the checkers are past their start
    out, err = signal_and_wait(proc, sig, to_group=to_group, timeout=30, what="verify")
    assert err == "verify: interrupted; nothing was changed (run verify again)\n" and out == ""
    assert proc.returncode == 128 + sig
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing of its group is left


def test_a_video_record_without_a_stream_reads_and_is_stored_as_before_and_a_bad_stream_is_refused():
    """``stream`` came later, optional: a record written before it reads, and one without it is the same bytes."""
    from convert.format.records import VideoRecord

    old = {"video_id": "a/x", "path": "/v/a/x.mp4", "label": 1, "status": "ok", "clips": 2, "frames": 40, "reason": ""}
    raw = json.dumps(old, sort_keys=True, separators=(",", ":")).encode()
    rec = VideoRecord.from_bytes(raw, "shard-00000")
    assert rec.stream is None and rec.to_bytes() == raw
    with_stream = VideoRecord.from_dict({**old, "stream": 1}, "shard-00000")
    assert with_stream.stream == 1 and json.loads(with_stream.to_bytes()) == {**old, "stream": 1}
    for bad in ("1", True, 1.0, -1):
        with pytest.raises(FormatError, match=r"^shard-00000: (damaged )?video record 'a/x'"):
            VideoRecord.from_dict({**old, "stream": bad}, "shard-00000")


def test_a_shards_records_parsed_together_equal_each_parsed_alone_and_a_damaged_one_is_named_alike():
    """A shard's records are parsed as one JSON array at open (``VideoRecord.many_from_bytes``): the same records as
    parsing each, and, where one is damaged (values that would join into other valid JSON included), the same one-line
    error as parsing each alone."""
    import dataclasses

    from convert.format import VideoRecord

    records = [VideoRecord(f"v{i}", f"/videos/\u00e9{i}.mp4", i % 3, "ok", i, 2 * i, stream=None if i % 2 else i)
               for i in range(5)]
    raws = [r.to_bytes() for r in records]
    assert VideoRecord.many_from_bytes(raws, "s") == [VideoRecord.from_bytes(r, "s") for r in raws] == records
    assert VideoRecord.many_from_bytes([], "s") == []
    # spelled out: every field, in field order, the stream left out where unknown
    def fields(r):
        return {k: v for k, v in dataclasses.asdict(r).items() if not (k == "stream" and v is None)}
    assert all(r.to_dict() == fields(r) and list(r.to_dict()) == list(fields(r)) for r in records)
    for damaged in ([raws[0][:-1], b"]" + raws[1]],  # together, one valid array of another length
                    [raws[0], raws[1][:-1] + b",", raws[2][1:]],  # together, two objects for three records
                    [raws[0], b"\xff" + raws[1]], [raws[0], b"[1, 2]"], [raws[0], b"{"]):
        with pytest.raises(FormatError) as alone:
            [VideoRecord.from_bytes(r, "s") for r in damaged]
        with pytest.raises(FormatError) as together:
            VideoRecord.many_from_bytes(damaged, "s")
        assert str(together.value) == str(alone.value) and "\n" not in str(together.value)


def test_verify_refuses_a_local_manifest_listing_a_file_no_shard_of_its_backend_has(raw_root, tmp_path):  # noqa: F811
    """A local conversion's reads never use the per-shard file list, but an upload or a cache would copy what it
    names: verify says so, in one line naming the shard and the name."""
    root = copy_conversion(raw_root, str(tmp_path / "c"))
    name = open_clips(root).manifest.shards[0].name

    def list_evil(m):
        files = m["shard_files"][name]
        files.append({**files[0], "name": "evil.txt"})

    _edit_manifest(root, list_evil)
    problems, _ = verify(root)
    assert any("'evil.txt'" in p and name in p for p in problems), problems
