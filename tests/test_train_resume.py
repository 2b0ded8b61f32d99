"""What --resume, --finetune and train eval trust in a checkpoint: its checksum, its structure, its settings and
data, and that it holds nothing but tensors and plain values."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from train import checkpoint as ckpt_io
from train.evalcmd import main as eval_main
from train.main import main, run_argv

from .train_fixtures import assert_states_equal, common, final_state, one_line_error, tiny_data  # noqa: F401

# 40 clips, batch 8: 5 steps per epoch; a checkpoint after every step.
ARGS = ["--batch-size", "8", "--optimizer", "adamw", "--lr", "1e-3", "--ckpt-every", "1", "--epochs", "1"]


def _step_file(out, step: int) -> str:
    return ckpt_io.step_path(str(out), step)


def _flip_a_weight_byte(path: str, name: str = "fc6.weight") -> None:
    """Flip one bit inside tensor ``name``'s bytes in the file itself (its hard links see it too), as a bad disk
    sector or a damaged copy would: torch.load still reads the file."""
    weights = ckpt_io.load(path)["model"][name]
    raw = weights.contiguous().numpy().tobytes()
    with open(path, "rb") as f:
        data = f.read()
    at = data.find(raw[:256])
    assert at >= 0 and data.find(raw[:256], at + 1) < 0
    with open(path, "r+b") as f:
        f.seek(at + 1000)
        byte = f.read(1)
        f.seek(at + 1000)
        f.write(bytes([byte[0] ^ 0x10]))


def _eval(path: str, data: str) -> int:
    return eval_main(["--checkpoint", path, "--data", data, "--workers", "0", "--device", "cpu", "--threads", "1",
                      "--no-progress"])


def test_a_checkpoint_with_flipped_weight_bytes_is_not_trusted(tiny_data, tmp_path, capsys):
    """--resume falls back to the newest intact checkpoint (and ends where an unbroken run ends); train eval and
    --finetune refuse the damaged file in one line naming the intact one beside it."""
    run_argv(common(tiny_data, tmp_path / "a") + ARGS)
    out = tmp_path / "b"
    run_argv(common(tiny_data, out) + ARGS + ["--max-steps", "4"])
    newest = _step_file(out, 4)
    _flip_a_weight_byte(newest)
    torch.load(newest, weights_only=True)  # the damage torch does not see
    capsys.readouterr()
    run_argv(common(tiny_data, out) + ARGS + ["--resume"])
    text = capsys.readouterr().out
    notes = [line for line in text.splitlines() if line.startswith("note: checkpoint")]
    assert notes == [f"note: checkpoint {newest} fails its checksum: its content changed after it was saved (a "
                     f"damaged disk or copy); trying the previous one"], text
    assert f"resumed from {_step_file(out, 3)} at step 3" in text
    assert_states_equal(final_state(tmp_path / "a")["model"], final_state(out)["model"])

    damaged = tmp_path / "c"
    run_argv(common(tiny_data, damaged) + ARGS + ["--max-steps", "2"])
    _flip_a_weight_byte(_step_file(damaged, 2))
    capsys.readouterr()
    expected = (f"checkpoint {_step_file(damaged, 2)} fails its checksum: its content changed after it was saved "
                f"(a damaged disk or copy); {_step_file(damaged, 1)} beside it is intact")
    assert _eval(ckpt_io.latest_path(str(damaged)), tiny_data) == 2
    err = capsys.readouterr().err
    assert err == f"train eval: error: {expected.replace(_step_file(damaged, 2), ckpt_io.latest_path(str(damaged)))}\n"
    assert main(common(tiny_data, tmp_path / "ft") + ARGS + ["--finetune", _step_file(damaged, 2)]) == 2
    assert one_line_error(capsys) == expected


def test_a_checkpoint_saved_before_checksums_loads_and_says_it_was_not_checked(tiny_data, tmp_path, capsys):
    out = tmp_path / "old"
    run_argv(common(tiny_data, out) + ARGS + ["--max-steps", "2"])
    for _, path in ckpt_io.step_files(str(out)):
        os.unlink(path)
    latest = ckpt_io.latest_path(str(out))
    old = ckpt_io.load(latest)
    old.pop("data", None)  # nor did checkpoints record their data then
    os.unlink(latest)
    torch.save(old, latest)  # as the trainer wrote it then: no content_sha256
    capsys.readouterr()
    run_argv(common(tiny_data, out) + ARGS + ["--max-steps", "3", "--resume"])
    text = capsys.readouterr().out
    assert text.count("has no checksum") == 1
    assert (f"note: checkpoint {latest} has no checksum (a bare state dict, or saved before checkpoints had one): "
            f"its content is not checked") in text
    assert f"note: checkpoint {latest} records no identity of its data" in text
    assert f"resumed from {latest} at step 2" in text and final_state(out)["step"] == 3


@pytest.mark.parametrize("damage", ["no sampler", "no rng", "empty rng", "text step", "text epoch_step"])
def test_resume_falls_back_past_a_checkpoint_missing_its_parts(tiny_data, tmp_path, capsys, damage):
    """A checkpoint that loads and passes its checksum but is not a whole trainer checkpoint is skipped with one
    note, never resumed into a traceback."""
    out = tmp_path / "run"
    run_argv(common(tiny_data, out) + ARGS + ["--max-steps", "4"])
    newest = _step_file(out, 4)
    ckpt = ckpt_io.load(newest)
    if damage == "no sampler":
        del ckpt["sampler"]
        why = "'sampler' is missing"
    elif damage == "no rng":
        del ckpt["rng"]
        why = "'rng' is missing"
    elif damage == "empty rng":
        ckpt["rng"] = []
        why = "'rng' is [] (list), not a list of every process's RNG states"
    else:
        key = damage.split()[1]
        ckpt[key] = str(ckpt[key])
        why = f"'{key}' is '4' (str), not an integer >= 0"
    ckpt_io.save_atomic(ckpt, newest)  # with a checksum that fits: only the structure is wrong
    capsys.readouterr()
    run_argv(common(tiny_data, out) + ARGS + ["--resume"])
    text = capsys.readouterr().out
    notes = [line for line in text.splitlines() if line.startswith("note: checkpoint")]
    assert notes == [f"note: checkpoint {newest} cannot be resumed: {why}; trying the previous one"], text
    assert f"resumed from {_step_file(out, 3)} at step 3" in text and final_state(out)["step"] == 5


def test_resume_refuses_other_shapes_and_data_in_one_line_and_prints_what_changed(tiny_data, tmp_path, capsys):
    out = tmp_path / "run"
    run_argv(common(tiny_data, out) + ARGS + ["--max-steps", "1"])
    capsys.readouterr()
    # A shape: refused before anything is built (it used to be C3D's ValueError traceback).
    assert main(common(tiny_data, out) + ARGS + ["--max-steps", "2", "--resume", "--clip-len", "8"]) == 2
    assert "was saved with --clip-len 16 (this run: 8): pass the checkpoint's values" in one_line_error(capsys)
    # Without a checkpoint, a clip too short for C3D is one line naming the options too.
    assert main(common(tiny_data, tmp_path / "short") + ARGS + ["--clip-len", "8"]) == 2
    assert one_line_error(capsys).startswith("--clip-len 8 --crop-size 32 --downsample 1: C3D needs at least 16 "
                                             "frames")
    # The order of the data: refused unless --force-resume.
    assert main(common(tiny_data, out) + ARGS + ["--max-steps", "2", "--resume", "--seed", "1"]) == 2
    err = one_line_error(capsys)
    assert "was saved with --seed 0 (this run: 1), which decide the clips of an epoch and their order" in err
    assert "--force-resume to go on anyway" in err
    assert final_state(out)["step"] == 1  # left alone
    # Other settings: allowed, and said.
    run_argv(common(tiny_data, out) + ARGS + ["--max-steps", "2", "--resume", "--lr", "2e-3", "--dropout", "0.2"])
    assert "changed since the checkpoint: --dropout 0.5 -> 0.2, --lr 0.001 -> 0.002" in capsys.readouterr().out
    run_argv(common(tiny_data, out) + ARGS + ["--max-steps", "3", "--resume", "--seed", "1", "--force-resume"])
    text = capsys.readouterr().out
    assert "changed since the checkpoint: --dropout 0.2 -> 0.5, --lr 0.002 -> 0.001, --seed 0 -> 1" in text
    assert final_state(out)["step"] == 3
    # The same data in another folder is the same data.
    moved = tmp_path / "moved"
    shutil.copytree(tiny_data, moved)  # a copy: LMDB refuses one file opened under two paths in a process
    run_argv(common(str(moved), out) + ARGS + ["--max-steps", "4", "--resume", "--seed", "1"])
    assert f"changed since the checkpoint: --data {tiny_data} -> {moved}" in capsys.readouterr().out


def test_resume_on_other_data_with_the_same_classes_is_refused_unless_forced(tiny_data, tmp_path, capsys):
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    # The same videos converted again with one clip per video: the same five classes, other clips.
    manifest = json.load(open(os.path.join(tiny_data, "manifest.json")))
    other = str(tmp_path / "other")
    run_job(manifest["source"]["path"], other, ConvertConfig(size=(40, 52), max_clips=1),
            JobOptions(workers=2, progress=False))
    out = tmp_path / "run"
    run_argv(common(tiny_data, out) + ARGS + ["--max-steps", "1"])
    capsys.readouterr()
    assert main(common(other, out) + ARGS + ["--max-steps", "2", "--resume"]) == 2
    err = one_line_error(capsys)
    assert f"was trained on other data than --data {other} (40 clips of 20 videos in " in err
    assert "; --data: 20 clips of 20 videos in " in err and "--force-resume" in err
    run_argv(common(other, out) + ARGS + ["--max-steps", "2", "--resume", "--force-resume"])
    text = capsys.readouterr().out
    assert "changed since the checkpoint: --data" in text and "the data (40 clips of 20 videos" in text
    assert final_state(out)["data"]["clips"] == 20


class _Payload:
    """What a malicious checkpoint carries: unpickling it would create a folder (a stand-in for running code)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.makedirs, (self.marker,)


def test_a_malicious_checkpoint_is_refused_everywhere_in_one_line(tiny_data, tmp_path, capsys):
    marker = str(tmp_path / "ran")
    out = tmp_path / "run"
    os.makedirs(out)
    evil = ckpt_io.latest_path(str(out))
    torch.save({"model": {"w": torch.zeros(1)}, "payload": _Payload(marker)}, evil)
    expected = (f"checkpoint {evil} holds the Python object os.makedirs, which loading with weights_only=True "
                f"refuses (a file of weights holds tensors and plain values only; one that needs more may run code "
                f"when loaded)")
    assert _eval(evil, tiny_data) == 2
    assert capsys.readouterr().err == f"train eval: error: {expected}\n"
    assert main(common(tiny_data, tmp_path / "ft") + ARGS + ["--finetune", evil]) == 2
    assert one_line_error(capsys) == expected
    assert main(common(tiny_data, out) + ARGS + ["--resume"]) == 2
    captured = capsys.readouterr()
    assert f"note: {expected}; no older checkpoint left" in captured.out.splitlines()
    assert "Weights only load failed" not in captured.out + captured.err
    assert not os.path.exists(marker)
