"""train.data.dataset_info: the model's clip shape comes from the reader, never from a guess."""

from __future__ import annotations

import os
import struct

import pytest
import torch

from convert.format.lmdb import clip_key
from loaders import open_clips
from train import TrainError
from train.data import dataset_info
from train.main import main

from .loaders_fixtures import copy_conversion, loader_base, rewrite_value, short_side_root  # noqa: F401
from .train_fixtures import common, cpu_config, final_state, resumed_equals_unbroken, tiny_data, tiny_tfrecord  # noqa: F401


def test_fixed_size_conversion(tiny_data):
    shape = dataset_info(tiny_data, 32)
    assert (shape.clip_len, shape.frame, shape.short_side) == (16, (40, 52), None)
    assert shape.classes == open_clips(tiny_data).classes and len(shape.classes) == 5
    with pytest.raises(TrainError, match=r"--crop-size 41 does not fit frames of 40x52"):
        dataset_info(tiny_data, 41)


def test_short_side_conversion_takes_the_stored_clip_length(short_side_root):
    """clip_shape is null in the manifest: T comes from the clip spec, the crop is checked against the short side."""
    assert open_clips(short_side_root).manifest.data.clip_shape is None
    shape = dataset_info(short_side_root, 112)
    assert (shape.clip_len, shape.frame, shape.short_side) == (16, None, 120)
    with pytest.raises(TrainError, match=r"--crop-size 121 does not fit frames whose short side is 120"):
        dataset_info(short_side_root, 121)


def test_clips_of_different_lengths_are_refused(tiny_data, tmp_path):
    store = open_clips(tiny_data)  # the copy has the same layout; opening it here would lock out the rewrite
    root = copy_conversion(tiny_data, str(tmp_path / "mixed"))
    last_shard_first_video = int(max(range(len(store.video_ids)), key=lambda v: (store.video_shard[v], -v)))
    shards, refs = store.refs([int(sum(store.video_clips[:last_shard_first_video]))])
    shard, key = int(shards[0]), clip_key(*refs[0])
    assert shard == store.video_shard[-1] and shard > 0  # the sampled clip of another shard than the first

    def eight_frames(value: bytes) -> bytes:  # the header's T field (offset 8) says 8
        return value[:8] + struct.pack("<H", 8) + value[10:]

    rewrite_value(os.path.join(root, os.path.relpath(store.shard_paths[shard], store.root)), key, eight_frames)
    # The reader refuses a header whose shape is not the manifest's (ClipStore.read), naming the clip.
    with pytest.raises(TrainError, match=r"--data .*mixed: cannot read the clip shape: .*shape \(8, 40, 52, 3\), "
                                         r"the manifest says \(16, 40, 52, 3\)"):
        dataset_info(root, 32)


def test_trainer_refuses_a_clip_len_longer_than_stored(tiny_data, tmp_path, capsys):
    code = main(common(tiny_data, tmp_path / "run") + ["--clip-len", "17", "--max-steps", "1"])
    assert code == 2
    assert "--clip-len 17 is longer than the stored clips of --data (16 frames)" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run" / "checkpoint.pt")


def test_video_epochs_in_the_trainer(tiny_data, tmp_path):
    """20 videos x 1 clip per epoch at batch 8: 2 steps per epoch (the last 4 dropped), one clip per video."""
    from train.data import build_train_data
    from train.dist import DistInfo
    from train.main import run_argv

    cpu = torch.device("cpu")

    argv = common(tiny_data, tmp_path / "v") + ["--epoch-mode", "videos", "--batch-size", "8", "--epochs", "2"]
    s = run_argv(argv)
    assert s["step"] == 4
    cfg = cpu_config(argv)
    assert (cfg.epoch_samples, cfg.steps_per_epoch) == (20, 2)
    data = build_train_data(cfg, DistInfo(0, 1, 0, cpu, None))
    assert data.steps_per_epoch == 2 and data.sampler.epoch_size == 20
    data.set_epoch(1)
    videos = [v for b in data for v in b["video_id"]]
    assert len(videos) == 16 and len(set(videos)) == 16  # 16 different videos, one clip each


