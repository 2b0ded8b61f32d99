# Conversion image: CPU only. PyAV's wheels carry their own FFmpeg, so no
# system codec packages are needed.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/videoclips
# The torch the tests ran with, as its CPU wheel: from PyPI pip would pull the CUDA build (GBs of
# CUDA libraries) that conversion never uses.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY pyproject.toml README.md FORMAT.md ./
COPY convert ./convert
COPY loaders ./loaders
COPY train ./train
RUN pip install "./[dask]"

# One process per core; OUT must be a mounted volume so a restart resumes.
ENTRYPOINT ["python", "-m", "convert"]
CMD ["--help"]
