"""Conversion output is byte-identical to what the code wrote before its speed work (issue 9).

The expected shard checksums and video records below were computed by the
conversion code at a6f38fa (before one open per video, in-place clip arrays
and the lighter shard start-up) from the real shared videos; those of the
synthetic stand-ins (tests/videos.py) by the code of their commit, whose
conversion of the real videos still gave a6f38fa's values. A shard checksum
hashes every clip header, and a header holds its payload's CRC-32 and length,
so an equal checksum means every stored byte of every clip is equal. Any
change to the decode path, the clip cutter or a writer that alters one pixel,
one clip boundary or one record fails here.

The values depend on FFmpeg's decoders and swscale: they were recorded with
the FFmpeg that PyAV 18.1.0 bundles (8.1.2). With another FFmpeg the test is
skipped, saying so, rather than compared against pixels that FFmpeg itself
changed; recompute them with ``python -m tests.test_convert_identical``. The
synthetic tier's values depend on the encoders too, which come in PyAV's
wheel: they are compared with that PyAV only, and only after checking that it
wrote the stand-ins' pictures byte for byte as recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import pytest

from convert.format import get_backend
from convert.job.run import JobOptions, run_job
from convert.worker.plan import ConvertConfig

from . import videos as stand_ins
from .test_convert_job import layout_tree  # noqa: F401 - the fixture of symlinked shared videos

RECORDED_WITH_FFMPEG = "8.1.2"
SYNTHETIC_RECORDED_WITH_PYAV = "18.1.0"

# name -> settings; together they cover the fixed-size and short-side resize, fps
# resampling up and down (repeated frames), stride / step / max_clips, the
# short-video policies, damage policies, the rotated, VFR, no-duration and
# corrupt videos, both backends and all three codecs.
CONFIGS = {
    "lmdb-raw-default": ConvertConfig(),
    "tfrecord-lz4-resampled": ConvertConfig(backend="tfrecord", codec="lz4", short_side=64, size=None, fps=10,
                                            clip_len=8, stride=2, step=5, max_clips=3, short="repeat_last"),
    "lmdb-jpeg-upsampled": ConvertConfig(codec="jpeg", size=(32, 48), fps=30, clip_len=4, short="loop",
                                         on_damage="skip"),
    "tfrecord-raw-default": ConvertConfig(backend="tfrecord"),
}

# Computed by the code at a6f38fa: python -m tests.test_convert_identical. The TFRecord part and index
# file hashes were recomputed when shards started converting their videos in stable-hash order (which
# moves records within the part files); every shard checksum, value byte count and record stayed as
# a6f38fa wrote them (the recomputation asserted it).
EXPECTED = {
    "lmdb-jpeg-upsampled": {
        "shards": {
            "shard-00000": ["b4ca2951be2864a02641f24acc3bfd76b3b69aaae9b11831c6e45efab7107cae", 549597, 107],
            "shard-00001": ["e91b5f8d1bf949606c13ed4ee46454350eafc2f7e9e3d10c01efb433644ffd13", 622023, 127],
        },
        "records": {
            "kinetics/decord__corrupted": ["failed", 0, 84, "1a4033a8f828"],
            "kinetics/mmaction2__demo": ["ok", 75, 300, "e3b0c44298fc"],
            "kinetics/mmaction2__part_0": ["ok", 8, 33, "e3b0c44298fc"],
            "ucf/decord__video_90": ["padded", 1, 3, "1b4202cc00f4"],
            "ucf/mmaction2__test": ["ok", 49, 198, "e3b0c44298fc"],
            "ucf/torchcodec__h265_video": ["ok", 7, 30, "e3b0c44298fc"],
            "web/mmcv__test": ["ok", 50, 202, "e3b0c44298fc"],
            "web/moviepy__big_buck_bunny_432_433": ["ok", 7, 30, "e3b0c44298fc"],
            "web/moviepy__no_duration": ["ok", 37, 149, "e3b0c44298fc"],
        },
    },
    "lmdb-raw-default": {
        "shards": {
            "shard-00000": ["ff4c9db7bf00879596ce2d4911c0f781c51b7aeee02c65c6b9e89e9c45888208", 23114911, 22],
            "shard-00001": ["25f7c036d13b7cc07dd2a0e03f613680fde1acdf61797cac04c4d7c3a7085e5f", 24165736, 23],
        },
        "records": {
            "kinetics/decord__corrupted": ["partial", 1, 28, "28419feae42c"],
            "kinetics/mmaction2__demo": ["ok", 17, 280, "e3b0c44298fc"],
            "kinetics/mmaction2__part_0": ["ok", 2, 32, "e3b0c44298fc"],
            "ucf/decord__video_90": ["short", 0, 3, "485327764343"],
            "ucf/mmaction2__test": ["ok", 10, 164, "e3b0c44298fc"],
            "ucf/torchcodec__h265_video": ["short", 0, 10, "55aec6be0ba1"],
            "web/mmcv__test": ["ok", 10, 168, "e3b0c44298fc"],
            "web/moviepy__big_buck_bunny_432_433": ["ok", 1, 24, "e3b0c44298fc"],
            "web/moviepy__no_duration": ["ok", 4, 74, "e3b0c44298fc"],
        },
    },
    "tfrecord-lz4-resampled": {
        "shards": {
            "shard-00000": ["9ce028442d16acd6590532bc218a61504a4de2f1fae7990aace73c55e3f4a475", 841283, 11,
                ["part-00000.idx", "7702656e56ac22c1a8323268f48b46a72070ccf59dbba3c99df7919f3d46a6ce"],
                ["part-00000.tfrecord", "f00d0cf6ee9e06a35783faf79cb58c4f15944559eaa452512e653bd2e264001f"]],
            "shard-00001": ["154a8d722e7aab7fde11f548ab5af385534e5a6dc8de9a1f04ae7cf37a9b35f6", 660311, 8,
                ["part-00000.idx", "97c9c4bee0e0a628a7eee58460695ff92c3d97f0c71db9604cd62865fca94890"],
                ["part-00000.tfrecord", "67df9c4cb8d8d34f00b2d2bacbfb1596a96eb84101600b67c3f6ee50c9fbe9ae"]],
        },
        "records": {
            "kinetics/decord__corrupted": ["ok", 3, 25, "e3b0c44298fc"],
            "kinetics/mmaction2__demo": ["ok", 3, 25, "e3b0c44298fc"],
            "kinetics/mmaction2__part_0": ["padded", 1, 11, "097b1dac5ce2"],
            "ucf/decord__video_90": ["padded", 1, 1, "7c038f5c467e"],
            "ucf/mmaction2__test": ["ok", 3, 25, "e3b0c44298fc"],
            "ucf/torchcodec__h265_video": ["padded", 1, 10, "a9b6deacf77f"],
            "web/mmcv__test": ["ok", 3, 25, "e3b0c44298fc"],
            "web/moviepy__big_buck_bunny_432_433": ["padded", 1, 10, "a9b6deacf77f"],
            "web/moviepy__no_duration": ["ok", 3, 25, "e3b0c44298fc"],
        },
    },
    "tfrecord-raw-default": {
        "shards": {
            "shard-00000": ["ff4c9db7bf00879596ce2d4911c0f781c51b7aeee02c65c6b9e89e9c45888208", 23114911, 22,
                ["part-00000.idx", "7bbb062eeff274efdb6103434a6ad8e386ca2bcdb7ac21c460e5a7d18d1734cf"],
                ["part-00000.tfrecord", "c96564dca4c22b415155f5b66a2664a1bec4e14b45ee12e4ee35f9f111522e71"]],
            "shard-00001": ["25f7c036d13b7cc07dd2a0e03f613680fde1acdf61797cac04c4d7c3a7085e5f", 24165736, 23,
                ["part-00000.idx", "e4ca0634e5a6d1b31cedda14f1cd8689017f63caab828b2cf249b4ab3aafbd00"],
                ["part-00000.tfrecord", "684558c226cd7c079007602b18dd8bfb7ed5c65d125fa094b5fe0d122b23c72e"]],
        },
        "records": {
            "kinetics/decord__corrupted": ["partial", 1, 28, "28419feae42c"],
            "kinetics/mmaction2__demo": ["ok", 17, 280, "e3b0c44298fc"],
            "kinetics/mmaction2__part_0": ["ok", 2, 32, "e3b0c44298fc"],
            "ucf/decord__video_90": ["short", 0, 3, "485327764343"],
            "ucf/mmaction2__test": ["ok", 10, 164, "e3b0c44298fc"],
            "ucf/torchcodec__h265_video": ["short", 0, 10, "55aec6be0ba1"],
            "web/mmcv__test": ["ok", 10, 168, "e3b0c44298fc"],
            "web/moviepy__big_buck_bunny_432_433": ["ok", 1, 24, "e3b0c44298fc"],
            "web/moviepy__no_duration": ["ok", 4, 74, "e3b0c44298fc"],
        },
    },
}


# The synthetic tier, computed by this code (python -m tests.test_convert_identical) from the stand-ins
# whose video packets hash to SYNTHETIC_PICTURES. Their records are the real files' (EXPECTED's) to the
# reason: the stand-ins have the real files' frame counts and damage; only the pixels, so the checksums,
# differ, and only the shards are listed here.
SYNTHETIC_PICTURES = "e8b9c9049d113da92a8a106954b50b75c9b7b5d733992868d4d95f33b111dcfa"
EXPECTED_SYNTHETIC = {
    "lmdb-jpeg-upsampled": {
        "shards": {
            "shard-00000": ["c65fb0b8e98e47a9b34e6ac3a8d7ea1d53a585aec06a6075d283e50af244c968", 390382, 107],
            "shard-00001": ["497fc63ae4956d2ebb192990c352e373a4ca0690793ee816515ed83714e363d8", 472915, 127],
        },
    },
    "lmdb-raw-default": {
        "shards": {
            "shard-00000": ["f5e741c94ea2c63189290e95b5b2bcf843e27beba3e7b1010ede68454a970ece", 23114911, 22],
            "shard-00001": ["f67c081a882cccc32144a499863974a7f793e66f3ca91f7f21d09caf32058a48", 24165736, 23],
        },
    },
    "tfrecord-lz4-resampled": {
        "shards": {
            "shard-00000": ["92c8e7b747213d437cf07b9adfbbf97a50ab8f6ac1cb3097607171eaf479500b", 1134850, 11,
                ["part-00000.idx", "507c9b25420b6275b52e610df2d586e3ad48d5ff7463c093d01c070f3a93df97"],
                ["part-00000.tfrecord", "a6bb2830e729660230c602f9d34789c10ec6d37e87089b6257344740eda7181a"]],
            "shard-00001": ["60dbc3ba3cb4797f6c0b0e968b9f7cd22330bb9f606f2e84b2bdb381a5f290b2", 881355, 8,
                ["part-00000.idx", "4bb737308b3cff947adb464ef048a85155bb76a88cc9b866aaa1fb0493a7f48a"],
                ["part-00000.tfrecord", "fe7eb9f3a853f79b2ee40b0a2d2472b6f3d88f3b0f2b09b754ab28cfe3122231"]],
        },
    },
    "tfrecord-raw-default": {
        "shards": {
            "shard-00000": ["f5e741c94ea2c63189290e95b5b2bcf843e27beba3e7b1010ede68454a970ece", 23114911, 22,
                ["part-00000.idx", "7bbb062eeff274efdb6103434a6ad8e386ca2bcdb7ac21c460e5a7d18d1734cf"],
                ["part-00000.tfrecord", "271b30ffd7007b24aac604a3db772bbf1ec4f38e5ad2b652be14281045495b6d"]],
            "shard-00001": ["f67c081a882cccc32144a499863974a7f793e66f3ca91f7f21d09caf32058a48", 24165736, 23,
                ["part-00000.idx", "e4ca0634e5a6d1b31cedda14f1cd8689017f63caab828b2cf249b4ab3aafbd00"],
                ["part-00000.tfrecord", "ad7d8eec49ab6ec6c3a78c429b9c97ca952b5266a7ec89a8a358eaf5e3bc4cd2"]],
        },
    },
}


def conversion_digest(tree: str, out: str, config: ConvertConfig) -> dict:
    """What a conversion stored: each shard's checksum and value bytes, and every video record.

    For TFRecord shards also the SHA-256 of each record and index file (their
    bytes are fully defined by FORMAT.md; LMDB's page layout is not).
    """
    manifest = run_job(tree, out, config, JobOptions(workers=2, shards=2, progress=False))
    shards = {s["name"]: [s["sha256"], s["value_bytes"], s["clips"]] for s in manifest["shards"]}
    records = {}
    for s in manifest["shards"]:
        reader = get_backend(config.backend).reader(os.path.join(out, s["path"]))
        try:
            for r in reader.records():
                records[r.video_id] = [r.status, r.clips, r.frames, hashlib.sha256(r.reason.encode()).hexdigest()[:12]]
        finally:
            reader.close()
        if config.backend == "tfrecord":
            folder = os.path.join(out, s["path"])
            for f in sorted(os.listdir(folder)):
                if f.endswith((".tfrecord", ".idx")):
                    with open(os.path.join(folder, f), "rb") as fh:
                        shards[s["name"]].append([f, hashlib.sha256(fh.read()).hexdigest()])
    return {"shards": shards, "records": dict(sorted(records.items()))}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_conversion_bytes_are_those_of_the_reference_code(layout_tree, videos, tmp_path, name):  # noqa: F811
    import av

    if av.ffmpeg_version_info != RECORDED_WITH_FFMPEG:
        pytest.skip(f"expected checksums were recorded with FFmpeg {RECORDED_WITH_FFMPEG}, "
                    f"this PyAV has {av.ffmpeg_version_info}")
    expected = EXPECTED
    if videos.tier == "synthetic":
        if av.__version__ != SYNTHETIC_RECORDED_WITH_PYAV:
            pytest.skip(f"the synthetic videos' checksums were recorded with the encoders of PyAV "
                        f"{SYNTHETIC_RECORDED_WITH_PYAV}, this is PyAV {av.__version__}")
        # Same encoders, so the same pictures: others mean tests/videos.py changed (record again).
        assert stand_ins.pictures_digest(videos.root) == SYNTHETIC_PICTURES
        expected = EXPECTED_SYNTHETIC
    got = conversion_digest(layout_tree, str(tmp_path / name), CONFIGS[name])
    assert got["records"] == EXPECTED[name]["records"]
    assert got["shards"] == expected[name]["shards"]


if __name__ == "__main__":  # print the expected values computed by the code as it is now, for both tiers
    import tempfile

    from . import conftest
    from .test_convert_job import LAYOUT

    with tempfile.TemporaryDirectory() as tmp:
        roots = {"synthetic": stand_ins.write_all(os.path.join(tmp, "stand_ins"))}
        if os.path.isdir(conftest.SHARED_VIDEOS):
            roots["real"] = conftest.SHARED_VIDEOS
        result: dict[str, object] = {"synthetic_pictures": stand_ins.pictures_digest(roots["synthetic"])}
        for tier, root in roots.items():
            tree = os.path.join(tmp, tier)
            for cls, names in LAYOUT.items():
                os.makedirs(os.path.join(tree, cls))
                for n in names:
                    os.symlink(os.path.join(root, n), os.path.join(tree, cls, n))
            result[tier] = {n: conversion_digest(tree, os.path.join(tmp, f"{tier}-{n}"), c)
                            for n, c in sorted(CONFIGS.items())}
    json.dump(result, sys.stdout, indent=1)
    print()
