#!/usr/bin/env bash
# What `make test-docker` needs on the host, from Debian's archive when missing: the Docker daemon
# (docker.io: dockerd, containerd, runc and a client), Compose 1.29 (docker-compose) and debootstrap
# (the registry-free base image). Needs root; does nothing when all three are there.
set -euo pipefail
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
[ ${#need[@]} -gt 0 ] || exit 0
[ "$(id -u)" = 0 ] || { echo "missing ${need[*]}: install them (apt-get install ${need[*]}) or run as root" >&2; exit 2; }
echo "installing ${need[*]} from the Debian archive"
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
