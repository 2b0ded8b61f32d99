# Training image for GPU nodes: the torch, DALI and nvidia-ml-py the tests ran with. No CUDA base image:
# torch 2.13.0 from PyPI is built for CUDA 13.0 and brings its CUDA libraries as wheels, DALI's CUDA 13
# build carries its own, and the NVIDIA Container Toolkit mounts the driver at run time. The host needs an
# NVIDIA driver of the 580 branch or newer (CUDA 13.0's minimum). The base is plain Debian, reproducible
# from Debian's archive alone (scripts/container_check.sh makes it with debootstrap).
FROM debian:bookworm-slim

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    # Any user the service runs as (VIDEOCLIPS_USER) has a home and a name, with or without a passwd entry.
    HOME=/home/videoclips USER=videoclips LOGNAME=videoclips MPLCONFIGDIR=/tmp/matplotlib \
    # NCCL picks the fastest transport itself; these only make failures legible.
    NCCL_DEBUG=WARN TORCH_NCCL_ASYNC_ERROR_HANDLING=1
# gcc and the Python headers: --compile (torch.compile / Triton) builds small C launchers at run time and
# fails without a C compiler. Debian's packages are not version-pinned: the base image's release fixes them.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && useradd --uid 1000 --user-group --create-home --home-dir /home/videoclips videoclips \
    && chmod 1777 /home/videoclips
# One DALI build, the one of torch's CUDA major (13); the project is installed with the matching extra.
RUN pip install torch==2.13.0 nvidia-dali-cuda130==2.4.0 nvidia-ml-py==13.615.71
WORKDIR /opt/videoclips
COPY pyproject.toml ./
COPY docker/dependencies.py ./docker/
# hadolint ignore=DL3013,SC2046
RUN pip install $(python docker/dependencies.py --extra dali-cu13 --extra remote)
# README.md is the package's long description (pyproject.toml). These come after the dependencies, so
# a change to the code, the entry point or the documentation rebuilds only the project's own layers.
COPY README.md FORMAT.md ./
COPY docker/entrypoint.py ./docker/
COPY convert ./convert
COPY loaders ./loaders
COPY train ./train
COPY scripts ./scripts
RUN pip install --no-deps . && python -c "import train.main, loaders.dali, nvidia.dali"

USER 1000:1000
# The entry point checks OUT, the rendezvous and the GPUs, then runs torchrun ... -m train in its own process.
ENTRYPOINT ["python", "/opt/videoclips/docker/entrypoint.py", "train"]
CMD ["--help"]
