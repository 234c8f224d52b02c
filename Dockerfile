# syntax=docker/dockerfile:1
# One image for the service (default) and the trainer:
#   docker run --gpus all -p 8000:8000 bert-serve                 -> serves the bundled model
#   docker run --gpus all -v ckpts:/checkpoints bert-serve train --corpus wikitext-2 --output /checkpoints/m
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, in their own layer: rebuilt only when the pins change. This is the same install
# step as `make serve`; on Linux x86-64, PyPI's torch==2.13.0 is the CUDA build (the host only needs
# the NVIDIA driver and container toolkit).
COPY requirements/serve.txt requirements/serve.txt
RUN python -m pip install -r requirements/serve.txt

# An unprivileged user owns the volume mount points, so named volumes start writable for it.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin bert \
 && mkdir -p /checkpoints /cache \
 && chown bert:bert /checkpoints /cache

COPY model/ model/
COPY trainer/ trainer/
COPY service/ service/
COPY checkpoints/ checkpoints/
COPY docker/entrypoint.sh /usr/local/bin/bert

USER bert
ENV BERT_HOST=0.0.0.0 \
    BERT_PORT=8000 \
    BERT_CACHE_DIR=/cache \
    BERT_DRAIN_SECONDS=2
EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, sys, urllib.request; url = 'http://127.0.0.1:%s/health' % os.environ.get('BERT_PORT', '8000'); sys.exit(0 if urllib.request.urlopen(url, timeout=2).status == 200 else 1)"]

ENTRYPOINT ["bert"]
CMD ["serve"]
