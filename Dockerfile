# counterfactory in two images, built from this file (README "Docker"):
#
#   docker/build.sh cpu [--smoke]                       # the CPU image, as CI builds and runs it
#   docker build --target cpu  -t counterfactory:cpu  .   # the same with a pulled python base
#   docker build --target cuda -t counterfactory:cuda .   # qwen on an NVIDIA GPU
#
# Both install exactly the versions CI tested (docker/constraints.txt, from
# docker/freeze_constraints.py), run as the non-root user `app` (uid 10001), carry the bundled
# offline models (assets/models: MediaPipe, SFace) inside the package, and keep the
# ledger, the image store, the releases and Prefect's home on the /data volume. Prefect's UI is off
# (PREFECT_UI_ENABLED=false): a run serves Prefect's API for itself, and the UI's bundle would be
# unpacked into the read-only venv (the smoke run logged two "Permission denied" errors for it).
# Qwen-Image-Edit's weights (~60 GB) are not baked in: mount a Hugging Face cache.
#
# No `# syntax=` line: the Dockerfile frontend built into the daemon is used, so nothing is
# pulled from a registry but the base images (BuildKit is needed for the build secret below).
# pip gets a CA bundle, when the build is given one, as the secret `pip_cert`
# (`--secret id=pip_cert,src=/etc/ssl/certs/ca-certificates.crt`): mounted for the install
# only, never written to a layer. PIP_INDEX_URL / PIP_EXTRA_INDEX_URL pick a mirror.

# CI runs Python 3.11; the images use the same minor release. The base is a build argument:
# docker/build.sh passes Debian bookworm bootstrapped with debootstrap (Python 3.11 in /usr),
# where no registry can be reached. bookworm, not python:3.11-slim's current Debian, because the
# cpu stage installs bookworm's package names (libglib2.0-0).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# torch 2.13.0's Linux wheels on PyPI are built for CUDA 13.0 (cuda-toolkit 13.0.3, cuDNN 9 for
# CUDA 13) and bring those libraries as pip packages; the base supplies the matching CUDA
# runtime environment for the NVIDIA container toolkit. Change both together.
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-base-ubuntu24.04

# ---------------------------------------------------------------- build: a venv per target
FROM ${PYTHON_IMAGE} AS build
ARG PIP_INDEX_URL=
ARG PIP_EXTRA_INDEX_URL=
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 \
    PIP_INDEX_URL=${PIP_INDEX_URL} PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL}
WORKDIR /src
COPY docker/constraints.txt docker/requirements.py /src/docker/
COPY pyproject.toml /src/

FROM build AS build-cpu
# classical (core) and fal (remote) editors; the review queue; Hub export; PostgreSQL ledgers;
# Ray workers. The dependencies first (from pyproject.toml alone: a code change reuses the layer).
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && python3 -m venv /opt/venv \
    && python3 docker/requirements.py remote,review,hub,postgres,ray \
        | /opt/venv/bin/pip install -c docker/constraints.txt -r /dev/stdin
COPY README.md /src/
COPY counterfactory /src/counterfactory
COPY flows /src/flows
COPY generation /src/generation
COPY validation /src/validation
COPY manifests /src/manifests
COPY assets /src/assets
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && /opt/venv/bin/pip install --no-deps -c docker/constraints.txt '.[remote,review,hub,postgres,ray]' \
    && /opt/venv/bin/pip check

FROM build AS build-cuda
# the qwen editor (torch, diffusers) besides everything the CPU image has
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && python3 -m venv /opt/venv \
    && python3 docker/requirements.py gpu,remote,review,hub,postgres,ray \
        | /opt/venv/bin/pip install -c docker/constraints.txt -r /dev/stdin
COPY README.md /src/
COPY counterfactory /src/counterfactory
COPY flows /src/flows
COPY generation /src/generation
COPY validation /src/validation
COPY manifests /src/manifests
COPY assets /src/assets
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && /opt/venv/bin/pip install --no-deps -c docker/constraints.txt '.[gpu,remote,review,hub,postgres,ray]' \
    && /opt/venv/bin/pip check

# ---------------------------------------------------------------- cpu: classical and fal
FROM ${PYTHON_IMAGE} AS cpu
# opencv-contrib-python (MediaPipe's OpenCV) loads libGL and GLib at import; MediaPipe's task
# library links EGL and GLES (libEGL.so.1) even on the CPU
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgl1 libglib2.0-0 libegl1 libgles2 \
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
    PREFECT_UI_ENABLED=false \
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
        libgl1 libglib2.0-0t64 libegl1 libgles2 \
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
    PREFECT_UI_ENABLED=false \
    MPLCONFIGDIR=/tmp/matplotlib \
    HF_HOME=/home/app/.cache/huggingface \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER app
WORKDIR /data
VOLUME ["/data"]
ENTRYPOINT ["counterfactory"]
CMD ["--help"]
