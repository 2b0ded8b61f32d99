"""The shard verifier: reopen every shard of a conversion and check it against the manifest.

``verify(OUT)`` is ``python -m convert verify OUT``: it works for every
backend through its reader, and checks each shard in a child process
(several at once), so a page damaged so badly that touching it raises SIGBUS
kills that child, which is reported as "corrupted", never the check. It
decodes every payload, so a bitstream that crashes FFmpeg kills a child too:
the child says which clip it is decoding in memory the parent reads, and the
line names that clip; a decode that stops making progress
(``DECODE_TIMEOUT``) is stopped and named the same way.
``verify_store`` is the same check from the reading side: it raises a
one-line ``FormatError`` at the first problem, so a training job stops with
the file and the reason.
"""

from __future__ import annotations

import gc
import mmap
import multiprocessing
import multiprocessing.connection
import os
import signal
import struct
import time
from collections.abc import Callable, Iterator, Sequence

from convert.format.backends import get_backend
from convert.format.base import CONTENT_KEY, file_sha256, summarize_clips
from convert.format.codecs import codec_for_id
from convert.format.errors import FormatError, ShardMissing
from convert.format.layout import ClipHeader, check_crc
from convert.format.manifest import (
    CONTENT_BITS,
    Manifest,
    ShardEntry,
    check_plan,
    check_shard_meta,
    content_fingerprint,
    read_manifest,
    recorded_content_sums,
)
from convert.format.system import cpu_count
from convert.signals import STOP_SIGNALS, stop_signals_blocked, unblock_stop_signals

# A checker decoding one clip for longer than this, in seconds, is taken to hang (a decoder looping on hostile
# input): it is stopped and the clip reported. Generous on purpose: a clip decodes in a tiny fraction of it on
# any machine that runs at all, and a stop here is recorded against the shard.
DECODE_TIMEOUT = 60.0


class Progress:
    """Where a checker process is, in memory shared with the parent that started it: the clip it is decoding.

    The checker calls ``decoding(where)`` before it hands a payload to a
    decoder and ``done()`` after; the parent reads ``state()`` (decodes
    started, and whether one is running) while the checker runs, and
    ``where()`` only once the checker is dead, so the two never race on the
    name. A few hundred nanoseconds a clip: no system call, no pickling.
    """

    _STATE = struct.Struct("<QQI")  # decodes started, decoding now (0 or 1), the name's length in bytes
    _SIZE = 1 << 14  # a shard's path (PATH_MAX) and a clip's key fit; a longer name is cut

    def __init__(self) -> None:
        # Anonymous and shared (MAP_SHARED is mmap's default): a forked checker writes the parent's pages.
        self._mem = mmap.mmap(-1, self._SIZE)

    def decoding(self, where: str) -> None:
        """The checker is about to decode the clip ``where`` names."""
        name = where.encode("utf-8", errors="replace")[:self._SIZE - self._STATE.size]
        self._mem[self._STATE.size:self._STATE.size + len(name)] = name
        started = self._STATE.unpack_from(self._mem, 0)[0]
        self._STATE.pack_into(self._mem, 0, started + 1, 1, len(name))

    def done(self) -> None:
        """The decode ``decoding`` announced returned (with clips or an error)."""
        started, _, length = self._STATE.unpack_from(self._mem, 0)
        self._STATE.pack_into(self._mem, 0, started, 0, length)

    def state(self) -> tuple[int, bool]:
        """(decodes started, one running now)."""
        started, running, _ = self._STATE.unpack_from(self._mem, 0)
        return started, bool(running)

    def where(self) -> str:
        """The clip of the last decode started."""
        length = self._STATE.unpack_from(self._mem, 0)[2]
        return self._mem[self._STATE.size:self._STATE.size + length].decode("utf-8", errors="replace")

    def close(self) -> None:
        self._mem.close()


