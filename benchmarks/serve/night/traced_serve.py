"""`fastdecode serve` with each engine step's plan (decode rows, prefill chunks) and its start and
end times logged, written to $TRACE_OUT (JSON) when the server stops. For measurement only:
it wraps Scheduler.schedule and Engine.step from outside.

    FASTDECODE="python benchmarks/serve/night/traced_serve.py" TRACE_OUT=steps.json \\
      benchmarks/serve/run.sh fastdecode load OUT.json --clients 16 --rounds 4 --ignore-eos
    python benchmarks/serve/night/trace_summary.py steps.json
"""

import atexit
import json
import os
import signal
import sys
import time

from fastdecode.cli.main import main
from fastdecode.engine.engine import Engine
from fastdecode.engine.scheduler import Scheduler

log: list[list] = []  # per step: [start, decode rows, prefill rows, chunk length, end]
schedule, step = Scheduler.schedule, Engine.step


def traced_schedule(self):
    plan = schedule(self)
    log.append([time.perf_counter(), len(plan.decode), len(plan.prefill), plan.prefill_len])
    return plan


def traced_step(self):
    step(self)
    if log and len(log[-1]) == 4:
        log[-1].append(time.perf_counter())


Scheduler.schedule, Engine.step = traced_schedule, traced_step
atexit.register(lambda: json.dump(log, open(os.environ.get("TRACE_OUT", "steps.json"), "w")))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # run.sh stops the server with SIGTERM
sys.exit(main())
