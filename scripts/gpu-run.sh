#!/usr/bin/env bash
# The one command a lent GPU runs: tests/gpu, then the four workloads (python -m bench gpu),
# then one `embedserve serve --device cuda` answering HTTP. Everything it measures goes
# under $OUT as it goes (env.txt, pytest's junit and log, gpu.jsonl, serve.jsonl), so a
# run cut short by its time limit still returns what it did.
#
# It needs nothing outside the tree and what `scripts/gpu-wheelhouse.sh` carries
# (.gpu-carry/wheels: the serving packages the GPU machine's Python lacks): the project
# is imported through PYTHONPATH, never pip-installed, and works on that machine's torch
# (2.11) as on 2.13. Models are written on the machine from configs (bench/gpu/models.py).
#
#   scripts/gpu-run.sh                          # on the GPU machine, OUT set by the device tool
#   scripts/gpu-run.sh --device cpu --dry-run   # here: every step at tiny sizes on the CPU
#
# Phases are time-boxed (TESTS_S, BENCH_S, SERVE_S seconds) to fit a 15-minute loan with
# room for one rerun; MODELS picks the bench's models. Exit status: 1 if any phase failed.
set -uo pipefail
cd "$(dirname "$0")/.."

DEVICE=cuda
DRY=()
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --dry-run) DRY=(--dry-run); shift ;;
    *) echo "gpu-run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-bench/out/gpu-run}
PYTHON=${PYTHON:-python3}
TESTS_S=${TESTS_S:-150}
BENCH_S=${BENCH_S:-200}
SERVE_S=${SERVE_S:-90}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 EMBEDSERVE_GPU_OUT="$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

if compgen -G ".gpu-carry/wheels/*.whl" > /dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/embedserve-site .gpu-carry/wheels/*.whl > "$OUT/wheels.log" 2>&1 \
    && export PYTHONPATH="$PYTHONPATH:/tmp/embedserve-site" \
    || echo "gpu-run.sh: the wheelhouse did not install (wheels.log); serving is skipped" >&2
fi

{
  date -u +%FT%TZ; uname -a; "$PYTHON" --version
  "$PYTHON" - <<'PY'
import importlib
for name in ("torch", "transformers", "sentence_transformers", "tokenizers", "numba", "grpc", "google.protobuf",
             "fastapi", "uvicorn", "pydantic", "orjson", "httpx", "pyarrow"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"), getattr(module, "__file__", ""))
    except Exception as error:
        print(name, "MISSING", type(error).__name__, error)
import torch
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")
PY
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
status=0

echo "== tests/gpu"
timeout -k 10 "$TESTS_S" "$PYTHON" -m pytest tests/gpu --confcutdir=tests/gpu -o addopts="" -p no:cacheprovider \
    -q -rs --junitxml="$OUT/junit.xml" 2>&1 | tee "$OUT/pytest.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== bench gpu"
BENCH_MODELS=()
[ -n "${MODELS:-}" ] && BENCH_MODELS=(--models "$MODELS")
timeout -k 10 $((BENCH_S + 60)) "$PYTHON" -m bench gpu --device "$DEVICE" "${DRY[@]}" --out "$OUT" \
    --budget-s "$BENCH_S" "${BENCH_MODELS[@]}" > "$OUT/bench.log" 2>&1 || { status=1; tail -20 "$OUT/bench.log"; }
echo "$(grep -c . "$OUT/gpu.jsonl" 2>/dev/null || echo 0) result lines in $OUT/gpu.jsonl"

echo "== serve"
timeout -k 10 "$SERVE_S" "$PYTHON" -m bench.gpu.serve_check --device "$DEVICE" "${DRY[@]}" --out "$OUT" \
    > "$OUT/serve.log" 2>&1 || { status=1; tail -20 "$OUT/serve.log"; }
exit $status