@pytest.mark.parametrize("loader", ["threads", "processes", "dali-source", "dali-native"])
def test_every_loader_gives_the_configs_steps_when_the_batch_does_not_divide_the_clips(
        tiny_data, tiny_tfrecord, tmp_path, loader):
    """40 clips at batch 6, on one rank and on each of two: the config's steps per epoch are the ones the loader
    yields, the partial last batch dropped (the samplers' loaders, DALI's source route) or padded to a whole one
    (DALI's native TFRecord reader, pad_last_batch), and a run trains that many steps per epoch."""
    from train.args import build_parser, resolve_config
    from train.data import build_train_data
    from train.dist import DistInfo
    from train.main import run_argv

    kind, _, route = loader.partition("-")
    if kind == "dali":
        pytest.importorskip("nvidia.dali")
    data = tiny_tfrecord if route == "native" else tiny_data
    argv = common(data, tmp_path / "run") + ["--loader", kind, "--batch-size", "6", "--epochs", "1"]
    if kind == "processes":
        argv += ["--workers", "1"]
    padded = route == "native"
    s = run_argv(argv)
    assert (s["step"], s["epoch"]) == (7 if padded else 6, 1)
    for world, expected in ((1, 7 if padded else 6), (2, 4 if padded else 3)):
        for rank in range(world):
            info = DistInfo(rank, world, rank, torch.device("cpu"), None)
            cfg = resolve_config(build_parser().parse_args(argv), info)
            assert cfg.steps_per_epoch == expected and cfg.pad_last_batch == padded, (world, rank)
            train_data = build_train_data(cfg, info)
            try:
                assert train_data.steps_per_epoch == expected
                batches = [b["clip"].shape[0] for b in train_data]
                assert batches == [6] * expected, (world, rank)
            finally:
                train_data.close()


def test_the_trainer_reads_samples_of_videos_from_the_one_conversion(tiny_data, tmp_path):
    """--sampling window: 16 frames at step 2 from anywhere in each video (32 frames stored each: a 31-frame
    span), 2 samples of each of the 20 videos per epoch (40 at batch 8: 5 steps), evaluated on 2 views spread
    evenly x 3 crops per video; the spec is held in the run's settings (the checkpoint's config) and nowhere
    else."""
    import glob
    import json

    from train.data import build_eval_data, build_train_data, make_sample_spec
    from train.dist import DistInfo
    from train.main import run_argv

    argv = common(tiny_data, tmp_path / "w") + ["--sampling", "window", "--clip-len", "16", "--frame-step", "2",
                                                "--clips-per-video", "2", "--batch-size", "8", "--epochs", "1",
                                                "--val-data", tiny_data, "--eval-protocol", "10x3",
                                                "--eval-clips", "2"]
    s = run_argv(argv)
    assert s["step"] == 5
    cfg = cpu_config(argv)
    assert (cfg.epoch_samples, cfg.steps_per_epoch) == (40, 5)
    spec = make_sample_spec(cfg, train=True)
    assert spec is not None and (spec.frames, spec.step, spec.rule, spec.clips_per_video) == (16, 2, "window", 2)
    info = DistInfo(0, 1, 0, torch.device("cpu"), None)
    data = build_train_data(cfg, info)
    data.set_epoch(0)
    batch = next(iter(data))
    assert tuple(batch["clip"].shape) == (8, 16, 32, 32, 3)
    evaluation = build_eval_data(tiny_data, cfg, info)
    assert evaluation.protocol["name"] == "2x3" and evaluation.protocol["sampling"]["views"] == 2
    written = [json.load(open(p)) for p in glob.glob(str(tmp_path / "w" / "eval" / "*.json"))]
    assert written and all(w["protocol"]["name"] == "2x3" for w in written)
    saved = final_state(tmp_path / "w")["config"]
    assert (saved["sampling"], saved["frame_step"], saved["clip_len"]) == ("window", 2, 16)


