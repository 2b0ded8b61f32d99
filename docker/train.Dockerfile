# Training image for GPU nodes: the torch and DALI the tests ran with (torch 2.13.0, DALI 2.4.0).
# `pip install torch==2.13.0` brings torch built for CUDA 13.0 (its CUDA libraries come as wheels),
# so DALI is its CUDA 13 build and the base is NVIDIA's CUDA 13.0 runtime image. The host needs an
# NVIDIA driver of the 580 branch or newer (CUDA 13.0's minimum) and the NVIDIA container toolkit.
FROM nvidia/cuda:13.0.3-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    # NCCL picks the fastest transport itself; these only make failures legible.
    NCCL_DEBUG=WARN TORCH_NCCL_ASYNC_ERROR_HANDLING=1
# build-essential and the Python headers: --compile (torch.compile / Triton) builds small C
# launchers at run time and fails without a C compiler. Ubuntu's packages are not version-pinned:
# the base image's tag fixes the release they come from.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
RUN pip install torch==2.13.0 nvidia-dali-cuda130==2.4.0 nvidia-ml-py==13.615.71
WORKDIR /opt/videoclips
COPY pyproject.toml README.md FORMAT.md ./
COPY convert ./convert
COPY loaders ./loaders
COPY train ./train
COPY scripts ./scripts
RUN pip install "./[dali]"

# torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; one process per GPU.
ENTRYPOINT ["torchrun", "--nproc_per_node=gpu", "-m", "train"]
CMD ["--help"]