def verify_shard(path: str, index: int, manifest: Manifest, *, decode: bool = True,
                 progress: Progress | None = None) -> list[str]:
    """Every problem found in shard ``index`` of ``manifest``, as one-line messages naming the shard.

    ``decode=False`` checks everything but the payloads' decoding (CRC-32s,
    headers, counts, metadata, the checksum): what a reader checks before
    training. Records and headers are checked as the readers check them
    (labels among the classes, each clip's label its video's), so a shard
    that passes is one every reader reads. ``progress``: where the clip being
    decoded is announced (``isolated`` passes its checker's).
    """
    meta = manifest.shards[index]
    name = meta.name
    try:
        reader = get_backend(manifest.data.backend).reader(path)
    except ShardMissing as exc:
        return [f"{name}: missing: {exc}"]
    except FormatError as exc:
        return [f"{name}: cannot open: {exc}"]
    problems: list[str] = []
    try:
        check_shard_meta(reader.meta, manifest, index, name)
    except FormatError as exc:
        problems.append(str(exc))
    try:  # a file list naming files no shard of the backend has: what a cache or an upload would copy
        get_backend(manifest.data.backend).files.check_listed(meta, "manifest.json")
    except FormatError as exc:
        problems.append(str(exc))
    n_classes = manifest.num_classes
    spec = manifest.data
    clips = value_bytes = 0
    try:
        problems += reader.check_storage()
        records = reader.records()
        label_of = {}
        for rec in records:
            label_of[rec.video_id] = rec.label
            if not 0 <= rec.label < n_classes:
                problems.append(f"{name}: video record {rec.video_id!r}: label {rec.label} outside the "
                                f"{n_classes} classes")

        def checked() -> Iterator[tuple[bytes | memoryview, memoryview]]:
            """Every clip, checked as it goes by (problems noted), for the checksum and content sum's one pass."""
            nonlocal clips, value_bytes
            for header_bytes, header, payload in reader.iter_clips():
                clips += 1
                value_bytes += header.value_len
                where = reader.where(header.video_id, header.clip_index)
                try:
                    # The shape first: a payload is decoded only into a clip the conversion can hold.
                    problem = spec.shape_problem(header.shape)
                    if problem is not None:
                        raise FormatError(problem)
                    check_crc(payload, header)
                    if decode:
                        _decode(header, payload, where, progress)
                    if not 0 <= header.label < n_classes:
                        raise FormatError(f"label {header.label} outside the {n_classes} classes")
                    if header.label != label_of.get(header.video_id, header.label):
                        raise FormatError(f"label {header.label}, its video record says "
                                          f"{label_of[header.video_id]}")
                except FormatError as exc:
                    problems.append(f"{where}: {exc}")  # where names the shard (its path) and the clip
                yield header_bytes, payload

        sha, content = summarize_clips(checked())
    except FormatError as exc:
        problems.append(f"{name}: {exc}")
        return problems
    finally:
        reader.close()
    if clips != meta.clips:
        problems.append(f"{name}: holds {clips} clips, manifest says {meta.clips}")
    if len(records) != meta.videos:
        problems.append(f"{name}: holds {len(records)} video records, manifest says {meta.videos}")
    if value_bytes != meta.value_bytes:
        problems.append(f"{name}: holds {value_bytes} value bytes, manifest says {meta.value_bytes}")
    if sha != meta.sha256:
        problems.append(f"{name}: checksum {sha[:16]}... differs from manifest {meta.sha256[:16]}...")
    recorded = meta.extras.get(CONTENT_KEY)
    if recorded is not None and content != recorded:
        problems.append(f"{name}: content sum {content[:16]}... differs from manifest "
                        f"{str(recorded)[:16]}...: its clips are not the bytes the conversion wrote")
    return problems + file_problems(path, meta)


def _decode(header: ClipHeader, payload: memoryview, where: str, progress: Progress | None) -> None:
    """Decode one clip's payload; whatever the decoder says of it is a FormatError in one line."""
    if progress is not None:
        progress.decoding(where)
    try:
        codec_for_id(header.codec_id).decode(payload, header.shape)
    except (FormatError, OSError, MemoryError):
        raise  # the payload's, said already; or the machine's, never a clip's (its shape is checked first)
    except Exception as exc:  # noqa: BLE001 - any other decoder error on a stored payload is that payload's
        # problem (a library's own exception type): reported as the clip's, never a traceback.
        raise FormatError(f"payload does not decode: {type(exc).__name__}: {exc}") from None
    finally:
        if progress is not None:
            progress.done()


def file_problems(folder: str, entry: ShardEntry) -> list[str]:
    """The files the manifest lists for shard ``entry`` (format version 3) that ``folder`` lacks or holds with
    another size or checksum, one line each (nothing to check in a version 2 manifest)."""
    problems = []
    for f in entry.shard_files or ():
        path = os.path.join(folder, f.name)
        try:
            size = os.path.getsize(path)
            if size != f.bytes:
                problems.append(f"{entry.name}: file {f.name} is {size} bytes, manifest says {f.bytes}")
            elif (sha := file_sha256(path)) != f.sha256:
                problems.append(f"{entry.name}: file {f.name}: checksum {sha[:16]}... differs from manifest "
                                f"{f.sha256[:16]}...")
        except FileNotFoundError:
            problems.append(f"{entry.name}: file {f.name} is missing (the manifest lists it)")
        except OSError as exc:
            problems.append(f"{entry.name}: file {f.name} cannot be read: {exc.strerror}")
    return problems


# A check run by ``isolated``: given its checker's ``Progress`` (None when it runs in this process), it returns
# its problems.
Check = Callable[[Progress | None], list[str]]


