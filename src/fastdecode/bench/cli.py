"""`fastdecode bench [--config FILE] [key=value ...]`: measure, save, plot, print."""

from __future__ import annotations

import shlex
import sys

from ..config import resolve_device
from ..cli.command import run_command
from .options import BenchSettings
from .plots import PlotsUnavailable, write_plots
from .probe import measure_bandwidth
from .report import BenchReport, format_table, machine_info
from .runner import run_bench

USAGE = """usage: fastdecode bench [--config FILE] [key=value ...]

Measure fastdecode's modes, and the peers installed here, on every combination of
batch size x new tokens x prompt length. Results go to <out>/results.json (written
after every row) and <out>/*.png; the table is printed at the end.

keys (defaults shown; lists take repeated keys, e.g. batch_sizes=1 batch_sizes=4):
"""


def main(argv: list[str]) -> int:
    return run_command(argv, BenchSettings, USAGE, lambda settings: _bench(settings, argv))


def _bench(settings: BenchSettings, argv: list[str]) -> int:
    device = resolve_device(settings.device)  # a bad device fails the run, not every row
    if settings.tp != 1:
        from ..parallel.launch import join_torchrun

        if join_torchrun(settings.tp, settings.device, "bench") != 0:
            run_bench(settings, lambda row: None)  # the same rows in lockstep; rank 0 reports
            return 0
    report = BenchReport(settings.out, settings, machine_info(settings.device),
                         command=shlex.join(["fastdecode", "bench", *argv]))
    print(f"writing {report.path}", file=sys.stderr)
    report.set_probe(measure_bandwidth(device, settings.probe_mib).to_dict())
    interrupted = False
    try:
        run_bench(settings, report.add_row)
    except KeyboardInterrupt:  # keep what was measured; the rows are already on disk
        interrupted = True
        print("interrupted; saving the rows measured so far", file=sys.stderr)
    plots: list[str] = []
    if settings.plots:
        try:
            plots = write_plots(report.data, report.dir)
        except PlotsUnavailable as e:
            print(f"plots skipped: {e}", file=sys.stderr)
    report.finish(interrupted=interrupted, plots=plots)
    print(format_table(report.data))
    print(f"\nresults: {report.path}" + "".join(f"\nplot: {p}" for p in plots))
    return 130 if interrupted else 0
