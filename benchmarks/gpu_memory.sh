#!/usr/bin/env bash
# Memory snapshots on the GPU machine: test fixtures, the 2.7B study, an OOM on purpose.
#
# Run from the repository root (the device tool: carry [".device"]):
#   source .device/env.sh && bash benchmarks/gpu_memory.sh
# Writes under $OUT (7 files, each well under 16 MiB):
#   fixtures.tar.xz           tiny forward/train and small train snapshots made by `profkit memory`
#                             itself (.pickle.xz + .profkit.json); tests/data/ already holds real
#                             ones, so these are an end-to-end check (or replacements: update GOLDEN)
#   memory-2.7B.md            phase table and peak table: ctx 128/256/512 x forward/train x fp32/bf16
#   memory-2.7B.json          the same rows as JSON
#   timeline-2.7B-forward.png timeline of one forward pass (ctx $PLOT_CTX, fp32)
#   timeline-2.7B-train.png   timeline of one full training step (ctx $PLOT_CTX, fp32)
#   summaries.md              `memory summarize` of the two plotted snapshots and of the OOM
#   checks.md                 reconstructed peak vs the allocator's counters, every snapshot
# About 3-4 minutes on an H100 (a 2.7B config takes ~7-10 s; summaries and plots ~1 min).
set -euo pipefail
OUT=${OUT:-/tmp/profkit-memory-out}
PLOT_CTX=${PLOT_CTX:-512}  # the largest context; fp32 training fits on an 80 GB H100 (63.8 GiB)
WORK=$(mktemp -d /tmp/profkit-memory.XXXX)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
started=$(date +%s)
pk() { python3 -m profkit "$@"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

echo "== (a) the capture command end to end, and fixtures: one recorded step after one warm-up =="
python3 -c "import pytest" 2>/dev/null && python3 -m pytest -q -m gpu tests/test_memory.py || echo "(pytest not installed here: GPU tests skipped)"
FIX=$WORK/fixtures
pk memory --size tiny --ctx 64 --mode forward train --out-dir "$FIX" --format md
pk memory --size small --ctx 128 --mode train --out-dir "$FIX" --format md
rm -f "$FIX/results.db"
ls -la "$FIX"
for f in "$FIX"/*.pickle; do xz -9 -T0 "$f"; done
ls -la "$FIX"
tar -C "$FIX" -cJf "$OUT/fixtures.tar.xz" .

echo "== (b) 2.7B: ctx 128 256 512 x forward/train x fp32/bf16 =="
BIG=$WORK/big
pk memory --size 2.7B --ctx 128 256 512 --mode forward train --dtype fp32 bf16 \
  --out-dir "$BIG" --format json --out "$OUT/memory-2.7B.json"
python3 - "$OUT/memory-2.7B.json" "$OUT/memory-2.7B.md" <<'EOF'
import json, sys
from pathlib import Path
from profkit.memory.capture import capture_tables
from profkit.formats import markdown_table
rows = json.loads(Path(sys.argv[1]).read_text())
text = "\n\n".join(f"### {title}\n\n{markdown_table(df)}" for title, df in capture_tables(rows))
Path(sys.argv[2]).write_text(text + "\n")
EOF
cat "$OUT/memory-2.7B.md"

echo "== timelines and summaries (ctx $PLOT_CTX, fp32) =="
: > "$OUT/summaries.md"
for mode in forward train; do
  snap=$BIG/memory-2.7B-ctx$PLOT_CTX-$mode-fp32.pickle
  if [ -f "$snap" ]; then
    pk memory plot "$snap" -o "$OUT/timeline-2.7B-$mode.png"
    { echo "## 2.7B ctx $PLOT_CTX $mode fp32"; echo; pk memory summarize "$snap" --format md; echo; } >> "$OUT/summaries.md"
  fi
done

echo "== (c) an OOM on purpose: 10B, full step (weights + grads alone exceed 80 GB) =="
OOMDIR=$WORK/oom
pk memory --size 10B --ctx 128 --mode train --out-dir "$OOMDIR" --format md || true
snap=$(ls "$OOMDIR"/*.pickle 2>/dev/null | head -n 1 || true)
if [ -n "$snap" ]; then
  { echo "## 10B ctx 128 train fp32 (expected: OOM)"; echo; pk memory summarize "$snap" --format md --top 5; echo; } >> "$OUT/summaries.md"
fi

echo "== checks: reconstructed peak vs the allocator's own counters =="
python3 - "$FIX" "$BIG" "$OOMDIR" > "$OUT/checks.md" <<'EOF'
import sys, time
from pathlib import Path
from profkit.memory.summary import summarize_file
from profkit.sidecar import read_sidecar
print("| snapshot | status | events | reconstructed peak B | max_memory_allocated B | diff % | requested peak B | allocator requested peak B | equal | phases placed | load+summarize s |")
print("|:--|:--|--:|--:|--:|--:|--:|--:|:--|:--|--:|")
for folder in sys.argv[1:]:
    for path in sorted(Path(folder).glob("*.pickle*")):
        meta = read_sidecar(path) or {}
        cap = meta.get("capture") or {}
        t = time.perf_counter()
        s = summarize_file(path)
        took = time.perf_counter() - t
        rec = cap.get("max_memory_allocated_bytes")
        req = cap.get("peak_requested_bytes")
        diff = (s["peak_allocated_bytes"] - rec) / rec * 100 if rec else float("nan")
        phases = s["peak_phase"] is not None
        print(f"| {path.name} | {meta.get('status')} | {s['events']:,} | {s['peak_allocated_bytes']:,} | "
              f"{rec if rec is None else format(rec, ',')} | {diff:+.3f} | {s['peak_requested_bytes']:,} | "
              f"{req if req is None else format(req, ',')} | {s['peak_requested_bytes'] == req} | {phases} | {took:.1f} |")
EOF
cat "$OUT/checks.md"
du -sh "$WORK"/* 2>/dev/null || true
rm -rf "$WORK"
ls -la "$OUT"
echo "done in $(( $(date +%s) - started )) s"
