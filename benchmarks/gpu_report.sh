#!/usr/bin/env bash
# `profkit report --run` on the GPU machine: the report a user sees before installing.
#
#   source .device/env.sh && bash benchmarks/gpu_report.sh        (outputs under $OUT)
#
# Runs the GPU plan (profkit/report/plan.py: GPU_PLAN) from the repository root with the
# default paths, so REPORT.md links `profiles/...` and `reports/...` as in the repo, then
# packs what to commit. Writes to $OUT (4 files, each well under 16 MiB):
#   reports.tar.xz     reports/ after the run: REPORT.md, its PNGs, the kernel reports it
#                      links (commit all of it: `tar -xJf reports.tar.xz` at the repo root)
#   results.db         the results DB the report was built from (bench, memory, attention)
#   profiles.tar.xz    the traces and snapshots it read (the .nsys-rep left out)
#   gpu_report.log     everything printed, with each piece's status and wall time
# Estimated 6-8 minutes on an H100 from an empty DB; each piece's line in the log says what it
# took, so GPU_PLAN can be trimmed. On a CPU the same script runs the tiny CPU plan.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .device/env.sh ] && source .device/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
LOG="$OUT/gpu_report.log"
started=$SECONDS
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  command -v nsys && nsys --version || echo "nsys: not found (the nsys piece will be skipped)"
} 2>&1 | tee "$LOG"

# SIGINT, not SIGTERM, at the limit: profkit stops like on Ctrl-C (children killed, every
# finished row kept), and the report is then written from what was measured.
timeout -s INT -k 20 ${RUN_LIMIT_S:-530} python3 -m profkit report --run 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "== profkit report --run: exit $rc after $((SECONDS - started)) s" | tee -a "$LOG"
if [ "$rc" -ne 0 ]; then
  echo "== the plan did not finish: the report from what was measured" | tee -a "$LOG"
  python3 -m profkit report 2>&1 | tee -a "$LOG"
fi

tar -cJf "$OUT/reports.tar.xz" reports
[ -f profiles/results.db ] && cp profiles/results.db "$OUT/results.db"
find profiles -maxdepth 1 -type f ! -name '*.nsys-rep' ! -name 'results.db' -print0 \
  | tar --null -cJf "$OUT/profiles.tar.xz" -T -
ls -la "$OUT" | tee -a "$LOG"
echo "== summary" | tee -a "$LOG"
grep -E '^(ran|present|skipped|failed) ' "$LOG" | tee "$OUT/summary.txt" >/dev/null
cat "$OUT/summary.txt"
sed -n '1,4p' reports/REPORT.md
rm -f "$OUT/summary.txt"
exit "$rc"
