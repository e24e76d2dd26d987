"""How long ``--workers N`` waits for its local Dask cluster, by how the workers start.

Each run is a fresh process that times, as ``profkit.cluster.client.dask_client`` starts
it, a ``distributed.LocalCluster`` of N single-thread worker processes and then 3 N tiny
tasks, each importing profkit's worker module (what a real first task imports), until
all have run. The ways tried:

- ``spawn``: the cluster as profkit starts it (Dask's default start method);
- ``forkserver``: each worker forked from a server that imported Dask and its packages;
- ``forkserver+profkit``: the same server also imports profkit's worker module;
- ``scale``: a cluster of no worker scaled to N, the tasks given before the workers are up.

Ways alternate, ``--repeats`` rounds; the medians are printed. No GPU is used.

    python benchmarks/cluster_start.py --workers 15 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
from typing import Any

WAYS = ("spawn", "forkserver", "forkserver+profkit", "scale")


def _task(i: int) -> int:
    import profkit.cluster.tasks  # noqa: F401  (what a real first task imports)

    return i


def one(workers: int, way: str) -> dict[str, Any]:
    """One start, timed in this process: imports, cluster, client, tasks, total (s)."""
    started = time.perf_counter()
    import dask

    settings = {}
    if way.startswith("forkserver"):
        settings["distributed.worker.multiprocessing-method"] = "forkserver"
    with dask.config.set(settings):
        import distributed
        from distributed.utils import get_mp_context

        if way == "forkserver+profkit":
            get_mp_context().set_forkserver_preload(
                ["distributed", "numpy", "pandas", "profkit.cluster.tasks"]
            )
        imported = time.perf_counter()
        kwargs: dict[str, Any] = dict(
            threads_per_worker=1, processes=True, dashboard_address=None,
            scheduler_kwargs={"dashboard_address": ":0"}, silence_logs=logging.CRITICAL,
        )  # fmt: skip
        if way == "scale":
            cluster = distributed.LocalCluster(n_workers=0, **kwargs)
            cluster.scale(workers)
        else:
            cluster = distributed.LocalCluster(n_workers=workers, **kwargs)
        made = time.perf_counter()
        with distributed.Client(cluster) as client:
            connected = time.perf_counter()
            futures = [client.submit(_task, i, pure=False) for i in range(3 * workers)]
            distributed.wait(futures)
            done = time.perf_counter()
            ran_on = len(client.scheduler_info()["workers"])
        cluster.close()
    return {
        "way": way, "workers": ran_on, "import_s": imported - started,
        "cluster_s": made - imported, "client_s": connected - made, "tasks_s": done - connected,
        "total_s": done - started,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", choices=WAYS, help=argparse.SUPPRESS)  # a run's child
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.workers, args.one)), flush=True)
        return 0
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    for round_ in range(args.repeats):
        for way in WAYS:
            argv = [sys.executable, __file__, "--workers", str(args.workers), "--one", way]
            done = subprocess.run(argv, capture_output=True, text=True, check=True)
            run = json.loads(done.stdout.strip().splitlines()[-1])
            runs[way].append(run)
            print(f"round {round_ + 1} {way:<19} total {run['total_s']:.2f} s "
                  f"(cluster {run['cluster_s']:.2f}, tasks {run['tasks_s']:.2f})", flush=True)  # fmt: skip
    print(f"\nmedians of {args.repeats} runs, {args.workers} workers:")
    for way, found in runs.items():
        parts = {k: statistics.median(r[k] for r in found) for k in found[0] if k.endswith("_s")}
        print(f"{way:<19} " + "  ".join(f"{k[:-2]} {v:.2f}" for k, v in parts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
