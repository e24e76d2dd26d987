"""The workload: what profkit runs and measures (no profiler, no files, no terminal).

- ``specs``: the model sizes, their shapes and analytic parameter counts (no torch).
- ``config``: :class:`~profkit.workload.config.WorkloadConfig`, the one dataclass the CLI,
  the sweep and the child process share, and the choices each field allows.
- ``annotate``: the phase and attention range names, and the NVTX/record_function ranges.
- ``model``: the CS336 ``BasicsTransformerLM``.
- ``step``: one training step split into annotated, timed phases.
- ``flops``: analytic FLOPs of a step and of the attention sub-ranges; peak TFLOP/s per GPU.

Importing this package imports no torch; ``model`` and ``step`` do.
"""
