#!/usr/bin/env bash
# `profkit nsys` on the GPU machine: real fixtures, the large model's reports, and the cost
# of the whole command next to a bare `nsys profile` + `nsys export` of the same run.
#
#   source .device/env.sh && bash benchmarks/gpu_nsys.sh        # outputs under $OUT
#
# (a) fixtures captured with profkit itself, each export xz-compressed into $OUT:
#     small ctx128 train fp32 / bf16 / fp32 --compile (2 warm-up + 2 timed steps), and
#     `profkit nsys -- python examples/user_train.py` (a program that is not the built-in model)
# (b) `profkit nsys --size large --ctx 256` fp32 and bf16 train; their reports/*.md go to $OUT
# (c) a bare `nsys profile ... python -m profkit.run.child ...` + `nsys export` of (b)'s fp32 run,
#     timed, to compare with (b)'s wall time (target: profkit at most 1.3x the bare pair)
# $OUT gets 8 files: 4 fixture-*.sqlite.xz, 2 large-*.md, runs.tar.xz (sidecars, logs,
# every report, timings) and summary.txt. About 5-8 minutes on an H100.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_nsys_out}
W=$(mktemp -d /tmp/profkit-gpu-nsys.XXXXXX)
mkdir -p "$OUT" "$W/bare"
cd "$W" || exit 1 # profiles/ and reports/ land here
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY=$(command -v python3 || command -v python)
command -v nsys >/dev/null || { echo "nsys is not on PATH: source .device/env.sh first" >&2; exit 2; }
now() { date +%s.%N; }
secs() { awk "BEGIN { printf \"%.1f\", $2 - $1 }"; }
START=$(now)
echo "== $(nsys --version)  $("$PY" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())')"

# One `profkit nsys` run: its command wall time goes to walls.txt, its JSON record to NAME.json.
pk() {
  local name=$1; shift
  echo "== profkit nsys --name $name $*"
  local t0; t0=$(now)
  timeout -s INT -k 30 420 "$PY" -m profkit nsys --name "$name" --format json "$@" \
    >"$W/$name.json" 2>"$W/$name.stderr"
  local rc=$?
  local t1; t1=$(now)
  echo "$name $rc $(secs "$t0" "$t1")" >>"$W/walls.txt"
  tail -n 3 "$W/$name.stderr"
}

FIX=(--ctx 128 --warmup 2 --steps 2)
pk small-ctx128-train-fp32 --size small "${FIX[@]}"
pk small-ctx128-train-bf16 --size small "${FIX[@]}" --bf16
pk small-ctx128-train-fp32-compiled --size small "${FIX[@]}" --compile yes
pk user_train -- "$PY" "$ROOT/examples/user_train.py" --steps 3 --warmup 2

pk large-ctx256-train-fp32 --size large --ctx 256

# (c) the same run by hand: what a user types without profkit
CONFIG=$("$PY" -c 'from profkit.workload.config import WorkloadConfig as C; print(C(size="large", ctx=256).to_json())')
echo "== bare nsys profile + nsys export of large-ctx256-train-fp32"
t0=$(now)
timeout -s INT -k 30 420 nsys profile --output="$W/bare/large.nsys-rep" --force-overwrite=true \
  --trace=cuda,nvtx --sample=none --cpuctxsw=none \
  --capture-range=cudaProfilerApi --capture-range-end=stop \
  "$PY" -m profkit.run.child --config "$CONFIG" --result "$W/bare/result.json" \
  --capture cuda-profiler-api >"$W/bare/profile.log" 2>&1
bare_profile_rc=$?
t1=$(now)
nsys export --type sqlite --force-overwrite true --output "$W/bare/large.sqlite" \
  "$W/bare/large.nsys-rep" >"$W/bare/export.log" 2>&1
bare_export_rc=$?
t2=$(now)
echo "bare-profile $bare_profile_rc $(secs "$t0" "$t1")" >>"$W/walls.txt"
echo "bare-export $bare_export_rc $(secs "$t1" "$t2")" >>"$W/walls.txt"

