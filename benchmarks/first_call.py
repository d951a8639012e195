"""First call from process start: import, load, first generation, with a
package from `fastdecode export` (or a compile strategy). Prints one JSON line.

    .venv/bin/python benchmarks/first_call.py smollm2-135m-instruct --compiled smollm2.pt2
    TORCHINDUCTOR_CACHE_DIR=<dir> .venv/bin/python benchmarks/first_call.py smollm2-135m-instruct --compile decode
"""

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402

import fastdecode  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--compiled", default=None)
p.add_argument("--compile", default="none")
a = p.parse_args()
llm = fastdecode.load(a.model, compiled=a.compiled, compile=a.compile)
loaded = time.perf_counter()
llm.generate("Tell me a joke", max_new_tokens=4, temperature=0)
done = time.perf_counter()
print(json.dumps({"model": a.model, "compiled": a.compiled, "compile": a.compile,
                  "import_and_load_s": round(loaded - T0, 2), "first_generate_s": round(done - loaded, 2),
                  "first_call_s": round(done - T0, 2)}))
