#!/usr/bin/env bash
# Fixtures of training that runs inside frameworks (truth marks) and of planted problems.
#
#   source .device/env.sh && bash benchmarks/gpu_frameworks.sh --part single   # 1 GPU, < 8 min
#   source .device/env.sh && bash benchmarks/gpu_frameworks.sh --part multi    # >= 2 GPUs, < 8 min
#   bash benchmarks/gpu_frameworks.sh --dry-run [--part multi]   # print the commands only
#   bash benchmarks/gpu_frameworks.sh --device cpu [--only REGEX] # torch.profiler runs on CPU, no nsys
#
# Each capture is a few steps of a tiny model (GPT-2 of 2 blocks, d 128; examples/plants.py's
# small LM), taken twice: under `nsys profile -t cuda,nvtx --capture-range=cudaProfilerApi`
# (exported to SQLite, xz -9: nsys-VER-GPU-NAME.sqlite.xz) and with torch.profiler (one
# Chrome trace per rank: torch-GPU-NAME-rank{r}.json.gz). Programs:
#   examples/frameworks/lightning_gpt2.py and hf_trainer.py: NVTX "truth" marks of each phase
#     (domain truth); torch traces with --truth-record-function hold them as truth:* ranges,
#     the "-bare" ones hold none (nothing but what the frameworks emit);
#   examples/plants.py: one planted problem each (sleep, sync, tiny, foreach; straggler on 2).
# single: Lightning and HF Trainer on 1 GPU (plain, --accumulate 2, --checkpointing), plants.
# multi: 2 ranks under torchrun: Lightning DDP and FSDP, HF Trainer DDP, plants straggler/DDP.
# $OUT gets at most 7 files: frameworks-PART.log (everything printed), frameworks-PART-summary.txt
# (per capture: exit code, seconds, sizes, truth/phase range counts read back from the files
# against the counts the programs printed) and frameworks-PART-N.tar (the captures, logs and
# manifest.json, split at 15 MiB). Captures are skipped, in order, once the budget would pass.
set -uo pipefail

part=single device=cuda dry=0 only=.
while (($#)); do
  case $1 in
    --part) part=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --only) only=$2; shift 2 ;;
    *) echo "usage: $0 [--part single|multi] [--device cuda|cpu] [--dry-run] [--only REGEX]" >&2; exit 2 ;;
  esac
done
[[ $part == single || $part == multi ]] || { echo "--part single|multi" >&2; exit 2; }

# NVLink multicast off in every process, before anything starts (shared hosts' GPUs).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu_frameworks_out}
BUDGET=${BUDGET:-450}  # seconds for the captures; packing the files takes a few more
SCALE=1  # time limits are for the GPU machine; a 2-core CPU run needs far longer
[[ $device == cpu ]] && SCALE=${SCALE_CPU:-6}
STEPS=${STEPS:-5} PROFILE_STEPS=${PROFILE_STEPS:-3}  # frameworks: 2 warm-up + 3 profiled steps
W=$(mktemp -d /tmp/gpu-frameworks.XXXXXX)
K=$W/keep  # what goes into the tars
mkdir -p "$K/logs"; ((dry)) || mkdir -p "$OUT"
START=$(date +%s)
LOG=$OUT/frameworks-$part.log
((dry)) && LOG=/dev/null
exec > >(tee "$LOG") 2>&1
tee_pid=$!

nproc=1
if [[ $part == multi ]]; then
  nproc=2
  if [[ $device == cuda && $dry == 0 ]]; then
    gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
    if ((gpus < 2)); then
      echo "--part multi needs 2 GPUs; nvidia-smi -L lists $gpus: nothing to do"
      exit 0
    fi
  fi
fi

nsys_ok=0
if [[ $device == cuda ]] && { ((dry)) || command -v nsys >/dev/null; }; then nsys_ok=1; fi
gpu=cpu nsysver=none
if [[ $device == cuda && $dry == 0 ]]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200|a100|l40s?|b200' | tr 'A-Z' 'a-z')
  gpu=${gpu:-gpu}
  nvidia-smi -L
