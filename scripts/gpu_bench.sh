#!/usr/bin/env bash
# The benchmark on a CUDA machine, in one command of at most 8 minutes:
#   scripts/gpu_bench.sh [key=value ...]        e.g. scripts/gpu_bench.sh runs=5
# Settings: configs/bench-gpu.yaml (bfloat16; the compiled modes use CUDA graphs on CUDA).
# Results: benchmarks/gpu/results.json and PNG plots. At the time limit the run is interrupted
# like Ctrl-C: rows measured so far are kept and the plots are still written.
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
    exit 0
fi
exit "$status"
