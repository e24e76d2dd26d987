"""Running the workload: processes, sweeps, the results DB, and the machine they run on.

- ``proc``: one external command as a process tree that ends as a whole.
- ``child``: one config in its own ``python -m profkit.run.child`` process.
- ``bench``: the timing sweep (``profkit bench``), one child per config.
- ``results``: the SQLite results DB every sweep commits its rows to.
- ``environment``: where a measurement was taken (GPU, versions, commit, host, time).
- ``tools``: finding Nsight Systems, its version, exporting its reports to SQLite.
- ``doctor``: what this machine has and which commands can run here.
- ``quiet``: torch.profiler's starts and stops without Kineto's log lines on stderr.
- ``teardown``: ending the process without the interpreter's teardown after CUDA profiling.
"""
