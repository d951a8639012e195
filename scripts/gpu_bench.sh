#!/usr/bin/env bash
# The benchmark on a CUDA machine, in one command of at most 8 minutes (4 more with 2+ GPUs):
#   scripts/gpu_bench.sh [key=value ...]        e.g. scripts/gpu_bench.sh runs=5
# Settings: configs/bench-gpu.yaml (bfloat16; the compiled modes use CUDA graphs on CUDA).
# Results: benchmarks/gpu/results.json and PNG plots (benchmarks/gpu-tp/ for tp over 2+ GPUs).
# At the time limit the run is interrupted like Ctrl-C: rows measured so far are kept and the
# plots are still written.
# PYTHON picks the interpreter (default: .venv/bin/python if present, else python3). It needs a
# CUDA build of torch and fastdecode's dependencies: pip install -e ".[bench]" transformers accelerate
# (transformers is optional: without it the transformers peers are reported as skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
LIMIT_S=${LIMIT_S:-480}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # works from a checkout without `pip install -e .`

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_bench.sh: torch sees no CUDA device (torch $("$PYTHON" -c 'import torch; print(torch.__version__)'))" >&2
    exit 1
fi
"$PYTHON" -c 'import torch; print("GPU:", torch.cuda.get_device_name(0), "| torch", torch.__version__)' >&2

# SIGINT first (the harness saves and plots), a hard kill 30 s later if that hangs.
status=0
timeout --signal=INT --kill-after=30 "$((LIMIT_S - 30))" \
    "$PYTHON" -m fastdecode.bench --config configs/bench-gpu.yaml "$@" || status=$?
if [ "$status" -eq 130 ] || [ "$status" -eq 124 ]; then
    echo "gpu_bench.sh: stopped at the time limit; the rows measured so far are in benchmarks/gpu/" >&2
    status=0
fi

# Tensor parallelism over every GPU (NCCL), when there are two or more: fastdecode's modes
# at tp=N against the single-GPU rows above. TP_LIMIT_S more seconds; TP_LIMIT_S=0 skips it.
TP_LIMIT_S=${TP_LIMIT_S:-240}
GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
if [ "$status" -eq 0 ] && [ "$GPUS" -ge 2 ] && [ "$TP_LIMIT_S" -gt 0 ]; then
    timeout --signal=INT --kill-after=30 "$TP_LIMIT_S" \
        "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$GPUS" -m fastdecode bench \
        --config configs/bench-gpu.yaml tp="$GPUS" modes=static modes=static+compile peers= \
        out=benchmarks/gpu-tp "$@" || echo "gpu_bench.sh: the tp=$GPUS run stopped early (exit $?)" >&2
fi
exit "$status"
