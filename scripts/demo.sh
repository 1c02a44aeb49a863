#!/bin/sh
# `make demo`: `datahelix demo` from the source tree (python/datahelix/
# _demo.py): a mixed video set with captions, probed, then a short 4-rank
# torchrun training job on CPU fed by torch's DataLoader (PyAV) and by
# datahelix.DataLoader in turn; prints the side-by-side table and writes
# DIR/demo.png (per-rank input wait and step time) and DIR/demo.json.
#   DEMO_DIR (default demo-data), DEMO_COUNT (clips, default 48),
#   DEMO_EPOCHS (default 4)
set -eu
DH=${1:-build/datahelix}
OUT=${DEMO_DIR:-demo-data}
rm -rf "$OUT"
exec "$DH" demo --out "$OUT" --count "${DEMO_COUNT:-48}" --epochs "${DEMO_EPOCHS:-4}"
