"""docker/: the compose file validates against the official schema and points at real files.

No Docker engine runs here, so the images are checked statically: every path
a Dockerfile copies exists, and every command a service runs resolves to a
module or script of this project.
"""

from __future__ import annotations

import importlib.util
import os
import re

import pytest

from .conftest import ROOT

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = os.path.join(ROOT, "..", "shared", "schemas", "compose-spec.json")
COMPOSE = os.path.join(ROOT, "docker", "docker-compose.yml")


@pytest.fixture(scope="module")
def compose() -> dict:
    with open(COMPOSE) as fh:
        return yaml.safe_load(fh)


def test_compose_file_matches_the_compose_spec(compose):
    import json

    if not os.path.exists(SCHEMA):
        pytest.skip("compose schema not in ../shared")
    with open(SCHEMA) as fh:
        schema = json.load(fh)
    jsonschema.Draft7Validator(schema).validate(compose)
    assert set(compose["services"]) == {"convert", "convert-val", "train", "device-check"}
    gpu = compose["services"]["train"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"] and gpu["driver"] == "nvidia"


def _dockerfile(name: str) -> str:
    with open(os.path.join(ROOT, "docker", name)) as fh:
        return fh.read()


@pytest.mark.parametrize("name", ["convert.Dockerfile", "train.Dockerfile"])
def test_dockerfile_copies_only_what_exists(name):
    text = _dockerfile(name)
    copies = re.findall(r"^COPY\s+(.+?)\s+\S+\s*$", text, flags=re.M)
    assert copies, name
    for line in copies:
        for src in line.split():
            assert os.path.exists(os.path.join(ROOT, src)), f"{name}: COPY {src} does not exist"
    assert re.search(r"^ENTRYPOINT", text, flags=re.M)


def test_services_build_from_existing_dockerfiles_and_run_project_code(compose):
    for svc in ("convert", "train"):
        build = compose["services"][svc]["build"]
        context = os.path.normpath(os.path.join(ROOT, "docker", build["context"]))
        assert context == ROOT
        assert os.path.exists(os.path.join(context, build["dockerfile"]))
    assert "-m\", \"convert\"" in _dockerfile("convert.Dockerfile")
    for module in ("convert", "train"):
        assert importlib.util.find_spec(module) is not None
    entry = compose["services"]["device-check"]["entrypoint"]
    assert os.path.exists(os.path.join(ROOT, entry[1]))
    # Training arguments in the compose file must be options the trainer accepts.
    from train.args import build_parser

    parser = build_parser()
    known = {opt for action in parser._actions for opt in action.option_strings}
    for arg in compose["services"]["train"]["command"]:
        assert arg.split("=")[0] in known, arg
