#!/usr/bin/env bash
# The GPU runs of issue 2 (about 6 minutes on an H100; SKIP_OVERHEAD=1 saves ~1.5 of them):
#   1. `profkit bench`: the five course sizes at ctx 256, forward and train, fp32 and bf16,
#      eager, default 5 warm-up + 10 timed steps  -> bench-h100.md (+ .json with every field)
#   2. a sweep that reaches an OOM (2.7B fp32 train at ctx 1024 needs ~130 GiB) beside a
#      small config that finishes, 2 warm-up + 5 timed steps   -> bench-oom.md
#   3. benchmarks/timing_overhead.py (profkit vs a hand loop; annotations on vs off)
#                                                                 -> timing_overhead.md
# plus doctor.txt, results.db (every row of 1 and 2) and gpu_bench.log, all under $OUT.
# Run there as: source .device/env.sh && bash benchmarks/gpu_bench.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_bench.log") 2>&1
DB="$OUT/results.db"
W=$(mktemp -d)
started=$(date +%s)
elapsed() { echo "$(($(date +%s) - started)) s"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m profkit doctor > "$OUT/doctor.txt" 2>&1
cat "$OUT/doctor.txt"

# The sweep's parent asks torch for the GPU name: check that this takes no GPU memory
# (no CUDA context) away from the children that it runs.
python3 - <<'PY'
import os, subprocess, sys, torch
if not torch.cuda.is_available():
    sys.exit(print("no CUDA here"))
name = torch.cuda.get_device_name(0)
apps = subprocess.run(
    ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
    capture_output=True, text=True,
).stdout
mine = [line for line in apps.splitlines() if line.split(",")[0].strip() == str(os.getpid())]
print(f"parent after get_device_name({name!r}): "
      + (f"HOLDS A CUDA CONTEXT: {mine}" if mine else "no CUDA context (no GPU memory used)"))
PY

# 1. The course table.
read -r -a SIZES <<< "${SIZES:-small medium large xl 2.7B}"  # SIZES=tiny: a CPU smoke test
CMD=(python3 -m profkit bench --size "${SIZES[@]}" --ctx 256 --mode forward train
     --dtype fp32 bf16 --compile no --timeout 300 --db "$DB")
echo "== 1. ${CMD[*]:2} ($(elapsed))"
"${CMD[@]}" --format md --out "$W/bench.md"
{
  echo "# profkit bench on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
  echo
  echo "Measured $(date -u +%Y-%m-%d) with:"
  echo
  echo '```'
  echo "profkit bench --size ${SIZES[*]} --ctx 256 --mode forward train --dtype fp32 bf16 --compile no"
  echo '```'
  echo
  echo "Batch 4, naive attention, eager. fp32 runs without TF32 (PyTorch's default), so its"
  echo "MFU is against the fp32 (non-tensor-core) peak; bf16 is autocast, against the dense"
  echo "bf16 peak. See docs/FLOPS.md for the FLOP count and the peak table."
  echo
  cat "$W/bench.md"
} > "$OUT/bench-h100.md"
# The same rows with every field (per-step times, min/median/max): --resume reads them back.
"${CMD[@]}" --resume --format json --out "$OUT/bench-h100.json" 2>/dev/null

# 2. A sweep that reaches an OOM and goes on (never on a CPU: 2.7B would swamp the host).
if [ "${SKIP_OOM:-0}" != 1 ]; then
  echo "== 2. OOM sweep ($(elapsed))"
  python3 -m profkit bench --size 2.7B small --ctx 1024 --mode train --dtype fp32 \
    --warmup 2 --steps 5 --device cuda --timeout 300 --db "$DB" --format md \
    --out "$OUT/bench-oom.md"
fi

# 3. What profkit's timing and annotations cost.
if [ "${SKIP_OVERHEAD:-0}" != 1 ]; then
  echo "== 3. timing overhead ($(elapsed))"
  python3 benchmarks/timing_overhead.py
fi

echo "== summary ($(elapsed))"
cat "$OUT/bench-h100.md"
[ -f "$OUT/bench-oom.md" ] && cat "$OUT/bench-oom.md"
[ -f "$OUT/timing_overhead.md" ] && cat "$OUT/timing_overhead.md"
python3 - "$DB" <<'PY'
import sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute(
    "select status, count(*) from bench group by status").fetchall()
print("results.db rows by status:", dict(rows))
PY
ls -la "$OUT"
echo "gpu_bench.sh done in $(elapsed)"
