#!/usr/bin/env bash
# The wheels a lent GPU needs to serve: the packages embedserve's gateway and replica
# import that the GPU machine's own Python 3.12 lacks (fastapi, uvicorn, pydantic,
# orjson, grpc health and reflection, ...), at the versions this checkout's venv has,
# downloaded for CPython 3.12 on x86-64 into .gpu-carry/wheels (git-ignored). The
# device run carries .gpu-carry and scripts/gpu-run.sh installs it with --no-index.
# numba and llvmlite are not carried (llvmlite alone is ~60 MB): the GPU run's models use
# a tokenizer the `tokenizers` library serves, which compiles no kernel.
#
# Prints what travels: the tree git would send plus .gpu-carry, against the 64 MiB limit.
#   scripts/gpu-wheelhouse.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:-.venv/bin/python}
# Import names -> distributions, the serving layer's and their own requirements.
PACKAGES=(fastapi fastapi-offline starlette pydantic pydantic-core annotated-types typing-inspection
          uvicorn httptools orjson grpcio grpcio-health-checking grpcio-reflection protobuf)
mkdir -p .gpu-carry/wheels
rm -f .gpu-carry/wheels/*.whl
pins=()
for name in "${PACKAGES[@]}"; do
  version=$("$PYTHON" -m pip show "$name" 2>/dev/null | awk '/^Version:/ {print $2}')
  [ -n "$version" ] || { echo "gpu-wheelhouse.sh: $name is not installed in $PYTHON's environment" >&2; exit 2; }
  pins+=("$name==$version")
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .gpu-carry/wheels "${pins[@]}"
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
carry_bytes=$(du -sb .gpu-carry | cut -f1)
total=$((tree_bytes + carry_bytes))
printf 'tree %.1f MiB + .gpu-carry %.1f MiB = %.1f MiB of the 64 MiB a device call carries\n' \
    "$(echo "$tree_bytes / 1048576" | bc -l)" "$(echo "$carry_bytes / 1048576" | bc -l)" "$(echo "$total / 1048576" | bc -l)"
[ "$total" -lt $((64 * 1048576)) ] || { echo "gpu-wheelhouse.sh: over the 64 MiB limit" >&2; exit 1; }
