"""A full disk while a checkpoint is saved: one line naming --out, the bytes needed and free, and whether a
checkpoint to resume from is there (status 1, a failure of the machine); the previous checkpoint stays whole,
no temporary file is left, and --resume ends where an unbroken run ends. And the other message that names the
last checkpoint as intact (a store that stops answering) says so only when one was written.

The folder is a real tmpfs of a few MB where the tests may mount one (root); elsewhere ``torch.save`` is
replaced by one that fails as torch's zip writer fails on a full disk (a RuntimeError of inline_container.cc
raised while handling OSError ENOSPC).
"""

from __future__ import annotations

import errno
import io
import os
import re
import shutil
import subprocess

import pytest
import torch

from convert.store.remote import RemoteError
from train import checkpoint as ckpt_io
from train.errors import MachineError, TrainError
from train.main import main, run_argv
from train.readerrors import reading

from .train_fixtures import assert_states_equal, common, final_state, tiny_data  # noqa: F401

# 40 clips, batch 8: 5 steps per epoch; a checkpoint every step, only the newest kept.
ARGS = ["--batch-size", "8", "--optimizer", "adamw", "--lr", "1e-3", "--ckpt-every", "1", "--epochs", "1",
        "--max-steps", "3", "--keep-last", "1"]
# What torch.save's zip writer raises when a write of the file fails (torch 2.x).
ZIP_WRITER_ERROR = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"


def _no_space() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _zip_writer_failure() -> RuntimeError:
    """torch.save's error on a full disk: its zip writer's RuntimeError, raised while handling the ENOSPC."""
    try:
        raise _no_space()
    except OSError:
        try:
            raise RuntimeError(ZIP_WRITER_ERROR)  # noqa: B904 - torch's own has the OSError as context only
        except RuntimeError as exc:
            return exc


class SmallDisk:
    """A folder of ``limit`` bytes: a tmpfs of that size (``mounted``), or, where mounting is refused, a folder
    whose ``torch.save`` into files fails as on a full disk once the folder's files would pass ``limit``."""

    def __init__(self, root, monkeypatch) -> None:
        self.dir = str(root / "small")
        os.makedirs(self.dir)
        self.mounted = False
        self._limit: int | None = None
        self._monkeypatch = monkeypatch

    def limit(self, size: int) -> None:
        """Make the folder hold ``size`` bytes (rounded up to 4 KiB pages)."""
        pages = -(-size // 4096)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={pages * 4}k", "tmpfs", self.dir],
                              capture_output=True, text=True) if shutil.which("mount") else None
        if done is not None and done.returncode == 0:
            self.mounted = True
            return
        # Not root, or in a container that may not mount (EPERM): torch.save fails as it does on a full disk.
        self._limit = pages * 4096
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if not hasattr(f, "fileno") or self._limit is None:
                return real_save(obj, f, *args, **kwargs)  # a path, or the byte counter of the failure message
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            room = self._limit - self._used()
            if buf.tell() <= room:
                f.write(buf.getvalue())
                return None
            f.write(buf.getvalue()[:max(room, 0)])
            raise _zip_writer_failure()

        self._monkeypatch.setattr(torch, "save", save)

    def _used(self) -> int:
        seen, used = set(), 0
        for name in os.listdir(self.dir):
            st = os.stat(os.path.join(self.dir, name))
            if st.st_ino not in seen:  # checkpoint.pt is a hard link to a step file: counted once
                seen.add(st.st_ino)
                used += st.st_size
        return used

    def grow(self) -> None:
        """Room for everything: the user freed space."""
        if self.mounted:
            subprocess.run(["mount", "-o", "remount,size=256m", self.dir], check=True)
        self._limit = None

    def close(self) -> None:
        if self.mounted:
            done = subprocess.run(["umount", self.dir], capture_output=True)
            if done.returncode != 0:  # a file still open: detach now, freed when it is closed
                subprocess.run(["umount", "-l", self.dir], check=True)


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    disk = SmallDisk(tmp_path, monkeypatch)
    yield disk
    disk.close()


