# profkit kernels on the x1000 export, an older profkit against this one, on the same
# machine in the same minutes: the scan floor, then the two codes alternating (--no-cache,
# three times each), then this code's first read that writes the cache and four repeated
# queries from it, then the stages of this code's read and analysis. Outputs must match
# (their md5 is printed beside each time).
#
#   git archive 23559f9 profkit | tar -x -C /tmp/before      # the older code
#   bash benchmarks/kernels_before_after.sh /tmp/before OUT_DIR [SITE]
#
# SITE: an extra folder for PYTHONPATH (the GPU machine's wheels: /tmp/site).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BEFORE=$(cd "$1" && pwd); OUT=$2; SITE=${3:-}
mkdir -p "$OUT"; : > "$OUT/times.txt"
NEW="${SITE:+$SITE:}$ROOT"; OLD="${SITE:+$SITE:}$BEFORE"
W=$(mktemp -d /tmp/kscale-ba-XXXX); cd "$W"
nproc; uptime; nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true
python3 -c "
import sys, time; sys.path.insert(0, '$ROOT/benchmarks'); import kernels_scale as ks
from pathlib import Path
t=time.time(); print(ks.build(ks.FIXTURE, 8000, Path('$W/x1000.sqlite')), round(time.time()-t,1), flush=True)"
run() { # label pythonpath args...
  local label=$1 pp=$2; shift 2
  /usr/bin/time -f "$label: wall %e s cpu %U+%S s maxrss %M KiB" env PYTHONPATH=$pp python3 "$@" > $W/out.json 2>> $OUT/times.txt
  echo "  output md5 $(md5sum < $W/out.json | cut -c1-12)" >> $OUT/times.txt
  tail -n 2 $OUT/times.txt
}
for i in 1 2 3; do
  python3 -c "
import sys; sys.path.insert(0, '$ROOT/benchmarks'); import kernels_scale as ks
from pathlib import Path
r = ks.timed([sys.executable, '-c', ks.SCAN, '$W/x1000.sqlite', *ks.SCANNED], Path('$W'))
print('floor: wall %.2f s cpu %.2f s' % (r['wall_s'], r['cpu_s']))" | tee -a $OUT/times.txt
  run "before --no-cache" $OLD -m profkit kernels $W/x1000.sqlite --format json --no-cache
  run "after --no-cache" $NEW -m profkit kernels $W/x1000.sqlite --format json --no-cache
done
PROFKIT_CACHE_DIR=$W/c2 run "after, first read writes cache" $NEW -m profkit kernels $W/x1000.sqlite --format json
PROFKIT_CACHE_DIR=$W/c2 run "after, hit --phase backward" $NEW -m profkit kernels $W/x1000.sqlite --format json --phase backward
PROFKIT_CACHE_DIR=$W/c2 run "after, hit --range 'computing softmax'" $NEW -m profkit kernels $W/x1000.sqlite --format json --range "computing softmax"
PROFKIT_CACHE_DIR=$W/c2 run "after, hit --top 0" $NEW -m profkit kernels $W/x1000.sqlite --format json --top 0
PROFKIT_CACHE_DIR=$W/c2 run "after, hit diff BIG BIG" $NEW -m profkit diff $W/x1000.sqlite $W/x1000.sqlite --format json
PYTHONPATH=$NEW python3 $ROOT/benchmarks/read_threads.py $W/x1000.sqlite --threads 4 > $OUT/stages.json 2>&1
tail -n 24 $OUT/stages.json
uptime
rm -rf "$W"
