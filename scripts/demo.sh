#!/bin/sh
# `make demo` until the end-to-end demo lands: generate a mixed S/M/L video
# set, probe it (calibrating the cost model on real decodes), compile the
# binary index, and print the per-profile summary of the descriptor table.
set -eu
DH=${1:-build/datahelix}
OUT=${DEMO_DIR:-demo-data}
COUNT=${DEMO_COUNT:-24}

echo "== 1. gen-data: $COUNT synthetic clips (S 224p ~2 s, M 336p ~4 s, L 448p ~8 s) -> $OUT/videos"
"$DH" gen-data --out "$OUT/videos" --profiles mixed --count "$COUNT" --seed 1 --captions
echo
echo "== 2. probe: descriptors + calibrated cost model -> $OUT/manifest.jsonl, $OUT/manifest.dhx"
"$DH" probe --calibrate 2 --summary --out "$OUT/manifest.jsonl" \
    --index "$OUT/manifest.dhx" "$OUT/videos/captions.jsonl"
echo
echo "== 3. the table's first descriptor"
sed -n 2p "$OUT/manifest.jsonl" | cut -c1-400
echo
echo "== 4. the binary index"
"$DH" index --verify "$OUT/manifest.dhx"
echo
echo "== 5. decode: 16 uniform frames at 224x224 from one clip of each profile (exact, then snapped to keyframes)"
for f in "$OUT"/videos/000000_S.mp4 "$OUT"/videos/000001_M.mp4 "$OUT"/videos/000002_L.mp4; do
    "$DH" decode --repeat 3 "$f"
    "$DH" decode --repeat 3 --snap key "$f"
done
echo
echo "== 6. plan: which rank gets which samples, 4 ranks x batch 2, balanced by estimated tokens"
"$DH" plan --manifest "$OUT/manifest.dhx" --world-size 4 --batch-size 2