fi
((nsys_ok && !dry)) && nsysver=$(nsys --version | grep -oE '[0-9]{4}\.[0-9]+' | head -1)
((dry)) && gpu=h100 nsysver=2025.3
tag=$gpu
[[ $part == multi ]] && tag=${gpu}x2
echo "== part $part, device $device, tag $tag, nsys ${nsysver}, budget ${BUDGET}s, work dir $W"
if ((!dry)); then
  "$PY" - <<'PY' || { echo "missing packages (carry the nvtx wheel; see .device/env.sh)"; exit 1; }
from importlib.metadata import version

import accelerate, nvtx, torch, transformers

try:
    import pytorch_lightning as pl
except ImportError:
    import lightning.pytorch as pl
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count(),
      "| lightning", pl.__version__, "| transformers", transformers.__version__,
      "| accelerate", accelerate.__version__, "| nvtx", version("nvtx"))
PY
fi

FW=$ROOT/examples/frameworks
PLANTS=$ROOT/examples/plants.py
launcher() {  # the command that starts $nproc ranks of a Python program
  if ((nproc > 1)); then
    echo "$PY -m torch.distributed.run --standalone --nproc-per-node $nproc --max-restarts 0"
  else
    echo "$PY"
  fi
}
if [[ $part == single && $device == cuda ]]; then
  # One GPU even on a host of several (the HF Trainer would take them all, DataParallel).
  first=${CUDA_VISIBLE_DEVICES:-0}
  export CUDA_VISIBLE_DEVICES=${first%%,*}
fi

record() {  # name kind stem rc seconds files... -> one manifest line (the log: logs/STEM.log)
  "$PY" -c 'import json, sys; a = sys.argv; print(json.dumps({"name": a[1], "kind": a[2], "stem": a[3], "rc": int(a[4]), "seconds": int(a[5]), "nproc": int(a[6]), "command": a[7], "files": a[8:]}))' \
    "$1" "$2" "$3" "$4" "$5" "$nproc" "$CMD" "${@:6}" >>"$K/captures.jsonl"
}
over_budget() {  # limit: would a capture of this limit end past the budget?
  local elapsed=$(($(date +%s) - START))
  ((elapsed + $1 > BUDGET))
}
selected() { [[ $1 =~ $only ]]; }

# nsys NAME LIMIT PROGRAM ARGS...: profile (cudaProfilerApi range), export, xz in the background.
nsys_capture() {
  local name=$1 limit=$(($2 * SCALE)); shift 2
  selected "$name" || return 0
  local file=nsys-$nsysver-$tag-$name
  CMD="nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none --capture-range=cudaProfilerApi --capture-range-end=stop --force-overwrite=true -o $W/$file $(launcher) $* --device $device --capture-range"
  if ((!nsys_ok)); then echo "-- skip $file: no nsys (or --device cpu)"; return 0; fi
  if ((dry)); then echo "$CMD"; echo "nsys export --type sqlite -o $W/$file.sqlite $W/$file.nsys-rep; xz -9"; return 0; fi
  if over_budget $((limit + 30)); then echo "-- skip $file: budget"; record "$name" nsys "$file" -1 0; return 0; fi
  echo "== $file: $CMD"
  local t0=$SECONDS rc
  # shellcheck disable=SC2086
  timeout -s INT -k 15 "$limit" $CMD >"$K/logs/$file.log" 2>&1
  rc=$?
  if [[ -f $W/$file.nsys-rep ]]; then
    timeout 90 nsys export --type sqlite --force-overwrite=true -o "$W/$file.sqlite" "$W/$file.nsys-rep" \
      >>"$K/logs/$file.log" 2>&1 || rc=$((rc ? rc : 90))
  else
    rc=$((rc ? rc : 91))
  fi
  if ((rc == 0)); then
    xz -9 -T1 -c "$W/$file.sqlite" >"$K/$file.sqlite.xz" &
    xz_jobs+=($!)
  fi
  record "$name" nsys "$file" "$rc" $((SECONDS - t0)) "$file.sqlite.xz"
  echo "   exit $rc, $((SECONDS - t0)) s; $(grep -cE '^(TRUTH|PLANTED) ' "$K/logs/$file.log") result lines"
  grep -E 'Error|error:' "$K/logs/$file.log" | tail -3
}

