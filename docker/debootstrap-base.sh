#!/usr/bin/env bash
# Make a base image without an image registry: debootstrap a minimal Debian (Python 3 with venv)
# from Debian's package archive and `docker import` it. `make test-docker` builds the images on it;
# on a machine that can pull images the Dockerfile's default bases are used instead.
#   docker/debootstrap-base.sh TAG [SUITE]     e.g. docker/debootstrap-base.sh pvpo-base:bookworm
# SUITE (default bookworm) must ship the python3 minor version the wheelhouse was built for.
set -euo pipefail
TAG="${1:?usage: docker/debootstrap-base.sh TAG [SUITE]}"
SUITE="${2:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 2; }

ROOTFS="$(mktemp -d "${TMPDIR:-/var/tmp}/pvpo-rootfs.XXXXXX")"
trap 'rm -rf "$ROOTFS"' EXIT
echo "debootstrap $SUITE from $MIRROR into $ROOTFS"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
    || { tail -20 "$ROOTFS.log" >&2; rm -f "$ROOTFS.log"; echo "debootstrap $SUITE failed (log above)" >&2; exit 1; }
rm -f "$ROOTFS.log"
# apt's downloaded packages and lists are not needed at run time
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/*
tar --numeric-owner -C "$ROOTFS" -c . | docker import --change 'CMD ["/bin/bash"]' - "$TAG" >/dev/null
echo "imported $TAG: $(docker run --rm --network none "$TAG" python3 --version)"
