#!/usr/bin/env bash
# What `profkit nsys --nproc N` costs over a bare `nsys profile torchrun ...` + `nsys export`
# of the same run, measured fairly: the two alternate (bare first, so the first, cold run
# is not profkit's), REPEATS times each, and the parent's own start-up costs are timed apart.
#
#   source .device/env.sh && bash benchmarks/nsys_nproc_overhead.sh "$OUT" [NPROC] [REPEATS]
#
# Writes OUT/overhead.txt (one line per run, then min/median of each and the ratio of the
# medians) and OUT/overhead.json.
set -euo pipefail
out=${1:-overhead-out}
nproc=${2:-2}
repeats=${3:-2}
mkdir -p "$out"
work=$(mktemp -d)
# NVLink multicast off in every process (it can take a shared host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
py=${PYTHON:-python3}
common=(--size small --ctx 128 --warmup 2 --steps 3)
log="$out/overhead.txt"
nvidia-smi -L | tee "$log"
nsys --version | tee -a "$log"

t() { $py -c 'import time; print(time.perf_counter())'; }
stamp() { date +%s.%N; }

# The parent's start-up, apart from the run: importing the CLI, and what a CUDA check costs.
{
  s=$(stamp); $py -m profkit --help > /dev/null; e=$(stamp)
  echo "profkit --help: $(awk "BEGIN{printf \"%.2f\", $e - $s}") s"
  s=$(stamp); $py -c 'import torch' ; e=$(stamp)
  echo "python -c 'import torch': $(awk "BEGIN{printf \"%.2f\", $e - $s}") s"
  s=$(stamp); $py -c 'import torch; torch.cuda.device_count()'; e=$(stamp)
  echo "python -c 'import torch; torch.cuda.device_count()': $(awk "BEGIN{printf \"%.2f\", $e - $s}") s"
  s=$(stamp); $py -c 'from profkit.workload.cuda import device_count; print(device_count())' > /dev/null; e=$(stamp)
  echo "profkit.workload.cuda.device_count() (driver probe): $(awk "BEGIN{printf \"%.2f\", $e - $s}") s"
} | tee -a "$log"

config=$($py -c "from profkit.workload.config import WorkloadConfig as W; print(W(size='small', ctx=128, warmup=2, steps=3, nproc=$nproc).to_json())")
bare() {
  nsys profile --output="$work/bare.nsys-rep" --force-overwrite=true --trace=cuda,nvtx --sample=none \
    --cpuctxsw=none --capture-range=cudaProfilerApi --capture-range-end=stop \
    $py -m torch.distributed.run --standalone --nproc-per-node "$nproc" --max-restarts 0 \
    -m profkit.run.child --config "$config" --result "$work/bare-result.json" \
    --capture cuda-profiler-api > "$work/bare.log" 2>&1
  nsys export --type sqlite --force-overwrite=true --output="$work/bare.sqlite" "$work/bare.nsys-rep" \
    >> "$work/bare.log" 2>&1
}
with_profkit() {
  $py -m profkit nsys --nproc "$nproc" "${common[@]}" --name run --out-dir "$work/p" -f json > "$work/profkit.json"
}
for i in $(seq "$repeats"); do
  s=$(stamp); bare; e=$(stamp)
  echo "bare $i: $(awk "BEGIN{printf \"%.2f\", $e - $s}") s" | tee -a "$log"
  s=$(stamp); with_profkit; e=$(stamp)
  echo "profkit $i: $(awk "BEGIN{printf \"%.2f\", $e - $s}") s" | tee -a "$log"
  $py -c "import json,sys; r=json.load(open('$work/p/run.profkit.json')); print('  profkit sidecar timings_s:', {k: round(v, 2) for k, v in r['timings_s'].items()})" | tee -a "$log"
done
$py - "$log" <<'EOF' | tee -a "$log" > /dev/null
import re, statistics, sys, json
text = open(sys.argv[1]).read()
runs = {k: [float(v) for v in re.findall(rf"^{k} \d+: ([\d.]+) s", text, re.M)] for k in ("bare", "profkit")}
med = {k: statistics.median(v) for k, v in runs.items()}
for k, v in runs.items():
    print(f"{k}: min {min(v):.1f} s, median {med[k]:.1f} s over {len(v)} runs")
print(f"ratio of medians: {med['profkit'] / med['bare']:.2f}x; of minima: {min(runs['profkit']) / min(runs['bare']):.2f}x")
json.dump({"runs_s": runs, "median_s": med}, open(sys.argv[1].replace(".txt", ".json"), "w"))
EOF
tail -3 "$log"
