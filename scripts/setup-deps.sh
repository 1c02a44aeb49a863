#!/bin/sh
# Installs every Debian package datahelix needs to build, test and demo.
# The Python package (python/datahelix) needs the CPython headers to build
# and python3-torch to run and test (python3-torchaudio: the reference the
# mel features are tested against).  `setup-deps.sh bench` adds what the
# peer benchmarks need besides (torchvision; Dask and matplotlib for
# `make bench-live`).  patchelf: `make bundle` (docs/bundle.md); shellcheck,
# yamllint, python3-yaml: the deploy/ recipes' checks (docs/deploy.md);
# slurm-wlm, munge: a real one-node Slurm that test_slurm.py starts.
# nginx-light, openssl: the HTTP(S) server test_http_source.py starts;
# s3rver (npm, into .deps/ of the checkout, on the machine's Node.js or
# Debian's) and python3-botocore: the S3 server and its SigV4-checking
# front that test_s3_source.py starts.
# Idempotent: exits at once when everything is already installed, so that
# `make demo` / `make test` / `make bench-*` can call it on every run.
set -eu

PKGS="build-essential cmake pkg-config git
libavformat-dev libavcodec-dev libavutil-dev libswscale-dev libswresample-dev ffmpeg
libzmq3-dev libsodium-dev libprotobuf-c-dev protobuf-c-compiler
libjansson-dev libcmocka-dev python3-pytest python3-av python3-numpy python3-torchaudio
python3-cloudpickle
clang libclang-rt-dev clang-format python3-dev python3-torch iproute2
python3-pip python3-setuptools python3-venv dpkg-dev python3-matplotlib
patchelf shellcheck yamllint python3-yaml
libmicrohttpd-dev python3-prometheus-client tmux
libcurl4-openssl-dev nginx-light openssl python3-botocore
slurm-wlm munge"
if [ "${1:-}" = bench ]; then
    PKGS="$PKGS python3-torchvision python3-distributed"
fi

# s3rver for the S3 tests: npm, into .deps/ beside this script's checkout.
S3RVER_VERSION=3.7.1
DEPS="$(cd "$(dirname "$0")/.." && pwd)/.deps"
need_s3rver() {
    [ -x "$DEPS/node_modules/.bin/s3rver" ] &&
        grep -q "\"version\": \"$S3RVER_VERSION\"" \
            "$DEPS/node_modules/s3rver/package.json" 2>/dev/null && return 1
    return 0
}
install_s3rver() {
    need_s3rver || return 0
    echo "setup-deps: installing s3rver $S3RVER_VERSION into $DEPS" >&2
    mkdir -p "$DEPS"
    npm install --prefix "$DEPS" --no-audit --no-fund --loglevel=error \
        "s3rver@$S3RVER_VERSION" >&2
}

missing=""
command -v npm >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
if [ -z "$missing" ]; then
    install_s3rver
    exit 0
fi

echo "setup-deps: installing:$missing" >&2
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
        echo "setup-deps: need root or sudo to install:$missing" >&2; exit 1; }
    SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
install_s3rver
echo "setup-deps: done" >&2
