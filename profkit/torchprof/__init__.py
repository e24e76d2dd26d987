"""torch.profiler as a launcher: ``profkit torch`` (key_averages tables, Chrome traces).

- ``profile``: the profiled runs of the built-in model (forward-only and the full step).
- ``tables``: ``key_averages()`` as a DataFrame with the course's columns.
- ``report``: the markdown report of a run.
"""
