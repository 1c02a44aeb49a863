#!/bin/sh
# `make demo`: generate a mixed S/M/L video set, probe it (calibrating the
# cost model on real decodes), compile the binary index, decode samples,
# plan an epoch, then run it through the data plane - a Coordinator and two
# ranks (`datahelix consume`), then the PyTorch DataLoader.
set -eu
DH=${1:-build/datahelix}
OUT=${DEMO_DIR:-demo-data}
COUNT=${DEMO_COUNT:-24}

echo "== 1. gen-data: $COUNT synthetic clips (S 224p ~2 s, M 336p ~4 s, L 448p ~8 s) -> $OUT/videos"
"$DH" gen-data --out "$OUT/videos" --profiles mixed --count "$COUNT" --seed 1 --captions
echo
echo "== 2. probe: descriptors + calibrated cost model -> $OUT/manifest.jsonl, $OUT/manifest.dhx"
# Tokens estimated for the sampling the loaders below use (8 frames at
# 112x112), so the plan balances what they really deliver.
"$DH" probe --calibrate 2 --summary --frames 8 --size 112x112 \
    --out "$OUT/manifest.jsonl" --index "$OUT/manifest.dhx" \
    "$OUT/videos/captions.jsonl"
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
echo
echo "== 7. the data plane: a Coordinator, and 2 ranks taking an epoch from their local DataServers (shared memory, no copy)"
RUN=$(mktemp -d "${TMPDIR:-/tmp}/datahelix-demo.XXXXXX")
COORD="ipc://$RUN/coordinator.sock"
"$DH" coordinator --listen "$COORD" --policy deadline --exit-with-parent 2>"$RUN/coordinator.log" &
CPID=$!
trap 'kill "$CPID" 2>/dev/null; rm -rf "$RUN"' EXIT INT TERM
i=0
while [ ! -S "$RUN/coordinator.sock" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
PIDS=""
for r in 0 1; do
    "$DH" consume --coordinator "$COORD" --manifest "$OUT/manifest.dhx" --rank $r \
        --world-size 2 --batch-size 2 --frames 8 --size 112x112 --window-ms 20 \
        --ids-out "$RUN/ids$r.txt" 2>"$RUN/rank$r.log" | sed "s/^/   rank $r: /" &
    PIDS="$PIDS $!"
done
# shellcheck disable=SC2086
wait $PIDS
echo "   every sample once across the ranks: $(cat "$RUN"/ids*.txt | sort -n | uniq | wc -l) distinct of $(cat "$RUN"/ids*.txt | wc -l) delivered"
echo
echo "== 8. the same from PyTorch: datahelix.DataLoader (zero-copy tensors)"
DATAHELIX_BIN="$DH" PYTHONPATH=python /usr/bin/python3 - "$OUT/manifest.jsonl" <<'PY'
import sys
import datahelix
with datahelix.DataLoader(sys.argv[1], batch_size=2, frames=8, size=(112, 112)) as loader:
    for batch in loader:
        v = batch["video"]
        print(f"   step {batch['step']}: video {tuple(v.shape)} {v.dtype}, ids {batch['ids'].tolist()}, "
              f"valid frames {batch['valid_frames'].tolist()}")
    s = loader.stats()
    print(f"   {s['steps']} steps; input wait p50 {s['input_wait_p50_ms']:.2f} ms, "
          f"p95 {s['input_wait_p95_ms']:.2f} ms; {s['misses']} steps waited")
PY
