# Training image for GPU nodes: CUDA PyTorch plus NVIDIA DALI for the GPU loader.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    # NCCL picks the fastest transport itself; these only make failures legible.
    NCCL_DEBUG=WARN TORCH_NCCL_ASYNC_ERROR_HANDLING=1
WORKDIR /opt/videoclips
COPY pyproject.toml README.md FORMAT.md ./
COPY convert ./convert
COPY loaders ./loaders
COPY train ./train
COPY scripts ./scripts
RUN pip install ".[dali]"

# torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; one process per GPU.
ENTRYPOINT ["torchrun", "--nproc_per_node=gpu", "-m", "train"]
CMD ["--help"]
