"""The benchmark loop: for each contender, each batch size x new tokens x prompt
length, one row. A row that fails is recorded with its error and the loop goes on."""

from __future__ import annotations

import gc
import itertools
import statistics
import sys
import time
from typing import Any, Callable, Optional

import torch

from ..errors import FastDecodeError
from ..cli.progress import progress
from .contenders import Contender, EngineContender, Timing, compile_counters
from .options import MODES, BenchSettings
from .peers import PeerSkipped, make_peer

Row = dict[str, Any]


class RowLog:
    """One line per finished row on stderr; on a terminal a live bar counts the
    calls of the row in progress (the first call can be a long compile)."""

    def __init__(self, total: int, stream=None):
        # sys.stderr at construction, not import: a tensor-parallel rank > 0 has filtered it by then.
        self.total, self.done, self.stream = total, 0, stream or sys.stderr

    def start(self, label: str) -> None:
        self.done += 1
        self.label = f"[{self.done}/{self.total}] {label}"

    def row(self, label: str, calls: int):
        self.start(label)
        return progress(self.label, total=calls, stream=self.stream)

    def finish(self, summary: str) -> None:
        self.stream.write(f"{self.label}: {summary}\n")
        self.stream.flush()


def make_prompts(vocab_size: int, batch_size: int, length: int, seed: int = 0) -> list[list[int]]:
    """Seeded token ids, the same for every contender with this vocabulary. Low ids
    are skipped: vocabularies keep their special and byte tokens there."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + length)
    low = min(256, vocab_size // 2)
    return torch.randint(low, vocab_size, (batch_size, length), generator=g).tolist()


def plan(s: BenchSettings) -> list[tuple[str, str]]:
    """(kind, name) of every contender: fastdecode modes first, then peers."""
    return [("mode", m) for m in s.modes] + [("peer", p) for p in s.peers]


def shapes(s: BenchSettings) -> list[tuple[int, int, int]]:
    return list(itertools.product(s.batch_sizes, s.new_tokens, s.prompt_lengths))


def build(kind: str, name: str, s: BenchSettings, shared: dict[str, Any]) -> Contender:
    if kind == "mode":
        if name not in MODES:
            raise FastDecodeError(f"unknown mode {name!r}; accepted: {', '.join(MODES)}")
        if name == "package" and s.tp != 1:
            raise FastDecodeError(f"the package mode runs an exported step, which holds no collectives; with "
                                  f"tp={s.tp} measure the other modes")
        return EngineContender(name, s)
    if s.tp != 1:
        raise PeerSkipped(f"peers run in one process; tp={s.tp} measures fastdecode's modes only")
    return make_peer(name, s, shared)


def run_bench(s: BenchSettings, add_row: Callable[[Row], None], log: Optional[RowLog] = None) -> None:
    """Measure everything `s` asks for, handing each row to `add_row` as soon as it exists."""
    if s.threads:
        torch.set_num_threads(s.threads)
    grid = shapes(s)
    log = log or RowLog(len(plan(s)) * len(grid))
    shared: dict[str, Any] = {}
    for kind, name in plan(s):
        engine = "fastdecode" if kind == "mode" else name
        try:
            contender = build(kind, name, s, shared)
        except PeerSkipped as e:
            _skip_all(log, grid, add_row, _failed_row(engine, name, "skipped", str(e)))
            continue
        except Exception as e:  # any failure to load is this contender's row, not the run's end
            _skip_all(log, grid, add_row, _failed_row(engine, name, "error", _describe(e)))
            continue
        for b, n, p in grid:
            with log.row(f"{name} batch={b} new={n} prompt={p}", 1 + s.warmup + s.runs) as bar:
                row = measure(contender, s, b, n, p, bar.update)
            add_row(row)
            log.finish(_summary(row))
            if row["status"] == "interrupted":
                raise KeyboardInterrupt
        contender.close()
        del contender
        gc.collect()
    shared.clear()


def _skip_all(log: RowLog, grid: list, add_row: Callable[[Row], None], row: Row) -> None:
    """A contender that could not be built gets one row; its grid counts as done."""
    log.done += len(grid) - 1
    log.start(row["name"])
    add_row(row)
    log.finish(_summary(row))


def measure(c: Contender, s: BenchSettings, b: int, n: int, p: int,
            tick: Callable[[], None] = lambda: None) -> Row:
    """One row: a first call (compiles, if any), `s.warmup` untimed runs, `s.runs` timed ones."""
    row = _base_row(c, b, n, p)
    if b > s.max_batch_size and c.engine != "fastdecode":  # fastdecode checks its own limit
        return _fail(row, "error", f"batch of {b} prompts exceeds max_batch_size={s.max_batch_size}")
    prompts = make_prompts(c.vocab_size, b, p)
    timed: list[Timing] = []
    try:
        before = compile_counters()
        t0 = time.perf_counter()
        first = c.run(prompts, n)
        row["first_call_s"] = time.perf_counter() - t0
        after_first = compile_counters()
        if c.compiles and before:
            row["compile_s"] = after_first["compile_s"] - before["compile_s"]
            row["graphs_compiled"] = after_first["graphs"] - before["graphs"]
        tick()
        for _ in range(s.warmup):
            c.run(prompts, n)
            tick()
        for _ in range(s.runs):
            timed.append(c.run(prompts, n))
            tick()
    except PeerSkipped as e:
        return _fail(row, "skipped", str(e))
    except KeyboardInterrupt:  # run_bench saves this row, then stops
        _fail(row, "interrupted", "interrupted before the row finished")
    except Exception as e:  # the row records the failure; the other rows still run
        _fail(row, "error", _describe(e))
    if c.compiles and "compile_s" in row:  # compiles after the first call are recompiles
        row["recompiles"] = compile_counters()["compiles"] - after_first["compiles"]
    if timed:  # even after a failure, runs already measured are kept
        row.update(_stats(timed, b, p, c.weight_bytes_per_token))
    elif row["status"] == "ok" and "first_call_s" in row:
        row.update(_stats([first], b, p, c.weight_bytes_per_token))
    return row


def _stats(timed: list[Timing], b: int, p: int, weight_bytes: int) -> Row:
    step_means = [statistics.fmean(t.step_s) for t in timed if t.step_s]
    ttft = statistics.median(t.ttft_s for t in timed)
    out: Row = {
        "runs": len(timed),
        "ttft_s": ttft,
        "prefill_tokens_per_s": b * p / ttft if ttft > 0 else None,
        "total_s": statistics.median(t.total_s for t in timed),
        "peak_memory_bytes": max((t.peak_memory_bytes or 0 for t in timed), default=0) or None,
    }
    if step_means:
        step = statistics.median(step_means)
        steps = min(len(t.step_s) for t in timed if t.step_s)
        out.update({
            "ms_per_step": step * 1e3,
            "ms_per_step_runs": [m * 1e3 for m in step_means],
            "decode_tokens_per_s": b / step,
            "decode_tokens_per_s_per_seq": 1 / step,
            "bandwidth_bytes_per_s": weight_bytes / step,
            # the median over runs at each step index, for the ms/step plot
            "step_ms": [statistics.median(t.step_s[i] for t in timed if len(t.step_s) > i) * 1e3
                        for i in range(steps)],
        })
    return out


def _base_row(c: Contender, b: int, n: int, p: int) -> Row:
    return {"engine": c.engine, "name": c.name, "batch_size": b, "new_tokens": n, "prompt_tokens": p,
            "status": "ok", "error": None, "dtype": getattr(c, "dtype", None),
            "source": getattr(c, "source", None), "weights": getattr(c, "weights", None), "load_s": c.load_s,
            "load_compile_s": c.load_compile_s,
            "weight_bytes_per_token": c.weight_bytes_per_token}


def _failed_row(engine: str, name: str, status: str, message: str) -> Row:
    return {"engine": engine, "name": name, "batch_size": None, "new_tokens": None, "prompt_tokens": None,
            "status": status, "error": message}


def _fail(row: Row, status: str, message: str) -> Row:
    row["status"], row["error"] = status, message
    return row


def _describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return text if isinstance(e, FastDecodeError) else f"{type(e).__name__}: {text}"


def _summary(row: Row) -> str:
    if row["status"] != "ok" and "ms_per_step" not in row:
        return f"{row['status']}: {row['error']}"
    text = f"{row.get('ms_per_step', float('nan')):.2f} ms/step, ttft {row.get('ttft_s', 0) * 1e3:.1f} ms"
    if row.get("first_call_s") is not None:
        text += f", first call {row['first_call_s']:.2f} s"
    return text if row["status"] == "ok" else f"{text} ({row['status']}: {row['error']})"
