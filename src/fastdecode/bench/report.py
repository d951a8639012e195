"""Results of one bench run: rows saved as they arrive, ratios against the peers,
and the terminal table.

The JSON file is rewritten atomically after every row, so a crash or Ctrl-C
loses nothing already measured.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

from ..kernels.select import cpu_model

SCHEMA = "fastdecode-bench/1"
RESULTS = "results.json"


def machine_info(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_model": cpu_model() or platform.processor() or "unknown", "cpu_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    for dist in ("transformers", "llama_cpp_python"):
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info[dist] = None
    return info


class BenchReport:
    """Collects rows and keeps `<out>/results.json` current."""

    def __init__(self, out: str, settings: Any, machine: dict[str, Any], command: Optional[str] = None):
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / RESULTS
        _keep_previous(self.path)
        self.data: dict[str, Any] = {
            "schema": SCHEMA,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "finished": None, "interrupted": False, "command": command,
            "machine": machine, "settings": dataclasses.asdict(settings),
            "probe": None, "rows": [], "ratios": [], "plots": [],
        }
        self.save()

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.data["rows"]

    def set_probe(self, probe: dict[str, Any]) -> None:
        self.data["probe"] = probe
        self.save()

    def add_row(self, row: dict[str, Any]) -> None:
        bw = (self.data["probe"] or {}).get("bytes_per_s")
        if row.get("bandwidth_bytes_per_s") and bw:
            row["bandwidth_fraction"] = row["bandwidth_bytes_per_s"] / bw
        self.rows.append(row)
        self.data["ratios"] = ratios(self.rows)
        self.save()

    def finish(self, interrupted: bool = False, plots: Optional[list[str]] = None) -> None:
        self.data["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.data["interrupted"] = interrupted
        self.data["plots"] = plots or []
        self.save()

    def save(self) -> None:
        write_json(self.path, self.data)


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write a temporary file next to `path`, then rename over it: readers (and a
    crash mid-write) only ever see a complete file. Creates the folder."""
    folder = os.path.dirname(os.fspath(path)) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".results-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=str)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _keep_previous(path: Path) -> None:
    """An earlier run's results are renamed with their time stamp, never overwritten."""
    if path.exists():
        stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y%m%d-%H%M%S")
        path.rename(path.with_name(f"results-{stamp}.json"))


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """fastdecode over each peer on the same shape: > 1 means fastdecode is faster."""
    ok = [r for r in rows if r.get("decode_tokens_per_s")]
    ours = [r for r in ok if r["engine"] == "fastdecode"]
    peers = [r for r in ok if r["engine"] != "fastdecode"]
    out = []
    for r in ours:
        for q in peers:
            if (r["batch_size"], r["new_tokens"], r["prompt_tokens"]) != (
                    q["batch_size"], q["new_tokens"], q["prompt_tokens"]):
                continue
            out.append({
                "mode": r["name"], "peer": q["name"], "batch_size": r["batch_size"],
                "new_tokens": r["new_tokens"], "prompt_tokens": r["prompt_tokens"],
                "decode_speedup": r["decode_tokens_per_s"] / q["decode_tokens_per_s"],
                "ttft_speedup": q["ttft_s"] / r["ttft_s"] if r.get("ttft_s") else None,
            })
    return out


# -- terminal table ---------------------------------------------------------------------

_COLUMNS = [  # (header, key, format)
    ("engine", "engine", "{}"), ("mode", "name", "{}"), ("B", "batch_size", "{}"),
    ("new", "new_tokens", "{}"), ("prompt", "prompt_tokens", "{}"),
    ("first call s", "first_call_s", "{:.2f}"), ("compile s", "compile_s", "{:.2f}"),
    ("recomp", "recompiles", "{}"), ("ms/step", "ms_per_step", "{:.2f}"),
    ("tok/s", "decode_tokens_per_s", "{:.1f}"), ("tok/s/seq", "decode_tokens_per_s_per_seq", "{:.1f}"),
    ("ttft ms", "ttft_s", "{:.1f}"), ("prefill tok/s", "prefill_tokens_per_s", "{:.0f}"),
    ("peak MiB", "peak_memory_bytes", "{:.0f}"), ("GB/s", "bandwidth_bytes_per_s", "{:.2f}"),
    ("% bw", "bandwidth_fraction", "{:.0%}"),
]
_SCALE = {"ttft_s": 1e3, "peak_memory_bytes": 2**-20, "bandwidth_bytes_per_s": 1e-9}


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    return fmt.format(value * _SCALE.get(key, 1))


def format_table(report: dict[str, Any]) -> str:
    rows = report["rows"]
    table = [[h for h, _, _ in _COLUMNS]] + [[_cell(r, k, f) for _, k, f in _COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in table]
    notes = [f"  {_shape(r)}: {r['status']}: {r['error']}" for r in rows if r["status"] != "ok"]
    if notes:
        lines += ["", "not measured / failed:"] + notes
    if report.get("ratios"):
        lines += ["", "decode tokens/s, fastdecode / peer (> 1: fastdecode faster):"]
        lines += [f"  {q['mode']:>17} vs {q['peer']:<17} B={q['batch_size']} new={q['new_tokens']} "
                  f"prompt={q['prompt_tokens']}: {q['decode_speedup']:.2f}x decode, "
                  f"{_x(q['ttft_speedup'])} time to first token" for q in report["ratios"]]
    probe = report.get("probe")
    if probe:
        lines += ["", f"memory bandwidth probe: {probe['bytes_per_s'] / 1e9:.1f} GB/s"]
    return "\n".join(lines)


def _shape(r: dict[str, Any]) -> str:
    if r.get("batch_size") is None:
        return r["name"]
    return f"{r['name']} B={r['batch_size']} new={r['new_tokens']} prompt={r['prompt_tokens']}"


def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"
