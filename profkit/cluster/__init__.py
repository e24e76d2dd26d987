"""A job's files read on Dask workers (``--workers N``, ``--scheduler ADDRESS``): the
connection and the map over files (:mod:`.client`), what a worker does with one file and
the job the client makes of the parts (:mod:`.tasks`). docs/MULTI_GPU.md, "A thousand ranks
on Dask"."""
