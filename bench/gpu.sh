#!/usr/bin/env bash
# The benchmark suite on a lent GPU (one H200): the four workloads with GPU sizes,
# embedserve's default (no --dtype), with CUDA graphs on and off, fp32 and bf16 (the
# one the default chose is not run twice), and sentence-transformers on the same device; writes the `suite-gpu` section of BENCHMARKS.md, bench/suite_gpu_*.png
# and bench/out/suite_gpu.json. Bounded to 8 minutes (the suite's time boxes keep it
# near 5); run from the repository root:
#
#     bash bench/gpu.sh                      # PYTHON=... DATA_DIR=... to override
#
# Needs: a Python with this project installed and a CUDA build of torch 2.13.0 (the
# machine has no network, so nothing is installed here), and the reference data
# (XQuAD texts) at $DATA_DIR. Sizes above the model's 512 positions (4096 tokens with
# the default multilingual-e5-small) are reported as n/a, not truncated.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
DATA_DIR=${DATA_DIR:-../shared/data}
DEVICE=${DEVICE:-cuda}
SYSTEMS=${SYSTEMS:-embedserve,embedserve-fp32,embedserve-nographs,embedserve-bf16,sentence-transformers}
LIMIT_S=${LIMIT_S:-480}

"$PYTHON" - <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"bench/gpu.sh: torch {torch.__version__} sees no CUDA device; install the CUDA build")
print(f"bench/gpu.sh: torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
PY
[ -d "$DATA_DIR/eval/xquad" ] || { echo "bench/gpu.sh: no XQuAD texts under $DATA_DIR" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv || true

mkdir -p bench/out
# On timeout the suite gets SIGTERM, which it turns into an exit that stops its servers.
exec timeout --kill-after=20 "$LIMIT_S" "$PYTHON" -m bench suite --profile gpu --device "$DEVICE" \
    --systems "$SYSTEMS" --data-dir "$DATA_DIR" --json bench/out/suite_gpu.json "$@"
