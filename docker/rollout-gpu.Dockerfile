# syntax=docker/dockerfile:1
# atgrpo GPU rollout image: rollout_svc with vLLM and CUDA torch (both from PyPI: torch's Linux
# wheels bundle the CUDA runtime, whose version docker/cuda.txt holds, so the base needs no CUDA;
# the node's driver comes in through the NVIDIA container toolkit). Build from the repository root:
#   docker build -f docker/rollout-gpu.Dockerfile -t atgrpo-rollout-gpu:0.1.0 .
# Pin the base by digest for reproducible builds: --build-arg BASE_IMAGE=python:3.11.13-slim-bookworm@sha256:...
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies first, in their own layer (gigabytes): it changes only with pyproject.toml or the pins.
# Its own pins: vLLM's requirements cannot share constraints.txt (mistral_common[image] needs
# numpy<2.4); `make lock-images` writes them. cuda.txt: the CUDA of the GPU images.
COPY pyproject.toml docker/constraints-rollout-gpu.txt docker/cuda.txt docker/requirements.py ./
RUN python requirements.py train vllm > requirements.txt \
 && pip install -c constraints-rollout-gpu.txt -c cuda.txt -r requirements.txt
# Then the package itself (the .dockerignore beside this file admits only its sources).
COPY . .
RUN pip install --no-deps .

FROM ${BASE_IMAGE}
# gcc + libc6-dev: Triton (under vLLM and torch.compile) compiles small launchers at run time.
# tini: PID 1 that forwards signals and reaps vLLM's engine processes.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 atgrpo \
 && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin atgrpo
COPY --from=build /opt/venv /opt/venv
COPY docker/healthcheck.py /usr/local/bin/atgrpo-healthcheck
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    HF_HUB_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 \
    ATGRPO_HOST=0.0.0.0 \
    ATGRPO_PORT=50051
USER 10001:10001
WORKDIR /home/atgrpo
EXPOSE 50051 9090
# The gRPC health service (grpc.health.v1) answers once the model is loaded: allow minutes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 CMD ["python", "/usr/local/bin/atgrpo-healthcheck"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["python", "-m", "rollout_svc", "--engine", "vllm", "--device", "cuda"]
