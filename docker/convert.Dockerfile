# Conversion image: decoding (PyAV's wheels carry their own FFmpeg), the shard writers and readers,
# verify and inspect. No torch: conversion and verification never import it (tests/test_architecture.py).
# The base is plain Debian, reproducible from Debian's archive alone (scripts/container_check.sh makes it
# with debootstrap); Python is Debian's, in a virtual environment.
FROM debian:bookworm-slim

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    # Any user the service runs as (VIDEOCLIPS_USER) has a home and a name, with or without a passwd entry.
    HOME=/home/videoclips USER=videoclips LOGNAME=videoclips MPLCONFIGDIR=/tmp/matplotlib
# Debian's packages are not version-pinned: the base image's release fixes the versions they come from.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && useradd --uid 1000 --user-group --create-home --home-dir /home/videoclips videoclips \
    && chmod 1777 /home/videoclips
WORKDIR /opt/videoclips
# The dependencies in a layer of their own (before the code: a code change rebuilds only what follows).
COPY pyproject.toml ./
COPY docker/dependencies.py ./docker/
# The requirement list comes from pyproject.toml (its own pins), less torch.
# hadolint ignore=DL3013,SC2046
RUN pip install $(python docker/dependencies.py --extra dask --extra remote --without torch)
# README.md is the package's long description (pyproject.toml). These come after the dependencies, so
# a change to the code, the entry point or the documentation rebuilds only the project's own layers.
COPY README.md FORMAT.md ./
COPY docker/entrypoint.py ./docker/
COPY convert ./convert
COPY loaders ./loaders
COPY train ./train
RUN pip install --no-deps . && python -c "import convert.cli, loaders"

USER 1000:1000
# The entry point checks DATA and OUT, then runs python -m convert with the service's arguments.
ENTRYPOINT ["python", "/opt/videoclips/docker/entrypoint.py", "convert"]
CMD ["--help"]
