"""Evaluation as papers report it: N uniformly spaced clips x 3 spatial crops per video, softmax averaged."""

from __future__ import annotations

import json

import numpy as np
import torch

from loaders import open_clips
from loaders.presets import KINETICS_MEAN, KINETICS_STD
from train.data import build_eval_data
from train.dist import DistInfo
from train.engine import evaluate
from train.main import run_argv
from train.models.c3d import C3D
from train.protocols import multiview_items

from .train_fixtures import common, cpu_config, tiny_data  # noqa: F401

CPU = torch.device("cpu")


def test_uniformly_spaced_clips_times_three_crops():
    # Videos of 5, 2 and 10 clips, 3 per video: the centres of 3 equal parts, all of a shorter video.
    items = multiview_items([5, 2, 10], clips_per_video=3, crops=3)
    clips = sorted({c for _, c in items})
    assert clips == [0, 2, 4, 5, 6, 8, 12, 15]  # 0,2,4 | 5+0,5+1 | 7+1,7+5,7+8
    assert items[:4] == [(0, 0), (1, 0), (2, 0), (0, 2)]
    assert len(items) == 3 * len(clips)


def test_10x3_video_score_equals_the_hand_computed_mean(tiny_data, tmp_path):
    """Every video's score is the mean softmax over its 2 stored clips x left/centre/right 32x32 crops."""
    cfg = cpu_config(common(tiny_data, tmp_path) + ["--eval-protocol", "10x3", "--batch-size", "7"])
    assert cfg.eval_batch_size == 7  # the training batch, as none was given for evaluation
    data = build_eval_data(tiny_data, cfg, DistInfo(0, 1, 0, CPU, None))
    assert data.num_clips == 20 * 2 * 3 and data.protocol["name"] == "10x3"  # 10 asked, 2 stored per video
    torch.manual_seed(0)
    model = C3D(5, width=0.0625, clip_len=16, crop_size=32)
    result = evaluate(model, data, CPU, None)
    scores = result["video_scores"]
    assert result["videos"] == 20 and result["clips"] == 120 and scores["views"].tolist() == [6] * 20
    store = open_clips(tiny_data)
    mean, std = torch.tensor(KINETICS_MEAN), torch.tensor(KINETICS_STD)
    model.eval()
    starts = np.concatenate(([0], np.cumsum(store.video_clips)[:-1]))
    for v in (0, 7, 19):
        probs = []
        for c in range(int(store.video_clips[v])):
            frames = torch.from_numpy(store.get(int(starts[v]) + c).clip.copy())  # 16 x 40 x 52 x 3
            for x0 in (0, 10, 20):  # frames 52 wide: left, centre (round(20 / 2)), right; rows 4..36
                crop = (frames[:, 4:36, x0:x0 + 32].float() - mean) / std
                with torch.no_grad():
                    probs.append(torch.softmax(model(crop.permute(3, 0, 1, 2)[None]), dim=1)[0].double())
        expected = torch.stack(probs).mean(0).numpy()
        row = scores["video_ids"].tolist().index(store.video_ids[v])
        assert scores["labels"][row] == store.video_labels[v]
        np.testing.assert_allclose(scores["probs"][row], expected, rtol=0, atol=1e-6)


def test_protocol_is_stated_in_the_console_and_the_eval_file(tiny_data, tmp_path, capsys):
    s = run_argv(common(tiny_data, tmp_path / "run") + ["--epochs", "1", "--max-steps", "1", "--batch-size", "8",
                                                       "--val-data", tiny_data, "--eval-protocol", "10x3",
                                                       "--eval-clips", "1"])
    saved = json.load(open(s["eval_files"]["json"]))
    assert saved["protocol"]["name"] == "1x3" and saved["protocol"]["spatial_crops"] == 3
    assert saved["clips"] == 60 and "video_scores" not in saved
    assert "(1x3: 1 uniformly spaced stored clips per video (all when fewer) x 3 spatial 32x32 crops" in \
        capsys.readouterr().out


def test_every_reported_protocol_is_one_option_value(tiny_data, tmp_path, capsys):
    """NxM: N views per video x M crops (1 centred, 3 along the long side, 10 the corners and centre each also
    flipped), over stored clips or over samples of the videos' timelines; a value the trainer cannot score (5
    crops, no NxM) is refused in one line."""
    from train.main import main

    info = DistInfo(0, 1, 0, CPU, None)
    for extra, name, count in [(["--eval-protocol", "2x1"], "2x1", 20 * 2),
                               (["--eval-protocol", "1x3"], "1x3", 20 * 3),
                               (["--eval-protocol", "4x3", "--sampling", "window", "--clip-len", "16",
                                 "--frame-step", "2"], "4x3", 20 * 4 * 3),
                               (["--eval-protocol", "5x1", "--sampling", "segments", "--clip-len", "16"], "5x1",
                                20 * 5),
                               (["--eval-protocol", "1x10", "--sampling", "segments", "--clip-len", "16"], "1x10",
                                20 * 10),
                               (["--eval-protocol", "2x10"], "2x10", 20 * 2 * 10)]:
        cfg = cpu_config(common(tiny_data, tmp_path) + extra + ["--batch-size", "8"])
        data = build_eval_data(tiny_data, cfg, info)
        assert data.protocol["name"] == name and data.num_clips == count, (extra, data.protocol)
    for bad, words in [("25x5", "5 spatial crops is not one of 1, 3, 10"), ("ten", "expected clips or NxM")]:
        code = main(common(tiny_data, tmp_path / "r") + ["--eval-protocol", bad, "--max-steps", "1"])
        assert code == 2 and words in capsys.readouterr().err
