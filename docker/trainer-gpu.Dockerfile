# syntax=docker/dockerfile:1
# atgrpo GPU trainer image: trainer_svc with CUDA torch (PyPI's Linux wheels bundle the CUDA
# runtime, whose version docker/cuda.txt holds, and NCCL; the node's driver comes in through the NVIDIA container toolkit), and
# torchrun for pools trained over several GPUs. Build from the repository root:
#   docker build -f docker/trainer-gpu.Dockerfile -t atgrpo-trainer-gpu:0.1.0 .
# Pin the base by digest for reproducible builds: --build-arg BASE_IMAGE=python:3.11.13-slim-bookworm@sha256:...
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies first, in their own layer (gigabytes): it changes only with pyproject.toml or the pins.
# constraints.txt (the CPU machine's pins) resolves for it too; cuda.txt: the CUDA of the GPU images.
COPY pyproject.toml constraints.txt docker/cuda.txt docker/requirements.py ./
RUN python requirements.py train > requirements.txt \
 && pip install -c constraints.txt -c cuda.txt -r requirements.txt
# Then the package itself (the .dockerignore beside this file admits only its sources).
COPY . .
RUN pip install --no-deps .

FROM ${BASE_IMAGE}
# gcc + libc6-dev: Triton (torch.compile) compiles small launchers at run time.
# tini: PID 1 that forwards SIGTERM to torchrun and the ranks, and reaps them.
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
    ATGRPO_HOST=0.0.0.0 \
    ATGRPO_PORT=50051
USER 10001:10001
WORKDIR /home/atgrpo
EXPOSE 50051 9090
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 CMD ["python", "/usr/local/bin/atgrpo-healthcheck"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["python", "-m", "trainer_svc"]
