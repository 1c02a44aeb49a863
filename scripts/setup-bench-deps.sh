#!/bin/sh
# Installs the Debian packages the peer benchmarks need on top of
# scripts/setup-deps.sh: PyAV and torchvision (which pulls python3-torch,
# a large download, hence a separate group that `make test` never pays).
# Idempotent: exits at once when everything is already installed, so that
# `make bench-decode` can call it on every run.
set -eu

PKGS="ffmpeg python3-av python3-torchvision"

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

echo "setup-bench-deps: installing:$missing" >&2
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
        echo "setup-bench-deps: need root or sudo to install:$missing" >&2; exit 1; }
    SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "setup-bench-deps: done" >&2
