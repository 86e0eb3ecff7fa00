#!/usr/bin/env bash
# What `make test` needs on the host for the viewer's browser tests (tests/test_viewer_browser.py):
# headless Chromium, from Debian's archive when missing. Installs it as root (CI runs as root, so
# the tests run there rather than skip); without root it says how and leaves the tests to skip.
# Does nothing when chromium (or chromium-headless-shell) is there.
set -euo pipefail
for exe in chromium chromium-headless-shell chromium-browser; do
    command -v "$exe" >/dev/null && exit 0
done
if [ "$(id -u)" != 0 ]; then
    echo "chromium is missing: the viewer's browser tests will skip (apt-get install chromium, or run make as root)" >&2
    exit 0
fi
command -v apt-get >/dev/null || { echo "chromium is missing and there is no apt-get: install chromium by hand" >&2; exit 2; }
echo "installing chromium from the Debian archive (the viewer's browser tests)"
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
command -v chromium >/dev/null
