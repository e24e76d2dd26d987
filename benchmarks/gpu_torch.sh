#!/usr/bin/env bash
# profkit torch on the GPU machine: the real Chrome-trace fixtures, the course report, a
# CUDA smoke run of every option, and the torch side of the nsys/torch cross-check.
#
#   source .device/env.sh && bash benchmarks/gpu_torch.sh        (outputs under $OUT)
#
# Writes to $OUT (at most 8 files, each well under 16 MiB):
#   torch-small-ctx128-forward.json.gz    fixture: small, ctx 128, fp32, 1 profiled step
#   torch-small-ctx128-train.json.gz      fixture: the same, full train step
#   torch-small-ctx128-train.expected.json  golden numbers for the train fixture, computed
#                                         with the stdlib json module and exact decimals
#                                         (not with profkit's reader): commit beside it
#   torch-large-ctx256.md                 reports/torch-large-ctx256.md (forward + train)
#   torch-large-ctx256-train.json.gz      the large train trace (if under 16 MiB)
#   phases-large-ctx256.json              per-phase kernels/GPU ms of the large train trace
#                                         (torch side of the cross-check)
#   gpu_torch.log                         everything printed
# Takes about 2-4 minutes on an H100 (two large-model runs dominate). For a dry run on a
# CPU: DEVICE=cpu SMALL=tiny LARGE=tiny bash benchmarks/gpu_torch.sh (file names unchanged).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .device/env.sh ] && source .device/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}
WORK=$(mktemp -d)
mkdir -p "$OUT"
LOG="$OUT/gpu_torch.log"
started=$SECONDS
say() { echo "== $* ($((SECONDS - started)) s)" | tee -a "$LOG"; }
run() { say "$*"; timeout 420 "$@" >>"$LOG" 2>&1; local rc=$?; [ $rc -ne 0 ] && say "FAILED ($rc): $*"; return $rc; }

say "machine"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  python3 -c 'import orjson; print("orjson", orjson.__version__)' 2>/dev/null || echo "orjson missing: the reader falls back to json"
} >>"$LOG" 2>&1

cd "$WORK" || exit 1
PK=(python3 -m profkit)
DEVICE=${DEVICE:-cuda}
SMALL=${SMALL:-small}
LARGE=${LARGE:-large}
export PYTHONPATH="$OLDPWD${PYTHONPATH:+:$PYTHONPATH}"

# 1. The fixtures: small model, one profiled step, forward-only and train.
run "${PK[@]}" torch --size "$SMALL" --ctx 128 --warmup 2 --steps 1 --device "$DEVICE" \
    --name torch-small-ctx128 --row-limit 15 --format md
# 2. The course report: large, ctx 256, fp32, forward-only and train.
run "${PK[@]}" torch --size "$LARGE" --ctx 256 --device "$DEVICE" --name torch-large-ctx256 \
    --format md
# 3. Every option on CUDA (tables only go to the log).
run "${PK[@]}" torch --size "$SMALL" --ctx 128 --warmup 1 --steps 1 --device "$DEVICE" \
    --mode forward --record-shapes --group-by-shape --profile-memory --with-stack --sort self_cuda_mem \
    --row-limit 5 --name torch-options --format md
run "${PK[@]}" torch --size "$SMALL" --ctx 128 --warmup 1 --steps 1 --device "$DEVICE" \
    --mode forward --sort cuda_total --name torch-sort --format json

say "golden numbers (stdlib json, exact decimals) and the per-phase summary"
python3 - "$OUT" >>"$LOG" 2>&1 <<'PY'
import gzip, json, shutil, sys
from decimal import Decimal
from pathlib import Path

out = Path(sys.argv[1])
kinds = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
launch_cats = {"cuda_runtime", "cuda_driver"}


def expected(path: Path) -> dict:
    """Counted without profkit: what read_chrome_columns must reproduce exactly."""
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    events = doc["traceEvents"]
    launches = {e["args"]["correlation"] for e in events
                if e.get("cat") in launch_cats and "correlation" in e.get("args", {})}
    gpu = [e for e in events if e.get("cat") in kinds]
    by_kind: dict = {}
    for e in gpu:
        by_kind[kinds[e["cat"]]] = by_kind.get(kinds[e["cat"]], 0) + 1
    ranges: dict = {}
    for e in events:
        if e.get("cat") == "user_annotation" and e.get("ph") == "X" and not e["name"].startswith("ProfilerStep#"):
            ranges[e["name"]] = ranges.get(e["name"], 0) + 1
    return {
        "source": path.name,
        "activities_by_kind": by_kind,
        "gpu_time_ns": int(sum(Decimal(e["dur"]) * 1000 for e in gpu)),
        "activities_with_launch": sum(1 for e in gpu if e.get("args", {}).get("correlation") in launches),
        "ranges": ranges,
    }


