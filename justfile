# profkit's task runner. `just` lists the recipes.
default:
    @just --list

# Install profkit and its dev tools into the current environment (CPU torch first).
install:
    python -m pip install torch==2.13.0
    python -m pip install -e '.[dev]'

# Run the test suite (GPU tests skip on a CPU-only machine).
test *ARGS:
    python -m pytest -q {{ARGS}}

# Lint and type-check.
lint:
    ruff format --check profkit tests benchmarks
    ruff check profkit tests benchmarks
    mypy profkit

# Format the code.
fmt:
    ruff format profkit tests benchmarks
    ruff check --fix profkit tests benchmarks

# The README's main job: profile, benchmark and report (CPU-only if there is no GPU).
demo:
    python -m profkit demo

# profkit kernels on a ~3 M-kernel export replicated from a fixture: time and peak memory.
bench-kernels *ARGS:
    python benchmarks/kernels_scale.py {{ARGS}}

# On a GPU machine: the tests that need CUDA (and nsys where present).
test-gpu:
    python -m pytest -q -m "gpu or nsys" -rs

# On a GPU machine: the bench runs of issue 2 (course table, an OOM sweep, timing overhead) into $OUT.
gpu-bench:
    bash benchmarks/gpu_bench.sh

# On the GPU machine: memory fixtures, the 2.7B memory study and an OOM (outputs under $OUT).
gpu-memory:
    bash benchmarks/gpu_memory.sh

# On the GPU machine: profkit torch fixtures, the large report, the cross-check's torch side.
gpu-torch:
    bash benchmarks/gpu_torch.sh

# On the GPU machine: `profkit report --run` (the course report), reports/ packed into $OUT.
gpu-report:
    bash benchmarks/gpu_report.sh