@pytest.fixture
def reference(tiny_data, tmp_path):  # noqa: F811
    """An unbroken run of ARGS: (its final model, the size of its checkpoint file)."""
    out = tmp_path / "reference"
    run_argv(common(tiny_data, out) + ARGS)
    return final_state(out)["model"], os.path.getsize(ckpt_io.step_path(str(out), 3))


def _error_line(capsys) -> str:
    """stderr's last line, after asserting it is the trainer's one error line and there is no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("train: error: "), err
    return last[len("train: error: "):]


def _temporaries(folder: str) -> list[str]:
    return [name for name in os.listdir(folder) if ".tmp." in name]


def _full_disk_run(tiny_data: str, small_disk, capsys, limit: int, step: int) -> tuple[str, str, int, int]:
    """Train into ``small_disk`` limited to ``limit`` bytes: the run fails (exit 1) saving step ``step``; (out,
    the error line, the bytes it says the checkpoint needs, the bytes it says are free)."""
    small_disk.limit(limit)
    out = os.path.join(small_disk.dir, "run")
    capsys.readouterr()
    assert main(common(tiny_data, out) + ARGS) == 1
    err = _error_line(capsys)
    assert err.startswith(f"--out {out}: no space left to save checkpoint_step{step:09d}.pt"), err
    needed, free = _numbers(err, r"it needs ([\d,]+) bytes, ([\d,]+) are free")
    return out, err, needed, free


def _numbers(text: str, pattern: str) -> tuple[int, int]:
    m = re.search(pattern, text)
    assert m, text
    return int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))


def test_a_full_disk_at_the_second_save_is_one_line_and_resume_is_exact(tiny_data, reference, small_disk,  # noqa: F811
                                                                         capsys):
    model, size = reference
    # One checkpoint and the metrics fit, a second one does not.
    out, err, needed, free = _full_disk_run(tiny_data, small_disk, capsys, size + size // 2, 2)
    assert needed == ckpt_io.serialized_size(ckpt_io.load(ckpt_io.step_path(out, 1)))  # the same size at step 2
    assert free == shutil.disk_usage(out).free
    if small_disk.mounted:
        assert free < needed
    assert err.endswith("; the last checkpoint, checkpoint_step000000001.pt, is intact: free space, then rerun "
                        "with --resume"), err
    assert _temporaries(out) == []  # the failed save's file is gone
    assert ckpt_io.load(ckpt_io.latest_path(out))["step"] == 1  # whole: it loads and passes its checksum

    small_disk.grow()
    assert main(common(tiny_data, out) + ARGS + ["--resume"]) == 0
    assert_states_equal(model, final_state(out)["model"])


def test_a_full_disk_at_the_first_save_says_no_checkpoint_was_written(tiny_data, reference, small_disk,  # noqa: F811
                                                                      capsys):
    model, size = reference
    out, err, needed, free = _full_disk_run(tiny_data, small_disk, capsys, size // 2, 1)
    assert abs(needed - size) < 64 and free == shutil.disk_usage(out).free
    assert "intact" not in err and "; no checkpoint has been written yet: free space, then rerun with --resume" in err
    assert _temporaries(out) == [] and ckpt_io.step_files(out) == []

    small_disk.grow()
    assert main(common(tiny_data, out) + ARGS + ["--resume"]) == 0  # from the beginning
    assert_states_equal(model, final_state(out)["model"])


@pytest.mark.parametrize("failure", [_zip_writer_failure, _no_space], ids=["zip-writer", "oserror"])
def test_save_checkpoint_turns_both_full_disk_errors_into_one_line(tmp_path, monkeypatch, failure):
    """torch.save's RuntimeError and a plain ENOSPC alike: a MachineError naming the previous checkpoint (or that
    there is none), the temporary file removed, the previous checkpoint left as it was."""
    out = str(tmp_path)
    obj = {"model": {"w": torch.arange(1000.0)}, "step": 1}
    first = ckpt_io.save_checkpoint(obj, out, 1, keep_last=1)
    before = open(first, "rb").read()
    real_save = torch.save

    def failing(o, f, *args, **kwargs):
        if not hasattr(f, "fileno"):
            return real_save(o, f, *args, **kwargs)
        f.write(b"PK\x03\x04 half a zip")
        raise failure()

    monkeypatch.setattr(torch, "save", failing)
    for previous, tail in ((first, "the last checkpoint, checkpoint_step000000001.pt, is intact"),
                           (None, "no checkpoint has been written yet")):
        with pytest.raises(MachineError) as caught:
            ckpt_io.save_checkpoint({**obj, "step": 2}, out, 2, keep_last=1, previous=previous)
        text = str(caught.value)
        assert "\n" not in text and caught.value.status == 1
        assert text.startswith(f"--out {out}: no space left to save checkpoint_step000000002.pt (it needs "
                               f"{len(_saved_bytes(real_save, obj)):,} bytes, ") and tail in text, text
        assert _temporaries(out) == [] and open(first, "rb").read() == before
        assert [p for _, p in ckpt_io.step_files(out)] == [first]


def _saved_bytes(real_save, obj) -> bytes:
    buf = io.BytesIO()
    real_save({**obj, "step": 2, ckpt_io.CHECKSUM: "0" * 64}, buf)
    return buf.getvalue()


def test_other_errors_of_torch_save_keep_their_traceback(tmp_path, monkeypatch):
    """Only a failed write is the machine's: another RuntimeError of torch.save (a bug) is not reworded."""
    def failing(o, f, *args, **kwargs):
        raise RuntimeError("some other torch.save failure")

    monkeypatch.setattr(torch, "save", failing)
    with pytest.raises(RuntimeError, match="some other torch.save failure"):
        ckpt_io.save_checkpoint({"step": 1}, str(tmp_path), 1, keep_last=1)
    assert _temporaries(str(tmp_path)) == []