def test_sampling_settings_that_do_not_go_together_are_refused(tiny_data, tmp_path, capsys):
    for extra, words in [(["--sampling", "window", "--order", "blocks"], "use --order random"),
                         (["--sampling", "segments", "--epoch-mode", "videos"], "it takes --epoch-mode clips"),
                         (["--frame-step", "2"], "--frame-step 2 is for --sampling window"),
                         (["--short-side-scale", "20"], "--crop-size 32 <= LO <= HI"),
                         (["--short-side-scale", "40,36"], "--crop-size 32 <= LO <= HI"),
                         (["--short-side-scale", "36", "--crop-scales", "1,0.8"], "give one"),
                         (["--random-resized-crop", "0.08"], "expected LO,HI"),
                         (["--random-resized-crop", "0.5,1", "--short-side-scale", "36"], "give one")]:
        code = main(common(tiny_data, tmp_path / "run") + extra + ["--max-steps", "1"])
        assert code == 2
        assert words in capsys.readouterr().err


def test_a_run_of_samples_resumed_mid_epoch_ends_as_the_unbroken_run(tiny_data, tmp_path):
    """The samples' draws are keyed by (seed, epoch, sample), as the crops are: stopped after 3 of an epoch's 5
    steps and resumed, a run of --sampling window ends with the unbroken run's weights, bit for bit."""
    args = ["--sampling", "window", "--clip-len", "16", "--frame-step", "2", "--clips-per-video", "2",
            "--batch-size", "8", "--optimizer", "adamw", "--lr", "1e-3", "--ckpt-every", "1", "--epochs", "2"]
    a, _ = resumed_equals_unbroken(tiny_data, tmp_path, args)
    assert a["step"] == 10


def test_a_short_side_scale_in_the_trainer(tiny_data, tmp_path):
    """--short-side-scale 36,48: training crops as if the 40x52 frames were resized to a short side of 36..48,
    evaluation at 36; the presets say so and a run trains."""
    from train.data import make_preset
    from train.main import run_argv

    argv = common(tiny_data, tmp_path / "s") + ["--short-side-scale", "36,48", "--batch-size", "8", "--max-steps",
                                                "2", "--val-data", tiny_data]
    cfg = cpu_config(argv)
    assert make_preset(cfg, True).short_side == (36, 48) and make_preset(cfg, False).short_side == (36, 36)
    assert run_argv(argv)["step"] == 2
    resized = cpu_config(common(tiny_data, tmp_path / "r") + ["--random-resized-crop", "0.08,1", "--batch-size", "8"])
    assert make_preset(resized, True).random_resized == (0.08, 1.0)
    assert make_preset(resized, False).random_resized is None


def test_the_model_registry_carries_each_networks_sampling_and_flags_override_it(tiny_data, tmp_path, monkeypatch):
    """--sampling, --frame-step and --clip-len default to the --model's recipe (ModelSpec.sampling); every network
    of the registry reads stored clips today, so here C3D's recipe is made 16x2 windows to see it taken."""
    import dataclasses

    from loaders import SampleSpec
    from train.models import MODELS

    assert all(isinstance(m.sampling, SampleSpec) and m.sampling.rule == "clips" for m in MODELS.values())
    base = cpu_config(common(tiny_data, tmp_path) + ["--batch-size", "8"])
    assert (base.sampling, base.frame_step, base.clip_len) == ("clips", 1, 16)
    monkeypatch.setitem(MODELS, "c3d", dataclasses.replace(MODELS["c3d"], sampling=SampleSpec(frames=16, step=2,
                                                                                               rule="window")))
    cfg = cpu_config(common(tiny_data, tmp_path) + ["--batch-size", "8"])
    assert (cfg.sampling, cfg.frame_step, cfg.clip_len, cfg.epoch_samples) == ("window", 2, 16, 20)
    flags = cpu_config(common(tiny_data, tmp_path) + ["--batch-size", "8", "--sampling", "clips"])
    assert (flags.sampling, flags.clip_len, flags.epoch_samples) == ("clips", 16, 40)
