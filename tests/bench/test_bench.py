"""The bench harness end to end on the tiny model, plus its failure handling.

Speed is never asserted: only that every figure exists, has the right type and
is consistent with the others.
"""

import json
import math
import shutil

import pytest

from fastdecode.bench import runner
from fastdecode.compile import aot
from fastdecode.bench.cli import main
from fastdecode.bench.contenders import Contender, Timing
from fastdecode.bench.options import BenchSettings
from fastdecode.bench.report import SCHEMA, BenchReport, ratios

NUMERIC = ["first_call_s", "ms_per_step", "decode_tokens_per_s", "decode_tokens_per_s_per_seq", "ttft_s",
           "prefill_tokens_per_s", "peak_memory_bytes", "bandwidth_bytes_per_s", "bandwidth_fraction", "load_s"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    rc = main(["model=tiny", "modes=static", "modes=dynamic", "modes=no-such-mode", "peers=hf-static",
               "batch_sizes=1", "batch_sizes=2", "batch_sizes=3", "max_batch_size=2", "new_tokens=4",
               "prompt_lengths=5", "runs=2", "warmup=0", "probe_mib=4", f"out={out}"])
    return rc, out, json.loads((out / "results.json").read_text())


def test_json_schema(tiny_run):
    rc, out, data = tiny_run
    assert rc == 0
    assert data["schema"] == SCHEMA and data["finished"] and not data["interrupted"]
    assert {"cpu_model", "cpu_cores", "torch"} <= set(data["machine"])
    assert data["machine"]["cpu_cores"] >= 1
    assert data["probe"]["bytes_per_s"] > 0
    assert data["settings"]["batch_sizes"] == [1, 2, 3]
    ok = [r for r in data["rows"] if r["status"] == "ok"]
    assert sorted((r["name"], r["batch_size"]) for r in ok) == [
        ("dynamic", 1), ("dynamic", 2), ("static", 1), ("static", 2)]
    for r in ok:
        for key in NUMERIC:
            assert isinstance(r[key], (int, float)) and math.isfinite(r[key]) and r[key] > 0, (key, r)
        assert r["runs"] == 2 and len(r["ms_per_step_runs"]) == 2
        assert len(r["step_ms"]) == 3  # 4 new tokens: the first comes from prefill
        assert r["decode_tokens_per_s"] == pytest.approx(r["batch_size"] * r["decode_tokens_per_s_per_seq"])
        assert r["decode_tokens_per_s_per_seq"] == pytest.approx(1e3 / r["ms_per_step"])
        assert r["prefill_tokens_per_s"] == pytest.approx(r["batch_size"] * 5 / r["ttft_s"])


def test_plots_written(tiny_run):
    _, out, data = tiny_run
    names = sorted(p.rsplit("/", 1)[-1] for p in data["plots"])
    assert names == ["ms_per_step.png", "tokens_per_s.png"]
    for name in names:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_rows_are_reported_and_the_rest_runs(tiny_run):
    rows = tiny_run[2]["rows"]
    too_big = [r for r in rows if r["batch_size"] == 3]
    assert len(too_big) == 2 and all(r["status"] == "error" and "max_batch_size=2" in r["error"] for r in too_big)
    (unknown,) = [r for r in rows if r["name"] == "no-such-mode"]
    assert unknown["status"] == "error" and "no-such-mode" in unknown["error"] and "static" in unknown["error"]
    (peer,) = [r for r in rows if r["name"] == "hf-static"]
    assert peer["status"] == "skipped" and "preset" in peer["error"]


class _Flaky(Contender):
    """Runs fine `ok_calls` times, then fails like a peer crashing mid-run."""

    name, engine, weight_bytes_per_token, vocab_size = "flaky", "peer", 1000, 300

    def __init__(self, ok_calls):
        self.calls, self.ok_calls = 0, ok_calls

    def run(self, prompts, new_tokens):
        self.calls += 1
        if self.calls > self.ok_calls:
            raise RuntimeError("peer died")
        return Timing(ttft_s=0.01 * self.calls, step_s=[0.002] * (new_tokens - 1))


def test_failure_mid_run_keeps_measured_runs():
    s = BenchSettings(runs=5, warmup=1)
    row = runner.measure(_Flaky(ok_calls=4), s, 1, 3, 4)
    assert row["status"] == "error" and "peer died" in row["error"]
    assert row["runs"] == 2  # first call and warm-up are not timed runs
    assert row["first_call_s"] > 0 and row["ms_per_step"] == pytest.approx(2.0)


def test_rows_are_saved_as_they_arrive(tmp_path):
    (tmp_path / "results.json").write_text('{"old": true}')
    report = BenchReport(str(tmp_path), BenchSettings(), {"device": "cpu"})
    report.add_row({"engine": "fastdecode", "name": "static", "status": "ok", "bandwidth_bytes_per_s": None})
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert [r["name"] for r in on_disk["rows"]] == ["static"] and on_disk["finished"] is None
    kept = list(tmp_path.glob("results-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == {"old": True}


def test_ratios_pair_rows_of_the_same_shape():
    shape = {"batch_size": 1, "new_tokens": 8, "prompt_tokens": 4}
    rows = [{"engine": "fastdecode", "name": "static", "decode_tokens_per_s": 30.0, "ttft_s": 0.1, **shape},
            {"engine": "transformers", "name": "hf-static", "decode_tokens_per_s": 10.0, "ttft_s": 0.3, **shape},
            {"engine": "transformers", "name": "hf-dynamic", "decode_tokens_per_s": 20.0, "ttft_s": 0.2,
             **shape, "batch_size": 4}]
    (r,) = ratios(rows)
    assert (r["mode"], r["peer"]) == ("static", "hf-static")
    assert r["decode_speedup"] == pytest.approx(3.0) and r["ttft_speedup"] == pytest.approx(3.0)


@pytest.mark.parametrize("argv, message", [
    (["bogus_key=1"], "bogus_key"),
    (["device=tpu"], "tpu"),
    (["runs=0"], "runs=0"),
    (["batch_sizes=0"], "batch_sizes"),
    (["--config"], "--config"),
    (["stray"], "stray"),
])
def test_bad_arguments_exit_2(argv, message, capsys, tmp_path):
    assert main([f"out={tmp_path}"] + argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_help_lists_every_key(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert all(f"  {k} =" in text for k in BenchSettings.__dataclass_fields__)


class _Compiled(Contender):
    """A contender whose step is torch.compile'd (eager backend: cheap, but counted)."""

    name, engine, compiles, weight_bytes_per_token, vocab_size = "compiled", "test", True, 1000, 300

    def __init__(self):
        import torch

        self.torch = torch
        self.step = torch.compile(lambda x: (x * 2 + 1).sum(), backend="eager", dynamic=False)

    def run(self, prompts, new_tokens):
        x = self.torch.ones(len(prompts), len(prompts[0]))
        self.step(x)
        return Timing(ttft_s=0.01, step_s=[0.001] * (new_tokens - 1))


def test_compile_figures_come_from_dynamo():
    import torch

    torch._dynamo.reset()
    row = runner.measure(_Compiled(), BenchSettings(runs=2, warmup=1), 2, 3, 4)
    assert row["status"] == "ok"
    assert row["graphs_compiled"] >= 1 and row["compile_s"] > 0
    assert row["recompiles"] == 0  # same shapes after the first call


def test_interrupt_saves_the_rows_measured(tmp_path, monkeypatch):
    class _Interrupted(_Flaky):
        def run(self, prompts, new_tokens):
            if self.calls >= self.ok_calls:
                raise KeyboardInterrupt
            return super().run(prompts, new_tokens)

    monkeypatch.setattr(runner, "build", lambda kind, name, s, shared: _Interrupted(ok_calls=3))
    rc = main(["modes=static", "peers=", "runs=3", "warmup=0", "new_tokens=3", "batch_sizes=1", "batch_sizes=2",
               "probe_mib=4", "plots=false", f"out={tmp_path}"])
    data = json.loads((tmp_path / "results.json").read_text())
    assert rc == 130 and data["interrupted"] and data["finished"]
    (row,) = data["rows"]  # the second batch size never started
    assert row["status"] == "interrupted" and row["runs"] == 2


def test_fastdecode_cli_dispatches_to_bench(capsys):
    from fastdecode.cli.main import run

    assert run(["bench", "--help"]) == 0
    assert "fastdecode bench" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["bench.yaml", "bench-gpu.yaml"])
def test_shipped_configs_load(name):
    from pathlib import Path

    from fastdecode.bench.options import MODES
    from fastdecode.cli.keys import load_settings

    path = Path(__file__).parents[2] / "configs" / name
    s = load_settings(BenchSettings, [], str(path))
    # the seeds' four modes and the package, in whatever order; on CPU also the float comparison
    assert set(s.modes) == set(MODES) - ({"static-float", "default"} if "gpu" in name else set())
    assert s.batch_sizes == [1, 4] and s.new_tokens == [16, 256]


def test_package_mode_exports_then_runs_the_package(tmp_path, tiny_package, monkeypatch):
    """The package mode exports the model into the results folder, times that, and runs the package.
    The export itself is tests/compile/test_aot.py's: a copy of the session's package stands in."""
    exported = []

    def export_package(model, path):
        exported.append(model.args.n_layers)
        shutil.copy(tiny_package, path)

    monkeypatch.setattr(aot, "export_package", export_package)
    rc = main(["model=tiny", "modes=package", "peers=", "batch_sizes=1", "new_tokens=4", "prompt_lengths=5",
               "runs=1", "warmup=0", "probe_mib=4", "plots=false", f"out={tmp_path}"])
    data = json.loads((tmp_path / "results.json").read_text())
    (row,) = data["rows"]
    assert rc == 0 and row["status"] == "ok", row
    assert row["load_compile_s"] > 0  # the export, timed inside the load
    assert (tmp_path / "package.pt2").is_file() and exported == [2]