def _store_gone(*args, **kwargs):
    raise RemoteError("s3://bucket/clips/shard_00000.lmdb: GET failed after 5 attempts (connection refused)",
                      transient=True)


def test_a_store_gone_before_the_first_checkpoint_does_not_call_one_intact(tiny_data, tmp_path, monkeypatch,  # noqa: F811
                                                                           capsys):
    monkeypatch.setattr("train.main.train_one_epoch", _store_gone)
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(common(tiny_data, out) + ARGS) != 0
    err = _error_line(capsys)
    assert "intact" not in err, err
    assert err.endswith("; the run stopped at step 0 (no checkpoint has been written yet: rerun with --resume once "
                        "the store answers, it starts from the beginning)"), err


def test_a_store_gone_after_a_resume_names_the_checkpoint_resumed_from(tiny_data, tmp_path, monkeypatch,  # noqa: F811
                                                                       capsys):
    out = tmp_path / "run"
    run_argv(common(tiny_data, out) + ARGS[:-4] + ["--max-steps", "2", "--keep-last", "1"])
    monkeypatch.setattr("train.main.train_one_epoch", _store_gone)
    capsys.readouterr()
    assert main(common(tiny_data, out) + ARGS + ["--resume"]) != 0
    err = _error_line(capsys)
    assert err.endswith("; the run stopped at step 2 (its last checkpoint, checkpoint_step000000002.pt, is intact: "
                        "--resume continues once the store answers)"), err


def test_a_store_gone_outside_a_training_run_names_no_checkpoint():
    """``python -m train eval`` reads without a run: nothing is said about checkpoints or --resume."""
    with pytest.raises(TrainError) as caught, reading("--data", "s3://bucket/clips"):
        _store_gone()
    assert str(caught.value) == ("--data: s3://bucket/clips/shard_00000.lmdb: GET failed after 5 attempts "
                                 "(connection refused); rerun once the store answers")
