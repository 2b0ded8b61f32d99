# Conversion image: CPU only. PyAV's wheels carry their own FFmpeg, so no
# system codec packages are needed.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/videoclips
# CPU wheel first, or pip would pull the multi-GB CUDA build for conversion.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.5.1
COPY pyproject.toml README.md FORMAT.md ./
COPY convert ./convert
COPY loaders ./loaders
COPY train ./train
RUN pip install ".[dask]"

# One process per core; OUT must be a mounted volume so a restart resumes.
ENTRYPOINT ["python", "-m", "convert"]
CMD ["--help"]
