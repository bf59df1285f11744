# GPU batch image: Qwen-Image-Edit generation, gates and release in one container.
#   docker build -t counterfactory .
#   docker run --gpus all -v $PWD/data:/data -v $HOME/.cache/huggingface:/root/.cache/huggingface \
#       counterfactory run /data/focus.yaml --out /data/out
# Model weights are not baked in: mount the Hugging Face cache (or set editor.qwen.download: true).
FROM pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    PREFECT_HOME=/data/.prefect

RUN apt-get update \
    && apt-get install -y --no-install-recommends libgl1 libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/counterfactory
COPY pyproject.toml README.md ./
COPY counterfactory ./counterfactory
COPY flows ./flows
COPY generation ./generation
COPY validation ./validation
COPY manifests ./manifests
COPY assets ./assets
# torch comes from the base image; pip keeps it because the extras ask only for torch>=2.4
RUN pip install --no-cache-dir '.[gpu,remote,sam,insightface,postgres]'

WORKDIR /data
ENTRYPOINT ["counterfactory"]
CMD ["--help"]
