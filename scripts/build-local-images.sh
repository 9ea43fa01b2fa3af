#!/usr/bin/env bash
# Build the two third-party images the compose cluster needs without Docker
# Hub, from a Debian package mirror only:
#
#   embedserve-base:bookworm     PYTHON_IMAGE for deploy/Dockerfile: a minbase
#                                Debian rootfs (debootstrap) with python3,
#                                venv, pip, python -> python3, CA certificates
#   embedserve-prometheus:local  PROMETHEUS_IMAGE: Debian's prometheus package
#                                on that base (deploy/prometheus.Dockerfile)
#
# Usage (as root: debootstrap needs it):
#   scripts/build-local-images.sh [--force]
# Then:
#   export PYTHON_IMAGE=embedserve-base:bookworm PROMETHEUS_IMAGE=embedserve-prometheus:local
#
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian),
# BASE_IMAGE / PROMETHEUS_IMAGE (the tags to build). An image that already
# exists is kept unless --force is given. Needs debootstrap and a running
# Docker engine.
set -euo pipefail

mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
base_image=${BASE_IMAGE:-embedserve-base:bookworm}
prometheus_image=${PROMETHEUS_IMAGE:-embedserve-prometheus:local}
force=0
[[ "${1:-}" == "--force" ]] && force=1
deploy_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../deploy" && pwd)"

have_image() { [[ $force == 0 ]] && docker image inspect "$1" > /dev/null 2>&1; }

if have_image "$base_image"; then
    echo "kept $base_image"
else
    rootfs=$(mktemp -d)
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase \
        --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
        bookworm "$rootfs" "$mirror"
    # The package cache and lists are build-time only; apt-get update refills them.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["python"]' - "$base_image"
    echo "built $base_image"
fi

if have_image "$prometheus_image"; then
    echo "kept $prometheus_image"
else
    # --network host: apt reaches the mirror the way this machine does.
    docker build --network host -f "$deploy_dir/prometheus.Dockerfile" \
        --build-arg BASE_IMAGE="$base_image" -t "$prometheus_image" "$deploy_dir"
    echo "built $prometheus_image"
fi
