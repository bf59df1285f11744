# syntax=docker/dockerfile:1.7
# counterfactory in two images, built from this file (README "Docker"):
#
#   docker build --target cpu  -t counterfactory:cpu  .   # classical and fal editors
#   docker build --target cuda -t counterfactory:cuda .   # qwen on an NVIDIA GPU
#
# Both install exactly the versions CI tested (docker/constraints.txt, from
# docker/freeze_constraints.py), run as the non-root user `app` (uid 10001), carry the bundled
# offline models (assets/models: MediaPipe, SFace) inside the package, and keep the
# ledger, the image store, the releases and Prefect's home on the /data volume.
# Qwen-Image-Edit's weights (~60 GB) are not baked in: mount a Hugging Face cache.

# CI runs Python 3.11; the images use the same minor release.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# torch 2.13.0's Linux wheels on PyPI are built for CUDA 13.0 (cuda-toolkit 13.0.3, cuDNN 9 for
# CUDA 13) and bring those libraries as pip packages; the base supplies the matching CUDA
# runtime environment for the NVIDIA container toolkit. Change both together.
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-base-ubuntu24.04

# ---------------------------------------------------------------- build: a venv per target
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY docker/constraints.txt /src/docker/constraints.txt
COPY pyproject.toml README.md /src/
COPY counterfactory /src/counterfactory
COPY flows /src/flows
COPY generation /src/generation
COPY validation /src/validation
COPY manifests /src/manifests
COPY assets /src/assets

FROM build AS build-cpu
# classical (core) and fal (remote) editors; PostgreSQL ledgers; Ray workers
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install -c docker/constraints.txt '.[remote,postgres,ray]' \
    && /opt/venv/bin/pip check

FROM build AS build-cuda
# the qwen editor (torch, diffusers) besides everything the CPU image has
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install -c docker/constraints.txt '.[gpu,remote,postgres,ray]' \
    && /opt/venv/bin/pip check

# ---------------------------------------------------------------- cpu: classical and fal
FROM ${PYTHON_IMAGE} AS cpu
# opencv-contrib-python (MediaPipe's OpenCV) loads libGL and GLib at import
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgl1 libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin app \
    && mkdir -p /data /opt/counterfactory \
    && chown app:app /data
COPY --from=build-cpu /opt/venv /opt/venv
# the bundled specs, photos and models at a short path: /opt/counterfactory/assets/specs/demo-face.yaml
RUN ln -s "$(/opt/venv/bin/python -c 'import counterfactory.assets, pathlib; print(pathlib.Path(counterfactory.assets.__file__).parent)')" \
        /opt/counterfactory/assets \
    && /opt/venv/bin/counterfactory --help >/dev/null
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PREFECT_HOME=/data/.prefect \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    MPLCONFIGDIR=/tmp/matplotlib
USER app
WORKDIR /data
VOLUME ["/data"]
ENTRYPOINT ["counterfactory"]
CMD ["--help"]

# ---------------------------------------------------------------- cuda: qwen on a GPU
FROM ${PYTHON_IMAGE} AS python
FROM ${CUDA_IMAGE} AS cuda
# The CUDA base is Ubuntu 24.04, whose Python is 3.12: the official 3.11 build is copied from the
# Python image (Debian bookworm, glibc 2.36 <= Ubuntu 24.04's 2.39) with the shared libraries its
# modules link (the list the official image keeps), so the venv built above runs unchanged.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates netbase tzdata libssl3t64 libffi8 libsqlite3-0 libbz2-1.0 liblzma5 zlib1g \
        libexpat1 libuuid1 libreadline8t64 libncursesw6 libgdbm6t64 libdb5.3t64 \
        libgl1 libglib2.0-0t64 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin app \
    && mkdir -p /data /opt/counterfactory \
    && chown app:app /data
COPY --from=python /usr/local /usr/local
COPY --from=build-cuda /opt/venv /opt/venv
RUN ldconfig \
    && /usr/local/bin/python3.11 -c "import ssl, sqlite3, ctypes, lzma, bz2, zlib, uuid, readline, pyexpat" \
    && ln -s "$(/opt/venv/bin/python -c 'import counterfactory.assets, pathlib; print(pathlib.Path(counterfactory.assets.__file__).parent)')" \
        /opt/counterfactory/assets \
    && /opt/venv/bin/python -c "import torch, diffusers; assert torch.version.cuda, 'torch is a CPU build'" \
    && /opt/venv/bin/counterfactory --help >/dev/null
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PREFECT_HOME=/data/.prefect \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    MPLCONFIGDIR=/tmp/matplotlib \
    HF_HOME=/home/app/.cache/huggingface \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER app
WORKDIR /data
VOLUME ["/data"]
ENTRYPOINT ["counterfactory"]
CMD ["--help"]
