"""python -m train eval: the same report from a checkpoint, and the per-video scores and fc6/fc7 export."""

from __future__ import annotations

import json

import numpy as np
import torch

from loaders import open_clips
from loaders.presets import KINETICS_MEAN, KINETICS_STD
from train import checkpoint as ckpt_io
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