def _child(conn: multiprocessing.connection.Connection, fn: Check, progress: Progress) -> None:
    # A stop signal (Ctrl-C reaches the whole process group) is the parent's to handle: it stops the checkers
    # itself. The signals were blocked while this child started (``isolated``), so none came before this line.
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    unblock_stop_signals()
    try:
        conn.send(fn(progress))
    finally:
        conn.close()


# A checker ended by these was killed from outside (the kernel's out-of-memory killer, a user): a problem of the
# machine, never recorded as a property of the shard.
_KILLED_FROM_OUTSIDE = (signal.SIGKILL, *STOP_SIGNALS)


class _Checker:
    """One running checker as ``isolated`` watches it: its process, its answer's pipe, its progress."""

    def __init__(self, name: str, proc: multiprocessing.process.BaseProcess,
                 recv: multiprocessing.connection.Connection, progress: Progress) -> None:
        self.name, self.proc, self.recv, self.progress = name, proc, recv, progress
        self.seen, self.since = progress.state()[0], time.monotonic()

    def hung(self, now: float) -> bool:
        """Still inside the decode it was in at least ``DECODE_TIMEOUT`` seconds ago."""
        started, running = self.progress.state()
        if started != self.seen or not running:
            self.seen, self.since = started, now
            return False
        return now - self.since >= DECODE_TIMEOUT

    def died(self) -> list[str]:
        """The problem line of a checker that died before answering (OSError: killed from outside)."""
        self.proc.join()
        code = self.proc.exitcode
        if code is not None and code < 0 and -code in _KILLED_FROM_OUTSIDE:
            raise OSError(f"{self.name}: the checker was killed by {signal.Signals(-code).name} (out of "
                          f"memory, or stopped from outside): not a problem of the shard; run verify again") from None
        how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit status {code}"
        if self.progress.state()[1]:  # in a decoder: the clip it was given is the one that crashed it
            return [f"{self.progress.where()}: corrupted: decoding it crashed the checker ({how}); the clips after "
                    f"it in {self.name} were not checked; the shard must be converted again"]
        return [f"{self.name}: corrupted: reading it crashed the checker ({how}); the shard must be "
                f"converted again"]

    def stopped(self) -> list[str]:
        """Stop a hung checker; its problem line."""
        self.proc.kill()
        self.proc.join()
        return [f"{self.progress.where()}: corrupted: decoding hung (no answer in {DECODE_TIMEOUT:g} s), so the "
                f"checker was stopped; the clips after it in {self.name} were not checked; the shard must be "
                f"converted again"]

    def close(self) -> None:
        self.recv.close()
        self.progress.close()


def isolated(tasks: list[tuple[str, Check]], workers: int) -> list[str]:
    """Run ``(name, check)`` tasks in forked children, ``workers`` at a time; a crash or a hung decode is a problem
    line (naming the clip being decoded, when there is one), in the order of ``tasks`` whatever the timing."""
    if not hasattr(os, "fork") or workers < 1:
        return [line for _, fn in tasks for line in fn(None)]
    ctx = multiprocessing.get_context("fork")
    # A child inherits this process's uncollected garbage; collecting it here
    # keeps objects with threads (a dropped DALI pipeline) from being
    # finalised in a child where their threads do not exist.
    gc.collect()
    results: dict[int, list[str]] = {}
    running: dict[int, _Checker] = {}
    pending = list(enumerate(tasks))
    try:
        while pending or running:
            while pending and len(running) < workers:
                k, (name, fn) = pending.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                progress = Progress()
                proc = ctx.Process(target=_child, args=(send, fn, progress), daemon=True)
                with stop_signals_blocked():
                    proc.start()
                send.close()
                running[k] = _Checker(name, proc, recv, progress)
            # Woken a few times per timeout to look for a hung decode; an answer or a death wakes it at once.
            ready = multiprocessing.connection.wait([c.recv for c in running.values()],
                                                    timeout=min(1.0, DECODE_TIMEOUT / 4))
            now = time.monotonic()
            for k, checker in list(running.items()):
                if checker.recv in ready:
                    try:
                        results[k] = checker.recv.recv()
                    except EOFError:  # the child died before answering
                        results[k] = checker.died()
                    checker.proc.join()
                elif checker.hung(now):
                    results[k] = checker.stopped()
                else:
                    continue
                del running[k]
                checker.close()
    finally:
        for checker in running.values():  # stopped, or failed: no checker outlives the check
            checker.proc.kill()
            checker.proc.join()
            checker.close()
    return [line for k in sorted(results) for line in results[k]]


