#!/usr/bin/env bash
# Capture the 2-rank fixtures and the nsys overhead figure on a 2-GPU machine, in one go.
#
#   source .device/env.sh && bash benchmarks/multi_gpu_capture.sh "$OUT"
#
# Writes under OUT (default ./mgpu-out), named as tests/data wants them: the xz-compressed
# 2-rank nsys export of the small model (nsys-2025.3-h200x2-small-ddp2.sqlite.xz) and its
# sidecar, the per-rank torch.profiler traces (torch-h200x2-small-ddp2-rank{0,1}.json.gz;
# tests/test_multi_gpu_fixtures.py checks every fixture of those names), a bench
# sweep over nproc and parallelism, and timings.txt: `profkit nsys --nproc 2` against a
# bare `nsys profile torchrun ...` + `nsys export` of the same run.
set -euo pipefail
out=${1:-mgpu-out}
mkdir -p "$out" work
# NVLink multicast off in every process (it can take a shared host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
common=(--size small --ctx 128 --warmup 2 --steps 3)
nvidia-smi -L | tee "$out/timings.txt"

# 1. profkit nsys --nproc 2 (one report of the whole torchrun tree), timed end to end.
t0=$(date +%s.%N)
$py -m profkit nsys --nproc 2 "${common[@]}" --name nsys-2rank --out-dir work -f md > "$out/nsys-2rank.md"
t1=$(date +%s.%N)

# 2. The same run, bare: nsys profile torchrun ... then nsys export.
config=$($py -c "from profkit.workload.config import WorkloadConfig as W; print(W(size='small', ctx=128, warmup=2, steps=3, nproc=2).to_json())")
t2=$(date +%s.%N)
nsys profile --output=work/bare.nsys-rep --force-overwrite=true --trace=cuda,nvtx --sample=none \
  --cpuctxsw=none --capture-range=cudaProfilerApi --capture-range-end=stop \
  $py -m torch.distributed.run --standalone --nproc-per-node 2 --max-restarts 0 \
  -m profkit.run.child --config "$config" --result work/bare-result.json --capture cuda-profiler-api > work/bare.log 2>&1
nsys export --type sqlite --force-overwrite=true --output=work/bare.sqlite work/bare.nsys-rep >> work/bare.log 2>&1
t3=$(date +%s.%N)
$py - "$t0" "$t1" "$t2" "$t3" <<'EOF' | tee -a "$out/timings.txt"
import sys
t0, t1, t2, t3 = map(float, sys.argv[1:])
profkit, bare = t1 - t0, t3 - t2
print(f"profkit nsys --nproc 2 (profile+export+analysis): {profkit:.1f} s")
print(f"bare nsys profile torchrun + nsys export:          {bare:.1f} s")
print(f"ratio: {profkit / bare:.2f}x")
EOF

# 3. Reading it: profkit kernels on the 2-rank export, timed.
/usr/bin/time -f "profkit kernels (2-rank export): %e s, %M KiB max RSS" \
  $py -m profkit kernels work/nsys-2rank.sqlite -f json > "$out/kernels-2rank.json" 2>> "$out/timings.txt"

# 4. Per-rank torch.profiler traces (small model, one timed step).
$py -m profkit torch --nproc 2 --size small --ctx 128 --warmup 2 --steps 1 --name torch-2rank \
  --out-dir work -f json > "$out/torch-2rank.json"

# 5. Scaling rows: one and two ranks, DDP and FSDP2.
$py -m profkit bench --nproc 1 2 --parallel ddp fsdp --size small --ctx 128 --warmup 3 --steps 5 \
  --db work/results.db -f json > "$out/bench.json" || true

fixture=nsys-2025.3-h200x2-small-ddp2
xz -9 -T0 -c work/nsys-2rank.sqlite > "$out/$fixture.sqlite.xz"
cp work/nsys-2rank.profkit.json "$out/$fixture.profkit.json" 2>/dev/null || true
for r in 0 1; do cp "work/torch-2rank-train-rank$r.json.gz" "$out/torch-h200x2-small-ddp2-rank$r.json.gz"; done
ls -la "$out"
