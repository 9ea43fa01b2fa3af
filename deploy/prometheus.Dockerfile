# Prometheus for the compose cluster, built from Debian's package on a local
# base image, for machines that cannot pull prom/prometheus from Docker Hub:
#
#   docker build --network host -f deploy/prometheus.Dockerfile \
#       --build-arg BASE_IMAGE=embedserve-base:bookworm -t embedserve-prometheus:local deploy
#   PROMETHEUS_IMAGE=embedserve-prometheus:local docker compose -f deploy/docker-compose.yml up
#
# scripts/build-local-images.sh does both images. Same contract as the
# official image where compose relies on it: the entrypoint is the
# prometheus binary, the command takes the flags, it runs as nobody (65534), and the
# web UI and API listen on 9090.

ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The version is whatever the base image's Debian release ships (2.42 in
# bookworm): pinning a Debian revision here would break on the next point
# release of the mirror.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /prometheus \
 && chown nobody:nogroup /prometheus
USER 65534:65534
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
