"""Checkpoints that survive a kill at any moment and resume bit-for-bit.

A checkpoint is one ``torch.save`` of plain containers and tensors (so it
loads with ``weights_only=True``): model, optimizer, GradScaler and scheduler
state, the global step and epoch, the sampler's position, every RNG state
(Python, NumPy, torch CPU and CUDA), the class names, what identifies the
training data (``data``: its manifest's clip counts and shard checksums) and
the run's ``TrainConfig`` as a dict (``config``; ``saved_config`` reads it
back). It is written to a temporary file in the same folder, flushed to disk
and renamed, so a reader sees the old checkpoint or the new one, never a
half-written file; a write that fails (a full disk) removes its temporary
file and is one line naming the bytes needed and free (``save_failure``).

Every file ``save_atomic`` writes carries the SHA-256 of its content
(``content_sha256``: every tensor's bytes, dtype and shape and every other
value, in order); ``load`` recomputes it, so a flipped byte, which
``torch.load`` would not notice, is a one-line error, and a file written
before checkpoints had a checksum loads with a note that it was not checked.
``resume_problem`` checks that the contents are a whole trainer checkpoint
(every part there, counters integers, RNG states complete) before a resume
uses any of it.

Files in OUT: ``checkpoint_step<N>.pt`` for the last ``--keep-last`` saves,
``checkpoint.pt`` (the newest of them) and ``checkpoint_best.pt`` (the one
with the best validation video top-1 so far). The last two are hard links to
a step file (a copy where the filesystem has no hard links), so they cost no
space or write time. ``--resume`` takes the newest step file that loads,
passes its checksum and ``resume_problem``, falling back to an older one,
with a one-line note, when the newest does not.

Resuming compares the run's settings with the checkpoint's as each option
declares (``on_resume``, ``convert.format.options.RESUME_RULES``): ``check_settings``
refuses the settings that decide the weights' shapes, and those that decide
the data (with the data itself: ``data``) unless ``--force-resume``;
``changed_settings`` lists the others that changed, which the run prints,
and the number of processes: a run may resume on another number of
processes (elastic resume: ``train.main.elastic_sampler_state`` converts the
epoch's position).
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import IO, Any, cast

import numpy as np
import torch

from convert.format.options import RESUME_DATA, RESUME_SAY, RESUME_SHAPE, flag, on_resume, settings

from .config import TrainConfig
from .errors import MachineError, TrainError
from .runfiles import BEST, LATEST, METRICS, STEP_FILE, step_name, temp_name
from .safeload import load_weights_only

CHECKSUM = "content_sha256"  # the key save_atomic adds: the SHA-256 of everything else in the file


def rng_state() -> dict[str, Any]:
    """All RNG states as tensors and numbers."""
    version, mt, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    np_keys = np.asarray(np_keys)
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(mt, dtype=torch.int64), "gauss": gauss},
        "numpy": {"name": np_name, "keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Undo ``rng_state``: the next random draw of every generator is the one the saver would have made."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    npst = state["numpy"]
    np.random.set_state((npst["name"], npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"],
                         npst["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def latest_path(out: str) -> str:
    return os.path.join(out, LATEST)


def best_path(out: str) -> str:
    return os.path.join(out, BEST)


def step_path(out: str, step: int) -> str:
    return os.path.join(out, step_name(step))


def step_files(out: str) -> list[tuple[int, str]]:
    """(step, path) of every ``checkpoint_step<N>.pt`` in ``out``, oldest first."""
    if not os.path.isdir(out):
        return []
    found = [(int(m.group(1)), os.path.join(out, name)) for name in os.listdir(out)
             if (m := STEP_FILE.match(name))]
    return sorted(found)


def _fsync_dir(folder: str) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def link_atomic(src: str, dst: str) -> str:
    """Make ``dst`` name the same file as ``src`` (a hard link, else a copy), replacing ``dst`` atomically."""
    folder = os.path.dirname(os.path.abspath(dst))
    tmp = os.path.join(folder, temp_name(os.path.basename(dst)))
    try:
        try:
            os.link(src, tmp)
        except OSError:  # a filesystem without hard links
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _fsync_dir(folder)
    return dst


def save_checkpoint(obj: dict[str, Any], out: str, step: int, keep_last: int, *,
                    previous: str | None = None) -> str:
    """Save as ``checkpoint_step<step>.pt``, point ``checkpoint.pt`` at it, keep the newest ``keep_last`` step files.

    ``previous`` is the newest checkpoint this run wrote or resumed from
    (None when there is none yet). A write that fails (a full disk, an I/O
    error) leaves no temporary file and the checkpoints as they were, and is
    a one-line ``MachineError`` naming ``--out``, the bytes the file needs
    and the bytes free, and whether a checkpoint to resume from is there.
    """
    if keep_last < 1:
        raise TrainError(f"--keep-last must be at least 1, got {keep_last}")
    path = step_path(out, step)
    written = False
    try:
        save_atomic(obj, path)
        written = True
        link_atomic(path, latest_path(out))
    except (OSError, RuntimeError) as exc:
        if not _write_failed(exc):
            raise
        # Once the step file is renamed into place it is whole (fsynced, checksummed): it is the one to resume.
        raise save_failure(exc, out, LATEST if written else path,
                           os.path.getsize(path) if written else serialized_size(obj),
                           path if written else previous) from exc
    for _, old in step_files(out)[:-keep_last]:
        os.unlink(old)  # checkpoint_best.pt keeps its own link to the file when it is the best
    return path


def link_best(out: str, step: int) -> str:
    """Point ``checkpoint_best.pt`` at step ``step``'s file; a failed write (a filesystem without hard links,
    where it is a copy, and a full disk) is ``save_checkpoint``'s one-line ``MachineError``."""
    path = step_path(out, step)
    try:
        return link_atomic(path, best_path(out))
    except OSError as exc:
        raise save_failure(exc, out, BEST, os.path.getsize(path), path) from exc