# torch NAME LIMIT PROGRAM ARGS...: torch.profiler, one Chrome trace per rank.
torch_capture() {
  local name=$1 limit=$(($2 * SCALE)); shift 2
  selected "$name" || return 0
  local stem=torch-$tag-$name
  CMD="$(launcher) $* --device $device --torch-profiler --trace-dir $K --name $stem"
  if ((dry)); then echo "$CMD"; return 0; fi
  if over_budget "$limit"; then echo "-- skip $stem: budget"; record "$name" torch "$stem" -1 0; return 0; fi
  echo "== $stem: $CMD"
  local t0=$SECONDS rc files=()
  # shellcheck disable=SC2086
  timeout -s INT -k 15 "$limit" $CMD >"$K/logs/$stem.log" 2>&1
  rc=$?
  for ((r = 0; r < nproc; r++)); do files+=("$stem-rank$r.json.gz"); done
  record "$name" torch "$stem" "$rc" $((SECONDS - t0)) "${files[@]}"
  echo "   exit $rc, $((SECONDS - t0)) s; $(grep -cE '^(TRUTH|PLANTED) ' "$K/logs/$stem.log") result lines"
  grep -E 'Error|error:' "$K/logs/$stem.log" | tail -3
}

L="$FW/lightning_gpt2.py --steps $STEPS --profile-steps $PROFILE_STEPS"
H="$FW/hf_trainer.py --steps $STEPS --profile-steps $PROFILE_STEPS"
P="$PLANTS --warmup 3 --steps 3"
RF=--truth-record-function
: >"$K/captures.jsonl"
xz_jobs=()
if [[ $part == single ]]; then
  # In order of need: a capture is skipped once the budget would pass.
  nsys_capture lightning 100 $L
  torch_capture lightning 75 $L $RF
  nsys_capture hf 100 $H
  torch_capture hf 75 $H $RF
  nsys_capture plants-baseline 45 $P
  nsys_capture plants-sleep 45 $P --sleep-ms 5
  nsys_capture plants-sync 45 $P --sync
  nsys_capture plants-tiny 45 $P --tiny
  nsys_capture plants-foreach 45 $P --foreach
  nsys_capture lightning-acc2 100 $L --accumulate 2
  nsys_capture hf-acc2 100 $H --accumulate 2
  nsys_capture lightning-ckpt 100 $L --checkpointing
  nsys_capture hf-ckpt 100 $H --checkpointing
  torch_capture lightning-bare 75 $L
  torch_capture hf-bare 75 $H
  torch_capture plants-baseline 30 $P
  torch_capture plants-sleep 30 $P --sleep-ms 5
  torch_capture plants-sync 30 $P --sync
  torch_capture plants-tiny 30 $P --tiny
  torch_capture plants-foreach 30 $P --foreach
  torch_capture lightning-acc2 75 $L --accumulate 2 $RF
  torch_capture hf-acc2 75 $H --accumulate 2 $RF
  torch_capture lightning-ckpt 75 $L --checkpointing $RF
  torch_capture hf-ckpt 75 $H --checkpointing $RF