pk large-ctx256-train-bf16 --size large --ctx 256 --bf16

# Outputs: compressed fixtures, the large reports, everything else bundled.
"$PY" - "$W" "$OUT" <<'EOF'
import lzma, shutil, sys
from pathlib import Path
work, out = Path(sys.argv[1]), Path(sys.argv[2])
for name in ("small-ctx128-train-fp32", "small-ctx128-train-bf16",
             "small-ctx128-train-fp32-compiled", "user_train"):
    src = work / "profiles" / f"{name}.sqlite"
    if src.exists():
        with open(src, "rb") as f, lzma.open(out / f"fixture-{name}.sqlite.xz", "wb", preset=9) as g:
            shutil.copyfileobj(f, g, 1 << 20)
for name in ("large-ctx256-train-fp32", "large-ctx256-train-bf16"):
    src = work / "reports" / f"{name}.md"
    if src.exists():
        shutil.copy(src, out / f"{name}.md")
EOF

# The summary table: one row per run, then profkit against the bare pair.
"$PY" - "$W" >"$W/summary.txt" <<'EOF'
import json, sqlite3, sys
from pathlib import Path
work = Path(sys.argv[1])
walls = {}
for line in (work / "walls.txt").read_text().splitlines():
    name, rc, wall = line.split()
    walls[name] = (int(rc), float(wall))

def kernels(path):
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return db.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    except Exception:
        return None

def fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)

head = ("run", "rc", "status", "kernels", "sqlite_MB", "profile_s", "export_s", "analysis_s",
        "total_s", "command_s", "py_step_ms")
print("| " + " | ".join(head) + " |")
print("|" + "|".join(["---"] * len(head)) + "|")
for name, (rc, wall) in walls.items():
    if name.startswith("bare"):
        continue
    record = {}
    sidecar = work / "profiles" / f"{name}.profkit.json"
    if sidecar.exists():
        record = json.loads(sidecar.read_text())
    t = record.get("timings_s", {})
    result = record.get("result") or {}
    steps = result.get("steps") or []
    step_ms = (sum(sum(v or 0 for k, v in s.items() if k.endswith("_ms")) for s in steps)
               / len(steps)) if steps else None
    db = work / "profiles" / f"{name}.sqlite"
    size = db.stat().st_size / 2**20 if db.exists() else None
    print(f"| {name} | {rc} | {result.get('status', '-')} | {fmt(kernels(db), 'd') if db.exists() else '-'}"
          f" | {fmt(size)} | {fmt(t.get('nsys_profile'))} | {fmt(t.get('export'))}"
          f" | {fmt(t.get('analysis'))} | {fmt(t.get('total'))} | {wall:.1f} | {fmt(step_ms)} |")
bare = work / "bare" / "large.sqlite"
bp, be = walls.get("bare-profile", (1, 0.0)), walls.get("bare-export", (1, 0.0))
print()
print(f"bare nsys profile: {bp[1]:.1f} s (rc {bp[0]}), nsys export: {be[1]:.1f} s (rc {be[0]}), "
      f"together {bp[1] + be[1]:.1f} s; kernels {kernels(bare)}")
pk = walls.get("large-ctx256-train-fp32")
if pk and bp[0] == 0 and be[0] == 0 and bp[1] + be[1] > 0:
    print(f"profkit nsys large-ctx256-train-fp32: {pk[1]:.1f} s for the whole command = "
          f"{pk[1] / (bp[1] + be[1]):.2f}x the bare profile + export (target <= 1.3x)")
EOF

cp "$W/summary.txt" "$OUT/summary.txt"
tar -C "$W" -cJf "$OUT/runs.tar.xz" --exclude='*.sqlite' --exclude='*.nsys-rep' \
  --exclude='*.qdstrm' .
echo
cat "$W/summary.txt"
echo "total $(secs "$START" "$(now)") s; files in $OUT:"
ls -l "$OUT"
