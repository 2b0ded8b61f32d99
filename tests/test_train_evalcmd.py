"""python -m train eval: the same report from a checkpoint, and the per-video scores and fc6/fc7 export."""

from __future__ import annotations

import json
import os

import numpy as np
import torch

from loaders import open_clips
from loaders.presets import KINETICS_MEAN, KINETICS_STD
from train import checkpoint as ckpt_io
from train.evalcmd import build_parser as eval_build_parser
from train.evalcmd import main as eval_main
from train.main import run_argv
from train.models.c3d import C3D

from .train_fixtures import common, tiny_data  # noqa: F401


def test_eval_command_reports_and_exports_features(tiny_data, tmp_path, capsys):
    s = run_argv(common(tiny_data, tmp_path / "run") + ["--epochs", "1", "--max-steps", "2", "--batch-size", "8",
                                                       "--val-data", tiny_data])
    ckpt = ckpt_io.latest_path(str(tmp_path / "run"))
    npz = tmp_path / "feats.npz"
    capsys.readouterr()
    code = eval_main(["--checkpoint", ckpt, "--data", tiny_data, "--export", str(npz), "--workers", "0",
                      "--device", "cpu", "--threads", "1", "--batch-size", "7", "--no-progress"])
    assert code == 0
    text = capsys.readouterr().out
    assert "(step 2) on" in text and "(clips: every stored clip, centre 32x32 crop" in text
    report = json.load(open(tmp_path / "run" / "eval" / "clips_train_clips_step2.json"))
    # The same numbers as the trainer's own final evaluation of that checkpoint.
    for key in ("clip_top1", "clip_top5", "video_top1", "video_top5", "clips", "videos"):
        assert report[key] == s["eval"][key], key
    got = np.load(npz)
    assert got["video_ids"].shape == (20,) and got["labels"].shape == (20,) and got["views"].tolist() == [2] * 20
    assert got["probs"].shape == (20, 5) and got["fc6"].shape == (20, 256) and got["fc7"].shape == (20, 256)
    assert json.loads(str(got["protocol"]))["name"] == "clips" and got["classes"].tolist() == report["classes"]
    np.testing.assert_allclose(got["probs"].sum(1), 1.0, atol=1e-9)
    # fc6/fc7 of a video: the mean over its clips (centre crop) of the model's features, computed here.
    model = C3D(5, width=0.0625, clip_len=16, crop_size=32)
    model.load_state_dict(ckpt_io.load(ckpt)["model"])
    model.eval()
    store = open_clips(tiny_data)
    mean, std = torch.tensor(KINETICS_MEAN), torch.tensor(KINETICS_STD)
    starts = np.concatenate(([0], np.cumsum(store.video_clips)[:-1]))
    for v in (0, 13):
        views = []
        for c in range(2):
            frames = torch.from_numpy(store.get(int(starts[v]) + c).clip.copy())
            x = ((frames[:, 4:36, 10:42].float() - mean) / std).permute(3, 0, 1, 2)[None]
            with torch.no_grad():
                views.append(model.forward_with_features(x))
        row = got["video_ids"].tolist().index(store.video_ids[v])
        assert got["labels"][row] == store.video_labels[v]
        for k, name in ((0, "fc6"), (1, "fc7")):
            expected = torch.stack([f[k][0] for f in views]).mean(0).numpy()
            np.testing.assert_allclose(got[name][row], expected, rtol=1e-5, atol=1e-6)
        probs = torch.stack([torch.softmax(f[2][0].double(), 0) for f in views]).mean(0).numpy()
        np.testing.assert_allclose(got["probs"][row], probs, atol=1e-6)


def test_eval_command_errors_are_one_line(tiny_data, tmp_path, capsys):
    assert eval_main(["--checkpoint", str(tmp_path / "none.pt"), "--data", tiny_data, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("train eval: error: checkpoint") and "not found" in err and "\n" not in err


def test_eval_of_a_run_folder_takes_its_newest_intact_checkpoint_and_says_which(tiny_data, tmp_path, capsys):
    out = tmp_path / "run"
    run_argv(common(tiny_data, out) + ["--epochs", "1", "--max-steps", "3", "--batch-size", "8", "--ckpt-every", "1"])
    newest, previous = ckpt_io.step_path(str(out), 3), ckpt_io.step_path(str(out), 2)
    with open(newest, "r+b") as f:  # a damaged newest file is skipped, with a note
        f.seek(os.path.getsize(newest) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    capsys.readouterr()
    argv = ["--data", tiny_data, "--workers", "0", "--device", "cpu", "--threads", "1", "--no-progress"]
    assert eval_main(["--checkpoint", str(out), *argv]) == 0
    text = capsys.readouterr().out
    assert f"note: checkpoint {newest}" in text and "trying the previous one" in text
    assert f"--checkpoint {out} is a folder: evaluating its newest intact checkpoint, {previous} (step 2)" in text
    assert f"eval of {previous} (step 2)" in text
    assert os.path.isfile(out / "eval" / "clips_train_clips_step2.json")
    # A folder without checkpoints: one line saying so (not "not found").
    empty = tmp_path / "empty"
    empty.mkdir()
    assert eval_main(["--checkpoint", str(empty), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"train eval: error: --checkpoint {empty}: the folder holds no checkpoint")
    assert "\n" not in err


def test_eval_of_a_url_uses_the_cache_dir_given(tiny_data, tmp_path, capsys, monkeypatch):
    """--cache-dir and --cache-limit, declared once on CacheSettings, read a URL --data through that cache, not the
    default one (a file:// URL: no network)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "default_cache"))
    out = tmp_path / "run"
    run_argv(common(tiny_data, out) + ["--epochs", "1", "--max-steps", "1", "--batch-size", "8"])
    cache = tmp_path / "cache"
    code = eval_main(["--checkpoint", ckpt_io.latest_path(str(out)), "--data", f"file://{tiny_data}",
                      "--cache-dir", str(cache), "--cache-limit", "1G", "--workers", "0", "--device", "cpu",
                      "--threads", "1", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    assert "(step 1) on file://" in capsys.readouterr().out
    cached = [f for _, _, files in os.walk(cache) for f in files]
    # The project's default cache is $XDG_CACHE_HOME/videoclips (other libraries, matplotlib's font cache among
    # them, may use $XDG_CACHE_HOME too).
    assert cached and not (tmp_path / "default_cache" / "videoclips").exists()
    help_text = " ".join(eval_build_parser().format_help().split())
    assert "--cache-dir DIR" in help_text and "--cache-limit BYTES" in help_text
    assert eval_main(["--checkpoint", "c.pt", "--data", tiny_data, "--cache-limit", "0"]) == 2
    assert "argument --cache-limit" in capsys.readouterr().err  # checked as the trainer's option is