def verify(out: str, *, decode: bool = True, workers: int | None = None,
           fingerprint: str | None = None) -> tuple[list[str], dict]:
    """All problems in a conversion folder (empty when it is sound), and the counts checked (a URL:
    ``convert.store.cache.verify.verify_url``); ``fingerprint``: a trusted copy's content fingerprint, which this
    one's must equal (``fingerprint_problem``)."""
    try:
        manifest = read_manifest(out)
    except FormatError as exc:
        return [str(exc)], {}
    problems: list[str] = []
    try:
        check_plan(out, manifest, digest=True)
    except FormatError as exc:
        problems.append(str(exc))
    tasks = [(meta.name, shard_check(manifest.shard_path(out, i), i, manifest, decode))
             for i, meta in enumerate(manifest.shards)]
    problems += isolated(tasks, cpu_count() if workers is None else workers)
    problems += totals_problems(manifest, "manifest", fingerprint)
    return problems, checked_counts(manifest)


def fingerprint_problem(manifest: Manifest, where: str, expected: str) -> str | None:
    """Why the conversion's content fingerprint is not ``expected`` (a trusted copy's, as ``inspect`` prints it),
    in one line naming ``where``; None when it is.

    Only as strong as the rest of ``verify``: the shards' content sums are
    recomputed from every stored byte and the fingerprint followed from them,
    so with no other problem the fingerprint says what the bytes are, and
    comparing it with one obtained from elsewhere catches a copy rewritten
    whole, manifest included (FORMAT.md, *Content fingerprint*).
    """
    if manifest.fingerprint is None:
        return f"{where}: records no fingerprint (written before fingerprints were), so none to compare with"
    if recorded_content_sums(manifest.shards)[1] != CONTENT_BITS:
        return (f"{where}: its content sums predate the ones over every stored byte, so its fingerprint proves "
                f"nothing of the payloads; reconvert the videos to compare fingerprints")
    if manifest.fingerprint != expected:
        return (f"{where}: fingerprint {manifest.fingerprint[:16]}... is not the expected {expected[:16]}...: its "
                f"clips, labels or data settings differ from the copy that fingerprint came from")
    return None


def totals_problems(manifest: Manifest, where: str, expected: str | None = None) -> list[str]:
    """The manifest's totals that its shards' counts do not add up to, a content fingerprint that does not
    follow from its shards' content sums, and one that is not ``expected`` when given (``where`` names the
    manifest)."""
    problems = [f"{where}: shard {key} counts do not add up to totals.{key}"
                for key in ("clips", "videos", "value_bytes")
                if sum(getattr(m, key) for m in manifest.shards) != getattr(manifest.totals, key)]
    if manifest.fingerprint is not None:
        # A conversion written before the content sums covered payloads: its fingerprint is followed from its
        # own (legacy) sums, which ``verify_shard`` does not recompute.
        contents, bits = recorded_content_sums(manifest.shards)
        sums = [c for c in contents if isinstance(c, str)]
        if len(sums) != len(contents) or content_fingerprint(manifest.data, sums, bits=bits) != manifest.fingerprint:
            problems.append(f"{where}: fingerprint {manifest.fingerprint[:16]}... does not follow from its shards' "
                            f"content sums")
    if expected is not None and (problem := fingerprint_problem(manifest, where, expected)) is not None:
        problems.append(problem)
    return problems


def checked_counts(manifest: Manifest) -> dict:
    """What ``verify`` reports it checked: shards, clips and videos."""
    return {"shards": len(manifest.shards), "clips": manifest.totals.clips, "videos": manifest.totals.videos}


def shard_check(path: str, index: int, manifest: Manifest, decode: bool) -> Check:
    """``verify_shard`` of shard ``index`` at ``path``, as a task of ``isolated``."""
    return lambda progress: verify_shard(path, index, manifest, decode=decode, progress=progress)


def verify_store(shard_paths: Sequence[str], manifest: Manifest) -> dict:
    """Recompute each payload's CRC-32 and each shard's checksum; compare with headers and the manifest.

    ``shard_paths``: where a reader has each of the manifest's shards (a
    ``ClipStore``'s ``shard_paths``). Reads every byte of every shard; raises
    a one-line FormatError at the first problem. Returns the counts checked.
    """
    clips = 0
    for index, (path, meta) in enumerate(zip(shard_paths, manifest.shards)):
        problems = verify_shard(path, index, manifest, decode=False)
        if problems:
            raise FormatError(f"{path}: checksum mismatch: {problems[0]}")
        clips += meta.clips
    return {"shards": len(shard_paths), "clips": clips}


__all__ = ["DECODE_TIMEOUT", "Check", "Progress", "checked_counts", "file_problems", "fingerprint_problem", "isolated",
           "shard_check",
           "totals_problems", "verify", "verify_shard", "verify_store"]
