#!/usr/bin/env bash
# The attention micro-benchmark on a GPU, and the precision study on CUDA.
#   1. the default grid (d_head 16 32 64 128 x seq 256 .. 16384, batch 8, fp32):
#      naive attention eager vs torch.compile, side by side;
#   2. the same grid with sdpa (fused kernels) in fp32 and bf16;
#   3. past the memory limit (seq 32768 and 65536): OOM cells kept, the next cell still runs;
#   4. `profkit precision accumulate|dtypes` on CUDA and the studies' GPU tests.
# Writes markdown tables, the JSON rows and logs under $OUT. About 4 minutes on an H100 (8 at most);
# each step has its own time limit (SIGINT: the cells finished so far are still written).
# Run there, from the repository root, as: bash benchmarks/gpu_attention.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$(mktemp -d)
# The handout times 100 passes; 50 keep the whole script inside its budget (the spread
# column shows the timing is stable well before that). ITERS=100 for the handout's count.
ITERS=${ITERS:-50}; WARMUP=${WARMUP:-3}
START=$(date +%s)

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
echo "timed passes per cell: $ITERS forward + $ITERS backward after $WARMUP warm-up passes each" \
     "(the handout's 100 reduced to fit ~5 minutes; set ITERS=100 for the full count)"

attention() {  # name, time limit (s), profkit attention options...
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  timeout -s INT -k 20 "$limit" python3 -m profkit attention --device cuda \
    --iters "$ITERS" --warmup "$WARMUP" "$@" -f json --out "$W/$name.json" 2> "$W/$name.log"
  echo "$name: exit $?, $(( $(date +%s) - t0 )) s"; tail -3 "$W/$name.log"
}

attention naive-eager-vs-compiled 180 --impl naive --compile both
attention sdpa-fp32-vs-bf16 70 --impl sdpa --dtype fp32 bf16
attention oom 50 --d-head 64 --seq 32768 65536 256 --iters 5 --warmup 1

python3 - "$W" "$OUT/attention.md" > "$W/summary.txt" <<'PY'
import json, sys
from pathlib import Path
from profkit.formats import markdown_table
from profkit.studies import attention_tables as t

work, out = Path(sys.argv[1]), Path(sys.argv[2])
parts, summary = [], []
for name in ("naive-eager-vs-compiled", "sdpa-fp32-vs-bf16", "oom"):
    path = work / f"{name}.json"
    if not path.exists():
        summary.append(f"{name}: no result (see {name}.log)")
        continue
    rows = json.loads(path.read_text())
    parts.append(f"## {name}\n\n### {t.title(rows)}\n\n" + markdown_table(t.cells_table(rows)))
    pairs = t.side_by_side(rows)
    if pairs is not None:
        parts.append("### Side by side\n\n" + markdown_table(pairs))
    if t.failures(rows):
        parts.append("\n".join(f"- {line}" for line in t.failures(rows)))
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "oom", "error", "interrupted")}
    slowest = max((r for r in rows if r["forward_ms"]), key=lambda r: r["forward_ms"], default=None)
    summary.append(
        f"{name}: {len(rows)} cells, "
        + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        + (f"; slowest fwd {slowest['forward_ms']:.2f} ms at d_head {slowest['d_head']}"
           f" seq {slowest['seq']}" if slowest else "")
    )
    gaps = [
        (r["memory_before_backward_bytes"] - r["expected_bytes"]) / r["expected_bytes"]
        for r in rows
        if r["memory_before_backward_bytes"] and not r["compile"]
    ]
    if gaps:
        summary.append(f"  eager memory before backward vs analytic: {min(gaps):+.2%} .. {max(gaps):+.2%}")
out.write_text("\n\n".join(parts) + "\n")
print("\n".join(summary))
PY
tar -C "$W" -cJf "$OUT/attention-json.tar.xz" $(cd "$W" && ls ./*.json ./*.log 2>/dev/null)

{
  timeout 45 python3 -m profkit precision accumulate --device cuda -f md
  echo
  timeout 45 python3 -m profkit precision dtypes -f md
} > "$OUT/precision.md" 2> "$OUT/precision.log"
cat "$OUT/precision.md"

timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py tests/test_precision.py \
  > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -3 "$OUT/gpu-tests.log"

ls -la "$OUT"
echo "--- summary ($(( $(date +%s) - START )) s in all) ---"
cat "$W/summary.txt"
