#!/usr/bin/env bash
# One config through both backends, then `profkit kernels A B --compare` (issue 4's check:
# phase times per step should agree within 5%). Run on the GPU machine:
#   source .device/env.sh && bash benchmarks/gpu_crosscheck.sh     (outputs under $OUT)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}; W=$(mktemp -d); mkdir -p "$OUT"; cd "$W" || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
CFG=(--size "${SIZE:-large}" --ctx 256 --mode train --warmup 5)
python3 -m profkit nsys "${CFG[@]}" --steps 3 --name xc-nsys --format json > nsys.json 2> nsys.err \
  || tail -3 nsys.err
python3 -m profkit torch "${CFG[@]}" --steps 1 --name xc-torch --format json > torch.json 2> torch.err \
  || tail -3 torch.err
python3 -m profkit kernels profiles/xc-nsys.sqlite profiles/xc-torch-train.json.gz --compare \
  --format md --out "$OUT/crosscheck.md"
cat "$OUT/crosscheck.md"
