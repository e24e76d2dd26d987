# profkit kernels on a 2-rank export and on a 1-rank export of about as many kernels, an
# older profkit against this one, on the same machine in the same minutes: the committed
# 2-rank DDP export replicated N times (kernels_scale.py --ranks N builds the same pair),
# then ROUNDS (default 5) rounds of the four runs (older/this code x 2-rank/1-rank,
# --no-cache, fresh process each), wall and CPU from /usr/bin/time, output md5 beside each
# (the two codes' outputs must match). Then this code's in-process stages of each export.
#
#   git archive 9861b52 profkit | tar -x -C /tmp/before      # the older code
#   [ROUNDS=9] bash benchmarks/ranks_before_after.sh /tmp/before OUT_DIR [SITE] [N ...]
#
# SITE: an extra folder for PYTHONPATH (the GPU machine's wheels: /tmp/site). N: the
# replication factors of the 2-rank export (default 100).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BEFORE=$(cd "$1" && pwd); OUT=$2; SITE=${3:-}; shift $(( $# < 3 ? $# : 3 ))
SCALES=${*:-100}
mkdir -p "$OUT"; : > "$OUT/times.txt"
NEW="${SITE:+$SITE:}$ROOT"; OLD="${SITE:+$SITE:}$BEFORE"
W=$(mktemp -d /tmp/ranks-ba-XXXX); cd "$W"
{ nproc; uptime; nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null; } | tee -a "$OUT/times.txt"
run() { # label pythonpath export
  /usr/bin/time -f "$1: wall %e s cpu %U+%S s maxrss %M KiB" env PYTHONPATH=$2 \
    python3 -m profkit kernels "$3" --format json --no-cache > "$W/out.json" 2>> "$OUT/times.txt"
  echo "  output md5 $(md5sum < "$W/out.json" | cut -c1-12)" >> "$OUT/times.txt"
  tail -n 2 "$OUT/times.txt"
}
for n in $SCALES; do
  PYTHONPATH=$NEW python3 -c "
import sys; sys.path.insert(0, '$ROOT/benchmarks'); import kernels_scale as ks
from pathlib import Path
one = round($n * ks.fixture_kernels(ks.RANKS_FIXTURE) / ks.fixture_kernels(ks.FIXTURE))
for label, (fixture, copies, target) in {'2 ranks': (ks.RANKS_FIXTURE, $n, 'r2.sqlite'),
                                         '1 rank': (ks.FIXTURE, one, 'r1.sqlite')}.items():
    rows = ks.build(fixture, copies, Path('$W') / target)
    print(f'x$n {label}: {fixture.name} x{copies}: {rows[ks.KERNEL_TABLE]:,} kernels', flush=True)
" | tee -a "$OUT/times.txt"
  for i in $(seq "${ROUNDS:-5}"); do
    run "x$n 2 ranks, before" "$OLD" "$W/r2.sqlite"
    run "x$n 2 ranks, after" "$NEW" "$W/r2.sqlite"
    run "x$n 1 rank, before" "$OLD" "$W/r1.sqlite"
    run "x$n 1 rank, after" "$NEW" "$W/r1.sqlite"
  done
  PYTHONPATH=$NEW python3 "$ROOT/benchmarks/ranks_stages.py" "$W/r2.sqlite" >> "$OUT/stages.txt" 2>&1
  PYTHONPATH=$NEW python3 "$ROOT/benchmarks/ranks_stages.py" "$W/r1.sqlite" >> "$OUT/stages.txt" 2>&1
  rm -f "$W/r2.sqlite" "$W/r1.sqlite"
done
uptime | tee -a "$OUT/times.txt"
rm -rf "$W"
