#!/usr/bin/env bash
# One command: build the image, start the compose cluster, check it end to
# end, tear it down (scripts/compose_smoke.py says what is checked).
#
#   scripts/compose-smoke.sh [--no-cache] [--report PATH] [--keep] [--torch-wheel WHL] [--pip-mirror DIR]
#
# Offline, on a machine with only a Debian mirror and a PyPI proxy:
#   scripts/build-local-images.sh
#   PYTHON_IMAGE=embedserve-base:bookworm PROMETHEUS_IMAGE=embedserve-prometheus:local \
#   PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
#       scripts/compose-smoke.sh --torch-wheel /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl \
#                                --pip-mirror /opt/pypi
#
# PYTHON: the interpreter to run it with (needs numpy and
# sentence-transformers); default the repo's .venv, else python3.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python=${PYTHON:-}
if [[ -z "$python" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
exec "$python" "$repo/scripts/compose_smoke.py" "$@"
