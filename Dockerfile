# One image for the service (default), the trainer and the corpus job, in two variants built from locks:
#   docker build -t bert-serve:0.1.0 .                               CUDA (GPU hosts; also runs on CPU)
#   docker build --build-arg VARIANT=cpu -t bert-serve:0.1.0-cpu .   CPU only: PyTorch's CPU wheel, a fraction of the size
#   docker run --gpus all -p 8000:8000 bert-serve:0.1.0             -> serves the bundled model
#   docker run -v ckpts:/checkpoints bert-serve:0.1.0-cpu train --corpus wikitext-2 --output /checkpoints/m
#   docker run -v cache:/cache -e HF_TOKEN -p 8000:8000 bert-serve:0.1.0-cpu serve --checkpoint org/name   (a Hub id)
#   docker run -v data:/data bert-serve:0.1.0-cpu corpus embed /data/docs.jsonl --output /data/vectors
# Either variant with Ray for `corpus embed --ray` and as a Ray cluster's node (the service never needs it; on the
# CPU image it adds 0.32 GB to 1.80 GB, docs/deployment.md):
#   docker build --build-arg VARIANT=cpu --build-arg RAY=1 -t bert-serve:0.1.0-cpu-ray .
# The locks: requirements/image-cuda.txt (everything the CUDA image installs, NVIDIA libraries included, for
# Linux x86-64), requirements/serve.txt (everything the CPU image installs; torch from PyTorch's CPU index) and, with
# RAY=1, requirements/ray.txt's own pins on top.
# The C kernels (kernels/c/*.c: int8 products, whole int8 layers, attention in float32 and bfloat16 for AVX-512 CPUs;
# int8 products for AVX2 ones) are built in a stage of their own, which has a compiler, and copied into the image, which
# has none. kernels/build.py builds them with the standard library alone; where a CPU lacks their features the service
# uses torch's kernels instead.
FROM python:3.11.11-slim-bookworm AS kernels
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY kernels/__init__.py kernels/build.py kernels/
COPY kernels/c/ kernels/c/
RUN BERT_KERNEL_DIR=/opt/kernels python -S -m kernels.build

FROM python:3.11.11-slim-bookworm

ARG VARIANT=cuda
ARG RAY=0
# Where the CPU build of torch comes from. Builds on machines without that index reach pip's own
# configuration instead (PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS as build arguments).
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_TRUSTED_HOST

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

WORKDIR /app

# Dependencies first, in their own layer (rebuilt only when a lock changes), in a virtual environment
# that holds exactly the lock: `pip freeze` there equals it.
COPY requirements/serve.txt requirements/image-cuda.txt requirements/ray.txt requirements/
RUN python -m venv /opt/venv \
 && case "$VARIANT" in \
      cuda) pip install --no-deps -r requirements/image-cuda.txt ;; \
      cpu) pip install --no-deps ${TORCH_CPU_INDEX:+--extra-index-url "$TORCH_CPU_INDEX"} \
             -r requirements/serve.txt "torch==$(sed -n 's/^torch==//p' requirements/serve.txt)+cpu" ;; \
      *) echo "VARIANT must be cuda or cpu, not $VARIANT" >&2; exit 2 ;; \
    esac \
 && case "$RAY" in \
      1) sed '/^-r /d' requirements/ray.txt > /tmp/ray-pins.txt \
         && pip install --no-deps -r /tmp/ray-pins.txt && rm /tmp/ray-pins.txt ;; \
      0) ;; \
      *) echo "RAY must be 0 or 1, not $RAY" >&2; exit 2 ;; \
    esac \
 && pip check

# An unprivileged user owns the volume mount points, so named volumes start writable for it.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin bert \
 && mkdir -p /checkpoints /cache \
 && chown bert:bert /checkpoints /cache

COPY model/ model/
COPY kernels/ kernels/
COPY --from=kernels /opt/kernels/ /opt/kernels/
COPY trainer/ trainer/
COPY service/ service/
COPY corpus/ corpus/
COPY checkpoints/ checkpoints/
COPY docker/entrypoint.sh /usr/local/bin/bert

USER bert
ENV BERT_HOST=0.0.0.0 \
    BERT_PORT=8000 \
    BERT_CACHE_DIR=/cache \
    NUMBA_CACHE_DIR=/cache/numba \
    BERT_KERNEL_DIR=/opt/kernels \
    HF_HOME=/cache/huggingface \
    HF_HUB_DISABLE_TELEMETRY=1 \
    BERT_DRAIN_SECONDS=2 \
    BERT_IMAGE_VARIANT=$VARIANT
EXPOSE 8000
# gRPC (tei.v1) when BERT_GRPC_PORT sets this port (docs/grpc.md); compose and the Helm chart do
EXPOSE 50051

HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 CMD ["bert", "health"]

ENTRYPOINT ["bert"]
CMD ["serve"]
