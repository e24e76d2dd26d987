#!/usr/bin/env bash
# First contact with a GPU machine: does the workload run on CUDA, and real development
# fixtures for the readers (an nsys export, a Chrome trace, a memory snapshot) of the small
# model. Run there as: source .device/env.sh && bash benchmarks/gpu_smoke.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
nsys --version
python3 -m profkit sizes -f md | head -4

cfg() { python3 -c "from profkit.workload.config import WorkloadConfig as W; print(W(size='small', ctx=128, warmup=2, steps=2, device='cuda', $1).to_json())"; }
for variant in "dtype='fp32'" "dtype='bf16'"; do
  name=small-ctx128-$(echo "$variant" | tr -dc 'a-z0-9' | sed 's/dtype//')
  start=$(date +%s.%N)
  nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none --capture-range=cudaProfilerApi \
    --capture-range-end=stop --force-overwrite true -o "$W/$name" \
    python3 -m profkit.run.child --config "$(cfg "$variant")" --result "$W/$name.result.json" \
    --capture cuda-profiler-api > "$W/$name.log" 2>&1 || tail -5 "$W/$name.log"
  nsys export --type sqlite --force-overwrite true -o "$W/$name.sqlite" "$W/$name.nsys-rep" > /dev/null 2>&1
  echo "$name: $(python3 -c "print(round($(date +%s.%N)-$start,1))") s, $(du -h "$W/$name.sqlite" | cut -f1)"
  python3 -c "import json; r=json.load(open('$W/$name.result.json')); print(r['status'], r.get('error'), [round(s['forward_ms'],2) for s in r.get('steps',[])])"
done
nsys stats --report cuda_gpu_kern_sum --format csv "$W/small-ctx128-fp32.sqlite" 2>/dev/null | head -8
tar -C "$W" -cJf "$OUT/nsys-small.tar.xz" small-ctx128-fp32.sqlite small-ctx128-bf16.sqlite \
  small-ctx128-fp32.result.json small-ctx128-bf16.result.json

python3 - "$W" <<'PY'
import gzip, json, pickle, shutil, sys, torch
from torch.profiler import ProfilerActivity, profile, schedule
from profkit.workload.config import WorkloadConfig
from profkit.workload.step import Workload
w = sys.argv[1]
wl = Workload(WorkloadConfig(size="small", ctx=128, warmup=0, steps=1, device="cuda"))
for _ in range(2):
    wl.step()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
             schedule=schedule(wait=0, warmup=1, active=1)) as prof:
    for _ in range(2):
        wl.step(); prof.step()
prof.export_chrome_trace(f"{w}/small-ctx128-train.json")
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))
del wl; torch.cuda.empty_cache()
wl = Workload(WorkloadConfig(size="tiny", ctx=64, warmup=1, steps=1, device="cuda"))
wl.step()
torch.cuda.reset_peak_memory_stats()
torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
wl.step()
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
with open(f"{w}/tiny-train.pickle", "wb") as f:
    pickle.dump(snap, f, protocol=4)
json.dump({"max_memory_allocated": torch.cuda.max_memory_allocated(),
           "memory_allocated": torch.cuda.memory_allocated(),
           "max_memory_reserved": torch.cuda.max_memory_reserved()}, open(f"{w}/tiny-train.stats.json", "w"))
print("snapshot keys", list(snap), "traces", [len(t) for t in snap["device_traces"]])
PY
gzip -k "$W/small-ctx128-train.json"; ls -la "$W"
cp "$W/small-ctx128-train.json.gz" "$OUT/"
tar -C "$W" -cJf "$OUT/memory-tiny.tar.xz" tiny-train.pickle tiny-train.stats.json
ls -la "$OUT"