def phases(path: Path) -> dict:
    """A minimal attribution (outermost main-thread range at launch) for the summary."""
    import numpy as np
    from profkit.traces.chrome import read_chrome_columns

    c = read_chrome_columns(path)
    ranges, launch = c.ranges, c.arrays["launch_start"]
    if not len(c) or ranges.empty:
        return {"trace": path.name, "kernels": 0, "without_launch": 0, "launch_threads": {},
                "main_thread": None, "phases": {}, "warnings": c.meta["warnings"], "gpus": c.meta["gpus"]}
    main = ranges.loc[ranges["name"] == "forward", "thread"].iloc[0]
    top = ranges[(ranges["thread"] == main) & (ranges["depth"] == 0)].sort_values("start")
    known = launch >= 0
    starts = launch[known]
    i = np.searchsorted(top["start"].to_numpy(), starts, side="right") - 1
    ok = (i >= 0) & (starts < top["end"].to_numpy()[np.clip(i, 0, None)])
    names = np.where(ok, top["name"].to_numpy()[np.clip(i, 0, None)], "unattributed")
    dur = c.arrays["duration"][known]
    rows = {}
    for name in dict.fromkeys(names):
        sel = names == name
        rows[str(name)] = {"kernels": int(sel.sum()), "gpu_time_ms": float(dur[sel].sum() / 1e6)}
    threads, counts = np.unique(c.launch_threads(c.arrays["launch_thread"][known]), return_counts=True)
    return {"trace": path.name, "kernels": len(c), "without_launch": int((~known).sum()),
            "launch_threads": {str(a): int(b) for a, b in zip(threads, counts)}, "main_thread": int(main),
            "phases": rows, "warnings": c.meta["warnings"], "gpus": c.meta["gpus"]}


profiles = Path("profiles")
for name in ("torch-small-ctx128-forward.json.gz", "torch-small-ctx128-train.json.gz"):
    src = profiles / name
    if src.exists():
        shutil.copy(src, out / name)
        print(name, f"{src.stat().st_size / 2**20:.1f} MiB")
train = profiles / "torch-small-ctx128-train.json.gz"
if train.exists():
    (out / "torch-small-ctx128-train.expected.json").write_text(json.dumps(expected(train), indent=2))
    print(json.dumps(phases(train), indent=1))
large = profiles / "torch-large-ctx256-train.json.gz"
if Path("reports/torch-large-ctx256.md").exists():
    shutil.copy("reports/torch-large-ctx256.md", out / "torch-large-ctx256.md")
if large.exists():
    if large.stat().st_size < 16 * 2**20:
        shutil.copy(large, out / large.name)
    print(large.name, f"{large.stat().st_size / 2**20:.1f} MiB")
    summary = phases(large)
    (out / "phases-large-ctx256.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=1))
PY

say "done in $((SECONDS - started)) s; summary:"
python3 - "$OUT" <<'PY' | tee -a "$LOG"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for f in sorted(out.iterdir()):
    print(f"  {f.name:45s} {f.stat().st_size / 2**20:7.2f} MiB")
p = out / "phases-large-ctx256.json"
if p.exists():
    s = json.loads(p.read_text())
    print(f"large ctx256 train ({', '.join(s['gpus'])}): {s['kernels']} GPU activities, "
          f"{s['without_launch']} without a launch; launch threads {s['launch_threads']} (main {s['main_thread']})")
    for name, row in s["phases"].items():
        print(f"  {name:12s} {row['kernels']:6d} kernels {row['gpu_time_ms']:10.3f} ms")
e = out / "torch-small-ctx128-train.expected.json"
if e.exists():
    print("small fixture:", json.loads(e.read_text())["activities_by_kind"])
PY
grep -q FAILED "$LOG" && { echo "some steps FAILED: see $LOG"; exit 1; }
exit 0