else
  nsys_capture lightning-ddp2 130 $L
  torch_capture lightning-ddp2 100 $L $RF
  nsys_capture hf-ddp2 130 $H
  torch_capture hf-ddp2 100 $H $RF
  nsys_capture plants-straggler2 70 $P --sleep-rank 1 --sleep-ms 20
  torch_capture plants-straggler2 50 $P --sleep-rank 1 --sleep-ms 20
  nsys_capture plants-ddp2 70 $P
  if [[ $device == cuda ]]; then  # Lightning refuses FSDP on CPU
    nsys_capture lightning-fsdp2 130 $L --strategy fsdp
    torch_capture lightning-fsdp2 100 $L --strategy fsdp $RF
  fi
  torch_capture plants-ddp2 50 $P
  nsys_capture lightning-ddp2-acc2 130 $L --accumulate 2
  nsys_capture hf-ddp2-acc2 130 $H --accumulate 2
  torch_capture lightning-ddp2-bare 100 $L
fi
if ((dry)); then rm -rf "$W"; exit 0; fi
# The xz jobs only: a bare `wait` would wait for the log's tee, which waits for this script.
((${#xz_jobs[@]})) && wait "${xz_jobs[@]}"
echo "== captures done in $(($(date +%s) - START)) s"

# Read every file back: the truth and phase ranges it holds, against what the programs printed;
# then the manifest, the summary, and the tars.
"$PY" - "$W" "$K" "$OUT" "$part" <<'PY'
import gzip, json, re, sqlite3, sys, tarfile
from collections import Counter
from pathlib import Path

work, keep, out, part = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
PHASES = ("forward", "backward", "optimizer")


def printed(log: Path) -> list[dict]:
    rows = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        m = re.match(r"^(TRUTH|PLANTED) (\{.*\})\s*$", line)
        if m:
            rows.append(json.loads(m.group(2)))
    return rows


def expected(rows: list[dict]) -> dict:
    """Marks in the window, summed over ranks (TRUTH); phase ranges (PLANTED: steps x ranks)."""
    total = Counter()
    for row in rows:
        if "truth_marks_in_window" in row:
            total.update({f"truth:{k}": v for k, v in row["truth_marks_in_window"].items()})
        elif row.get("program") == "plants":
            total.update({p: row["steps"] * row["world_size"] for p in PHASES})
    return dict(total)


def nsys_counts(path: Path) -> dict:
    con = sqlite3.connect(path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    counts = Counter()
    if "NVTX_EVENTS" in tables:
        cols = {r[1] for r in con.execute("PRAGMA table_info(NVTX_EVENTS)")}
        text = "coalesce(e.text, s.value)" if "textId" in cols else "e.text"
        join = "LEFT JOIN StringIds s ON s.id = e.textId" if "textId" in cols else ""
        dom = "ifnull(e.domainId, 0)" if "domainId" in cols else "0"
        pid = "(ifnull(e.globalTid, 0) >> 24) & 16777215"  # domain ids are per process
        domains = {
            (p, d): name
            for p, d, name in con.execute(
                f"SELECT {pid}, {dom}, {text} FROM NVTX_EVENTS e {join} WHERE eventType = 75"
            )
        }
        for p, d, name, n in con.execute(
            f"SELECT {pid}, {dom}, {text}, count(*) FROM NVTX_EVENTS e {join} "
            "WHERE eventType IN (59, 60, 70, 71) GROUP BY 1, 2, 3"
        ):
            domain = domains.get((p, d), "" if d == 0 else f"domain{d}")
            counts[f"{domain}:{name}" if domain else str(name)] += n
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:  # the host syncs and copies the plants count
        for name, n in con.execute(
            "SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
            "JOIN StringIds s ON s.id = r.nameId GROUP BY 1"
        ):
            if "Synchronize" in name or "Memcpy" in name:
                counts[f"api:{name.split('_v')[0]}"] += n
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
        if table in tables:
            counts[table.rsplit("_", 1)[1].lower() + "s"] = con.execute(
                f"SELECT count(*) FROM {table}"
            ).fetchone()[0]
    con.close()
    return dict(counts)


def torch_counts(path: Path) -> dict:
    events = json.load(gzip.open(path))["traceEvents"]
    counts = Counter()
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "user_annotation" and (
            e["name"].startswith("truth:") or e["name"] in PHASES
        ):
            counts[e["name"]] += 1
        elif e.get("cat") == "kernel":
            counts["kernels"] += 1
        elif e.get("cat") == "cuda_runtime" and ("Synchronize" in e["name"] or "Memcpy" in e["name"]):
            counts[f"api:{e['name']}"] += 1
    return dict(counts)


captures = [json.loads(l) for l in (keep / "captures.jsonl").read_text().splitlines() if l]
lines = []
for cap in captures:
    cap["printed"] = printed(keep / "logs" / f"{cap['stem']}.log")
    cap["expected"] = expected(cap["printed"])
    found, sizes = Counter(), {}
    for name in cap["files"]:
        f = keep / name
        sizes[name] = f.stat().st_size if f.exists() else None
        try:
            if name.endswith(".sqlite.xz") and (work / name[:-3]).exists():
                found.update(nsys_counts(work / name[:-3]))
            elif name.endswith(".json.gz") and f.exists():
                found.update(torch_counts(f))
        except Exception as error:  # a damaged file: say so, keep going
            found["read_error"] += 1
            print(f"{name}: {error}")
    cap["found"], cap["sizes"] = dict(found), sizes
    keys = sorted(k for k in cap["expected"])
    shown = {k: f"{found.get(k, 0)}/{cap['expected'][k]}" for k in keys}
    ok = cap["rc"] == 0 and all(found.get(k, 0) == v for k, v in cap["expected"].items())
    ok = ok and all(s for s in sizes.values())
    mib = sum(s or 0 for s in sizes.values()) / 2**20
    lines.append(
        f"{'skip' if cap['rc'] == -1 else 'ok  ' if ok else 'BAD '} {cap['kind']:5} {cap['name']:22} exit {cap['rc']:3} "
        f"{cap['seconds']:4d} s {mib:6.2f} MiB  found/printed {shown} "
        f"kernels {found.get('kernels', 0)} "
        f"{ {k[4:]: v for k, v in sorted(found.items()) if k.startswith('api:')} or ''}"
        + (f" other ranges {sorted(k for k in found if ':' in k and not k.startswith('truth:'))[:4]}"
           if cap["kind"] == "nsys" else "")
    )
(keep / "manifest.json").write_text(json.dumps(captures, indent=1))
out.mkdir(parents=True, exist_ok=True)
summary = "\n".join(lines) + "\n"
(out / f"frameworks-{part}-summary.txt").write_text(summary)
print(summary)

# Tars of at most 15 MiB each (the files come back at 16 MiB at most, 8 in all).
files = sorted(p for p in keep.rglob("*") if p.is_file())
files.sort(key=lambda p: (p.suffix not in (".json", ".jsonl", ".log"), p.name))
packs, size = [[]], 0
for p in files:
    s = p.stat().st_size
    if packs[-1] and size + s > 15 * 2**20:
        packs.append([])
        size = 0
    packs[-1].append(p)
    size += s
if len(packs) > 5:
    print(f"WARNING: {len(packs)} tars; only 5 are written (8 files at most come back)")
for i, pack in enumerate(packs[:5]):
    with tarfile.open(out / f"frameworks-{part}-{i}.tar", "w") as tar:
        for p in pack:
            tar.add(p, arcname=str(p.relative_to(keep)))
    print(f"{out}/frameworks-{part}-{i}.tar: {len(pack)} files")
PY
echo "== done in $(($(date +%s) - START)) s"
[[ -n ${KEEP_WORK:-} ]] || rm -rf "$W"
ls -la "$OUT"
exec >&- 2>&-
wait "$tee_pid" 2>/dev/null || sleep 1  # the log's last lines are in $OUT before we return
