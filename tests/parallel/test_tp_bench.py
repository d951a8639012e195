"""`fastdecode bench tp=2` under torchrun: rank 0 writes the rows of the modes
that can shard, the package mode and the peers get their one-line reasons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_tp2_rows(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FASTDECODE_NO_PACKAGE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
         "fastdecode", "bench", "model=tiny", "tp=2", "modes=static", "modes=package", "peers=llama.cpp",
         "new_tokens=8", "runs=1", "plots=false", f"out={tmp_path}"],
        capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads((tmp_path / "results.json").read_text())["rows"]}
    assert rows["static"]["status"] == "ok" and rows["static"]["decode_tokens_per_s"] > 0
    assert "holds no collectives" in rows["package"]["error"]
    assert rows["llama.cpp"]["status"] == "skipped" and "one process" in rows["llama.cpp"]["error"]
    assert proc.stdout.count("results:") == 1  # rank 0 alone reports