# What a full filesystem raises while a checkpoint is written: OSError ENOSPC (EDQUOT past a quota) from a
# write, or, from torch.save's zip writer, a RuntimeError "[enforce fail at inline_container.cc:...]" (it
# swallows the OSError, which is left as the RuntimeError's context when the file is a Python file object).
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_ZIP_WRITER = ("inline_container.cc", "PytorchStreamWriter")


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, newest first."""
    seen: list[BaseException] = []
    at: BaseException | None = exc
    while at is not None and at not in seen:
        seen.append(at)
        at = at.__cause__ or at.__context__
    return seen


def _write_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed write of a file: an OSError, or torch's zip writer's RuntimeError (not one of
    torch.save's other RuntimeErrors, which are bugs and keep their traceback)."""
    return any(isinstance(e, OSError) or (isinstance(e, RuntimeError) and any(w in str(e) for w in _ZIP_WRITER))
               for e in _chain(exc))


class _ByteCounter:
    """A file-like sink that keeps only how many bytes were written to it."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.size += n
        return n

    def flush(self) -> None:
        pass


def serialized_size(obj: dict[str, Any]) -> int:
    """The exact size in bytes of the file ``save_atomic(obj, ...)`` writes, found by serializing into a byte
    counter (no memory or disk taken: the full-disk message needs it after the disk refused the file)."""
    counter = _ByteCounter()
    content = _on_cpu({k: v for k, v in obj.items() if k != CHECKSUM})
    # Any SHA-256 in hex has the same length, so a stand-in digest gives the same size without hashing.
    torch.save({**content, CHECKSUM: "0" * 64}, cast(IO[bytes], counter))  # torch.save needs write() alone
    return counter.size


def save_failure(exc: BaseException, out: str, name: str, needed: int, previous: str | None) -> MachineError:
    """The one-line error of a checkpoint write that failed (``exc``): a full disk with the bytes ``needed`` and
    those free in ``out``, else the OS's reason; and ``previous``, the newest intact checkpoint, or that no
    checkpoint has been written yet."""
    target = os.path.basename(name)
    try:
        free: int | None = shutil.disk_usage(out).free
    except OSError:
        free = None
    space = any(isinstance(e, OSError) and e.errno in NO_SPACE for e in _chain(exc))
    if space or (free is not None and free < needed):
        room = f"{free:,} are free" if free is not None else "the free space is unknown"
        what = f"no space left to save {target} (it needs {needed:,} bytes, {room})"
    else:
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else first
        what = f"cannot save {target}: {reason}"
    if previous is not None:
        last = f"the last checkpoint, {os.path.basename(previous)}, is intact: free space, then rerun with --resume"
    else:
        last = ("no checkpoint has been written yet: free space, then rerun with --resume (it starts from the "
                "beginning)")
    return MachineError(f"--out {out}: {what}; {last}")


def _candidates(out: str) -> list[str]:
    """The checkpoints of ``out``, newest first: the step files, then ``checkpoint.pt`` unless it is a link to one
    of them (runs saved before step files existed have it alone)."""
    found = [p for _, p in reversed(step_files(out))]
    latest = latest_path(out)
    if os.path.isfile(latest) and not any(os.path.samefile(latest, p) for p in found):
        found.append(latest)
    return found


def newest_complete(out: str, say: Callable[[str], None],
                    check: Callable[[dict[str, Any], str], str | None] | None = None
                    ) -> tuple[str, dict[str, Any]] | None:
    """The newest checkpoint in ``out`` that loads and passes ``check``, as (path, contents); None when there is
    none.

    Step files newest first, then ``checkpoint.pt`` (runs saved before step
    files existed). One that cannot be read, fails its checksum, or of which
    ``check`` returns a problem (``resume_problem`` for ``--resume``: what
    keeps it from being resumed) is skipped with a one-line note. A TrainError
    that ``check`` raises is not about one file (other classes than this
    run's): it stops the search.
    """
    candidates = _candidates(out)
    found = _first_loading(candidates, say, check)
    if found is None and candidates:
        raise TrainError(f"--resume: no checkpoint in {out} can be read (see the notes above); pass --overwrite "
                         f"to start again")
    return found


def _first_loading(candidates: list[str], say: Callable[[str], None],
                   check: Callable[[dict[str, Any], str], str | None] | None = None
                   ) -> tuple[str, dict[str, Any]] | None:
    """The first of ``candidates`` that loads and passes ``check``, as (path, contents), each one skipped said
    in a one-line note; None when none is left."""
    for k, path in enumerate(candidates):
        try:
            ckpt = load(path, say=say)
        except TrainError as exc:
            problem = str(exc)
        else:
            found = None if check is None else check(ckpt, path)
            if found is None:
                return path, ckpt
            problem = f"checkpoint {path} cannot be resumed: {found}"
        left = "trying the previous one" if k + 1 < len(candidates) else "no older checkpoint left"
        say(f"note: {problem}; {left}")
    return None


def newest_in_folder(folder: str, flag: str, say: Callable[[str], None]) -> tuple[str, dict[str, Any]]:
    """(path, contents) of the newest intact checkpoint of a run's folder (its ``--out``), for an option that
    names a checkpoint (``flag``: ``train eval --checkpoint``) given a folder: the step files newest first,
    then ``checkpoint.pt`` of a run saved before step files, then ``checkpoint_best.pt`` when it is a file of
    its own; a damaged one is skipped with a one-line note. A one-line error when the folder holds none, or
    none that loads."""
    candidates = _candidates(folder)
    best = best_path(folder)
    if os.path.isfile(best) and not any(os.path.samefile(best, p) for p in candidates):
        candidates.append(best)
    if not candidates:
        raise TrainError(f"{flag} {folder}: the folder holds no checkpoint (no checkpoint_step<N>.pt, "
                         f"{LATEST} or {BEST}); name a checkpoint file, or the --out of a run that saved one")
    found = _first_loading(candidates, say)
    if found is None:
        raise TrainError(f"{flag} {folder}: none of its {len(candidates)} checkpoint(s) is intact (see the notes "
                         f"above)")
    return found


def _on_cpu(obj: Any) -> Any:
    """``obj`` with every tensor in its dicts, lists and tuples on the CPU (what is hashed and saved, copied from
    a GPU once); other containers are left as they are (``_feed`` and ``torch.save`` copy their tensors)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if type(obj) in (dict, OrderedDict):
        return type(obj)((k, _on_cpu(v)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(_on_cpu(v) for v in obj)
    return obj


def _feed(h: Any, obj: Any) -> None:
    """Add ``obj`` to hash ``h``: its type, its size and its values, so that two contents hash alike only when
    ``torch.load`` gives them back alike (a tensor's dtype, shape and bytes; every key and value in order)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"tensor {t.dtype} {tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(obj, dict):
        h.update(f"dict {len(obj)};".encode())
        for key, value in obj.items():
            _feed(h, key)
            _feed(h, value)
    elif isinstance(obj, (list, tuple)):
        h.update(f"{type(obj).__name__} {len(obj)};".encode())
        for value in obj:
            _feed(h, value)
    elif isinstance(obj, (str, bytes)):
        raw = obj.encode("utf-8", "surrogatepass") if isinstance(obj, str) else obj
        h.update(f"{type(obj).__name__} {len(raw)};".encode())
        h.update(raw)
    elif isinstance(obj, float):
        h.update(f"float {obj.hex()};".encode())
    else:  # None, bool, int, and anything else weights_only loading gives back as it was saved
        h.update(f"{type(obj).__qualname__} {obj!r};".encode())


def content_digest(obj: Any) -> str:
    """The SHA-256 (hex) of a checkpoint's content: every tensor's bytes, dtype and shape and every other value."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def save_atomic(obj: dict[str, Any], path: str) -> str:
    """``torch.save`` to a temporary name beside ``path``, fsync, then rename over it; the file holds ``obj``
    (tensors on the CPU) and its ``content_digest`` under ``content_sha256``, which ``load`` checks."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, temp_name(os.path.basename(path)))
    content = _on_cpu({k: v for k, v in obj.items() if k != CHECKSUM})
    try:
        with open(tmp, "wb") as f:
            torch.save({**content, CHECKSUM: content_digest(content)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _fsync_dir(folder)  # make the rename itself durable
    return path


def describe_run(out: str) -> str:
    """What of a training run ``out`` holds ("" when none): "checkpoints", or its metrics log."""
    if os.path.isfile(latest_path(out)) or step_files(out):
        return "checkpoints"
    metrics = os.path.join(out, METRICS)
    if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:
        return METRICS
    return ""




def _read(path: str) -> Any:
    """``torch.load(path, weights_only=True)`` onto the CPU; every failure one line naming the file."""
    if not os.path.isfile(path):
        raise TrainError(f"checkpoint {path} not found")
    try:
        return load_weights_only(path)
    except ValueError as exc:
        raise TrainError(f"checkpoint {path} {exc}") from exc


def load(path: str, *, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """A checkpoint as saved (without its checksum), tensors on the CPU; one-line error if it is missing,
    unreadable, not a dict or fails its checksum. A file without a checksum (a bare state dict, or saved before
    checkpoints had one) loads, and ``say`` is told that its content was not checked."""
    ckpt = _read(path)
    if not isinstance(ckpt, dict):
        raise TrainError(f"checkpoint {path} holds a {type(ckpt).__name__}, not a checkpoint's dict")
    expected = ckpt.pop(CHECKSUM, None)
    if expected is None:
        if say is not None:
            say(f"note: checkpoint {path} has no checksum (a bare state dict, or saved before checkpoints had "
                f"one): its content is not checked")
    elif expected != content_digest(ckpt):
        raise TrainError(f"checkpoint {path} fails its checksum: its content changed after it was saved (a "
                         f"damaged disk or copy)")
    return ckpt


def load_named(path: str, *, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``load`` for a checkpoint the user named (``--finetune``, ``train eval --checkpoint``): that file or a
    one-line error, which names the newest intact checkpoint beside it when it is damaged (another file is
    not taken in its place: it holds other weights than the ones asked for)."""
    try:
        return load(path, say=say)
    except TrainError as exc:
        if not os.path.isfile(path):
            raise
        folder = os.path.dirname(os.path.abspath(path))
        others = [p for p in _candidates(folder) if not os.path.samefile(p, path)]
        intact = next((p for p in others if _loads(p)), None)
        hint = f"; {intact} beside it is intact" if intact else ""
        raise TrainError(f"{exc}{hint}") from exc


def _loads(path: str) -> bool:
    """Whether ``path`` loads and passes its checksum."""
    try:
        load(path)
    except TrainError:
        return False
    return True


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{text[:40]}... ({type(value).__name__})" if len(text) > 40 else f"{text} ({type(value).__name__})"


def _rng_problem(entry: Any) -> str | None:
    """What keeps ``entry`` from being one process's ``rng_state()``, or None."""
    if not isinstance(entry, dict):
        return f"is {_shown(entry)}, not a dict of RNG states"
    py, npst, cpu = entry.get("python"), entry.get("numpy"), entry.get("torch")
    if not (isinstance(py, dict) and _integer(py.get("version")) and isinstance(py.get("state"), torch.Tensor)
            and py["state"].numel() == 625 and isinstance(py.get("gauss"), (float, type(None)))):
        return "has no complete Python RNG state"
    if not (isinstance(npst, dict) and isinstance(npst.get("name"), str) and isinstance(npst.get("keys"), torch.Tensor)
            and npst["keys"].numel() == 624 and _integer(npst.get("pos")) and _integer(npst.get("has_gauss"))
            and isinstance(npst.get("gauss"), float)):
        return "has no complete NumPy RNG state"
    if not (isinstance(cpu, torch.Tensor) and cpu.dtype == torch.uint8):
        return "has no torch RNG state"
    if "cuda" in entry and not (isinstance(entry["cuda"], (list, tuple))
                                and all(isinstance(t, torch.Tensor) for t in entry["cuda"])):
        return "has a CUDA RNG state that is not a list of tensors"
    return None


def resume_problem(ckpt: Mapping[str, Any]) -> str | None:
    """What keeps checkpoint contents ``ckpt`` from being resumed ("'sampler' is missing"), or None.

    The parts a resume loads must all be there with their types: the state
    dicts, the integer counters, the sampler's position and one complete RNG
    state per process. The config is read (and refused in its own words) by
    ``saved_config``.
    """
    for key in ("model", "optimizer", "scaler", "scheduler", "step", "epoch", "epoch_step", "sampler", "rng"):
        if key not in ckpt:
            return f"'{key}' is missing"
    model = ckpt["model"]
    if not isinstance(model, dict) or not model or not all(isinstance(v, torch.Tensor) for v in model.values()):
        return "'model' is not a state dict of tensors"
    for key in ("optimizer", "scaler", "scheduler"):
        if not isinstance(ckpt[key], dict):
            return f"'{key}' is {_shown(ckpt[key])}, not a state dict"
    opt = ckpt["optimizer"]
    if not isinstance(opt.get("state"), dict) or not isinstance(opt.get("param_groups"), list):
        return "'optimizer' has no 'state' and 'param_groups'"
    for key in ("step", "epoch", "epoch_step", "nonfinite"):
        if (key in ckpt or key != "nonfinite") and not _integer(ckpt[key]):
            return f"'{key}' is {_shown(ckpt[key])}, not an integer >= 0"
    sampler = ckpt["sampler"]
    if not isinstance(sampler, dict) or not all(_integer(sampler.get(k)) for k in ("epoch", "position")):
        return f"'sampler' is {_shown(sampler)}, not a sampler state with an epoch and a position"
    rng = ckpt["rng"]
    if not isinstance(rng, list) or not rng:
        return f"'rng' is {_shown(rng)}, not a list of every process's RNG states"
    world = ckpt["config"].get("world_size") if isinstance(ckpt.get("config"), dict) else None
    if _integer(world) and len(rng) != world:
        return f"'rng' holds {len(rng)} RNG state(s) for a run of {world} process(es)"
    for rank, entry in enumerate(rng):
        problem = _rng_problem(entry)
        if problem is not None:
            return f"'rng' of process {rank} {problem}"
    best = ckpt.get("best")
    if best is not None and not (isinstance(best, dict) and _integer(best.get("since"))
                                 and isinstance(best.get("best"), (float, int, type(None)))
                                 and (best.get("best_step") is None or _integer(best.get("best_step")))):
        return f"'best' is {_shown(best)}, not the best-checkpoint tracker's state"
    classes = ckpt.get("classes")
    if classes is not None and not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
        return f"'classes' is {_shown(classes)}, not a list of names"
    return None


def model_state(ckpt: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model weights of a trainer checkpoint, or the file itself if it is a bare state dict."""
    state = ckpt.get("model", ckpt)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TrainError("checkpoint holds no model state dict")
    return state


CLASSES_HINT = ("convert every split with one class list: python -m convert SRC OUT --classes FILE "
                "(one class name per line)")
# Settings that decide the shapes of the model's weights or of the optimizer's state (a checkpoint saved with
# other values cannot be loaded into this run), and those that decide which clips an epoch holds in which
# order (the saved position means nothing in another order): declared with the options (on_resume).
SHAPE_SETTINGS = on_resume(TrainConfig, RESUME_SHAPE)
ORDER_SETTINGS = on_resume(TrainConfig, RESUME_DATA)


def check_classes(ckpt: dict[str, Any], classes: list[str], path: str) -> None:
    """A resumed run must train on the classes the checkpoint was trained on, in the same order (one that holds
    no list of names is not compared: ``resume_problem`` names that)."""
    saved = ckpt.get("classes")
    if not isinstance(saved, list) or not all(isinstance(c, str) for c in saved):
        return
    if len(saved) != len(classes):
        raise TrainError(f"checkpoint {path} was trained on {len(saved)} classes, --data has {len(classes)} "
                         f"(use --finetune to start a new classifier, or {CLASSES_HINT})")
    if list(saved) != list(classes):
        raise TrainError(f"checkpoint {path} has the same number of classes as --data but other names or order "
                         f"({CLASSES_HINT})")


def saved_config(ckpt: dict[str, Any], path: str) -> TrainConfig:
    """The ``TrainConfig`` a trainer checkpoint was saved with; one-line error when it holds none."""
    raw = ckpt.get("config")
    if raw is None:
        if isinstance(ckpt.get("args"), dict):
            raise TrainError(f"checkpoint {path} comes from an older python -m train (its settings are saved as "
                             f"'args', without a 'config'): continue it with the trainer that wrote it, or start a "
                             f"new run from its weights with --finetune {path}")
        raise TrainError(f"checkpoint {path} holds no training config (not written by python -m train)")
    try:
        return TrainConfig.from_dict(raw)
    except TrainError as exc:
        raise TrainError(f"checkpoint {path}: {exc}") from exc


def describe_data(identity: Mapping[str, Any]) -> str:
    """A data identity (``train.data.data_identity``) in words: "40 clips of 20 videos in 1 shard(s), ..."."""
    return (f"{identity.get('clips')} clips of {identity.get('videos')} videos in {identity.get('shards')} "
            f"shard(s), shards' sha256 {str(identity.get('sha256'))[:12]}")


def check_settings(ckpt: dict[str, Any], cfg: TrainConfig, path: str, *,
                   data: Mapping[str, Any] | None = None) -> TrainConfig:
    """The checkpoint's config, when ``cfg`` may resume it; otherwise a one-line error naming what differs.

    Refused: every setting that decides a shape (no override: the weights
    would not fit); unless ``--force-resume``, every setting that decides the
    epoch's clips and order, and training data (``data``, this run's
    ``train.data.data_identity``) other than the checkpoint's ``data``. A
    checkpoint written before it recorded its data is not compared (``data``
    absent).
    """
    saved = saved_config(ckpt, path)

    def differ(names: tuple[str, ...]) -> list[str]:
        return [f"{flag(k)} {getattr(saved, k)} (this run: {getattr(cfg, k)})" for k in names
                if getattr(saved, k) != getattr(cfg, k)]

    shapes = differ(SHAPE_SETTINGS)
    if shapes:
        raise TrainError(f"checkpoint {path} was saved with " + ", ".join(shapes)
                         + ": pass the checkpoint's values to resume, or another --out to start a new run")
    if cfg.force_resume:
        return saved
    problems = []
    orders = differ(ORDER_SETTINGS)
    if orders:
        problems.append("was saved with " + ", ".join(orders) + ", which decide the clips of an epoch and their "
                        "order (where its position points)")
    before = ckpt.get("data")
    if data is not None and isinstance(before, Mapping) and dict(before) != dict(data):
        problems.append(f"was trained on other data than --data {cfg.data} ({describe_data(before)}; --data: "
                        f"{describe_data(data)})")
    if problems:
        raise TrainError(f"checkpoint {path} " + "; it ".join(problems) + ": pass the checkpoint's values and "
                         "data, --force-resume to go on anyway, or another --out to start a new run")
    return saved


def changed_settings(saved: TrainConfig, cfg: TrainConfig) -> list[str]:
    """``"--lr 0.001 -> 0.002"`` for each setting a resume prints when it changed since the checkpoint (declared
    ``on_resume`` SAY, and the data-deciding ones ``--force-resume`` let through), in declaration order."""
    shown = set(on_resume(TrainConfig, RESUME_SAY)) | set(ORDER_SETTINGS)
    changed = [f"{flag(name)} {getattr(saved, name)} -> {getattr(cfg, name)}" for name in settings(TrainConfig)
               if name in shown and getattr(saved, name) != getattr(cfg, name)]
    if saved.world_size != cfg.world_size:  # derived, not an option; allowed (elastic resume), and said
        changed.append(f"processes {saved.world_size} -> {cfg.world_size}")
    return changed
