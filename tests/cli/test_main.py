"""The `fastdecode` command. Every path runs once in a subprocess on the tiny
model (each launch imports torch, so they are few); the rest is tested in-process."""

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest

import fastdecode
from fastdecode import GenerationConfig, SamplingParams
from fastdecode.cli import main as cli
from fastdecode.cli.command import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED
from fastdecode.cli.keys import format_value
from fastdecode.cli.repl import ChatSession, run_repl

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=tiny", "temperature=0"]
STATS_LINES = ("prompt tokens:", "generated tokens:", "time to first token:", "decode:",
               "bandwidth achieved:", "peak memory:")


def fd(*args, stdin=b"", timeout=120):
    """Run `python -m fastdecode ARGS`; returns (rc, stdout text, stderr text)."""
    p = subprocess.run([sys.executable, "-m", "fastdecode", *args], input=stdin, capture_output=True,
                       timeout=timeout, cwd=ROOT)
    return p.returncode, p.stdout.decode("utf-8"), p.stderr.decode("utf-8")


def json_lines(out):
    return [json.loads(line) for line in out.splitlines()]


# -- generate, in a subprocess ---------------------------------------------------------

def test_generate_streams_the_api_completion_and_prints_stats(tiny_llm):
    rc, out, err = fd("generate", *TINY, "max_new_tokens=12", "Tell me a joke")
    assert rc == 0, err
    want = tiny_llm.generate([tiny_llm.chat_prompt([{"role": "user", "content": "Tell me a joke"}])],
                             temperature=0, max_new_tokens=12)[0]
    assert out == want.text + "\n"  # the tiny preset has a chat template, so chat=none uses it
    for label in STATS_LINES:
        assert label in err
    assert f"generated tokens:     {want.completion_tokens}" in err


def test_generate_batch_json_matches_the_api(tiny_llm, tmp_path):
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_bytes("second prompt\n\nthird ✓\n".encode("utf-8"))
    rc, out, err = fd("generate", *TINY, "chat=false", "max_new_tokens=6", "first", "--json",
                      f"prompt_file={prompt_file}")
    assert rc == 0, err
    rows = json_lines(out)
    prompts = ["first", "second prompt", "third ✓"]
    want = tiny_llm.generate(prompts, temperature=0, max_new_tokens=6)
    assert [r["prompt"] for r in rows] == prompts
    for row, c in zip(rows, want):
        assert (row["text"], row["tokens"], row["finish_reason"]) == (c.text, c.token_ids, c.finish_reason)
        stats = row["stats"]
        assert stats["prompt_tokens"] == c.prompt_tokens and stats["completion_tokens"] == c.completion_tokens
        assert stats["bandwidth_gb_s"] == pytest.approx(
            tiny_llm.weight_bytes_per_token * stats["decode_tokens_per_s"] / 1e9)
        assert stats["peak_memory_bytes"] > 0 and stats["time_to_first_token_s"] > 0


def test_generate_batch_text_prints_each_completion_in_order(tiny_llm):
    rc, out, err = fd("generate", *TINY, "chat=false", "max_new_tokens=5", "prompt=aa", "prompt=b")
    assert rc == 0, err
    a, b = tiny_llm.generate(["aa", "b"], temperature=0, max_new_tokens=5)
    assert out == f"--- [1/2] ---\n{a.text}\n--- [2/2] ---\n{b.text}\n"
    assert "(2 sequences)" in err


def test_generate_config_file_then_overrides(tiny_llm, tmp_path):
    config = tmp_path / "g.yaml"
    config.write_text("model: tiny\ntemperature: 0\nmax_new_tokens: 9\nignore_eos: true\n"
                      "chat: true\nsystem: be brief\nprompt: [from the file]\n")
    rc, out, err = fd("generate", "--config", str(config), "max_new_tokens=3", "--json", "from argv")
    assert rc == 0, err
    (row,) = json_lines(out)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "from argv"}]
    want = tiny_llm.generate([tiny_llm.chat_prompt(messages)], temperature=0, max_new_tokens=3,
                             ignore_eos=True)[0]
    assert row["prompt"] == "from argv" and row["tokens"] == want.token_ids and len(want.token_ids) == 3


# -- chat, in a subprocess ---------------------------------------------------------------

def test_chat_repl_over_stdin(tiny_llm):
    script = b"hi\n/reset\n\xff\xfe\nhello\n/exit\nnever sent\n"
    rc, out, err = fd("chat", *TINY, "max_new_tokens=8", stdin=script)
    assert rc == 0, err
    one = tiny_llm.chat([{"role": "user", "content": "hi"}], temperature=0, max_new_tokens=8)
    two = tiny_llm.chat([{"role": "user", "content": "hello"}], temperature=0, max_new_tokens=8)
    assert out == f"{one.text}\n{two.text}\n"  # /reset: the second turn starts from an empty history
    assert "history cleared" in err and "not valid UTF-8" in err


def test_chat_drops_oldest_turns_and_survives_a_too_long_message():
    script = b"first message\nsecond message\n" + b"x" * 80 + b"\n"  # then end of input
    rc, out, err = fd("chat", *TINY, "max_seq_len=64", "max_new_tokens=16", "ignore_eos=true", stdin=script)
    assert rc == 0, err
    assert "dropped the 1 oldest exchange(s)" in err
    assert "message too long" in err
    assert out.count("\n") >= 2


def _sigint_as_in_a_shell():
    """The child gets SIGINT delivered and handled as a terminal's Ctrl-C would,
    whatever the test process (or a library in it) did to its own disposition
    or signal mask, both of which a child inherits."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(os.environ.get("FASTDECODE_SKIP_DEFAULT_MODEL") == "1", reason="asked to skip")
def test_chat_ctrl_c_stops_the_answer_in_a_real_process():
    # The default model, not tiny: tiny writes its 480 tokens in a fraction of a
    # second and can finish before the signal lands; this one needs ~10 s.
    p = subprocess.Popen([sys.executable, "-m", "fastdecode", "chat", "temperature=0", "max_new_tokens=480",
                          "ignore_eos=true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=ROOT, preexec_fn=_sigint_as_in_a_shell)
    p.stdin.write(b"Tell me a long story\n")
    p.stdin.flush()
    assert p.stdout.read(3)  # the answer has started
    p.send_signal(signal.SIGINT)
    p.stdin.write(b"/exit\n")  # read only if the chat stayed open (else the exit code is 130)
    p.stdin.close()
    p.stdout.read()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0, err
    assert "[stopped]" in err and "Traceback" not in err


# -- bad input, in a subprocess ------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["temprature=0.5", "hi"], "unknown key 'temprature'"),
    (["top_k=many", "hi"], "top_k='many' is not valid"),
    (["--config", "no/such/config.yaml", "hi"], "config file 'no/such/config.yaml' not found"),
])
def test_bad_settings_exit_2_with_one_line(args, needle):
    rc, out, err = fd("generate", "model=tiny", *args)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("fastdecode: error: ") and needle in err, err
    assert out == ""


@pytest.mark.parametrize("argv,needle", [
    (["generate", "--bogus", "hi"], "unrecognized arguments: --bogus; accepted: --config FILE, --json, --print-config, "
                                    "key=value and prompts"),
    (["generate", "hi", "--config"], "argument --config: expected one argument; accepted: --config FILE"),
    (["chat", "--json"], "unrecognized arguments: --json; accepted: --config FILE, key=value and prompts"),
])
def test_bad_options_are_one_line_not_usage(capsys, argv, needle):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("fastdecode: error: ") and needle in err, err


@pytest.mark.parametrize("args,needle", [
    (["temperature=-1", "hi"], "temperature=-1.0 is out of range"),
    (["max_new_tokens=0", "hi"], "max_new_tokens=0 is out of range"),
    (["max_new_tokens=-3", "hi"], "max_new_tokens=-3 is out of range"),
    (["prompt_file=no/such/prompts.txt"], "prompt_file 'no/such/prompts.txt' not found"),
    (["caf\udce9"], "prompt 1 is not valid UTF-8 (byte 0xe9)"),  # how Linux argv carries byte 0xe9
    ([], "no prompt given"),
    (["max_batch_size=0", "hi"], "max_batch_size=0 is out of range"),
    (["kv_dtype=int3", "hi"], "unknown kv_dtype 'int3'; accepted: auto, float32, float16, bfloat16, q8_0"),
])
def test_bad_input_is_refused_before_loading(args, needle, capsys):
    assert cli.main(["generate", "model=tiny", *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and needle in captured.err and captured.out == ""


def test_chat_without_a_template_says_so_in_one_line(monkeypatch, capsys):
    """A base checkpoint (Gemma 3 270M) has no chat template: chat refuses in one line,
    generate prompts it as plain text."""
    monkeypatch.setattr("fastdecode.api.build.BYTE_CHAT_TEMPLATE", None)  # the tiny preset, without its template
    assert cli.main(["chat", "model=tiny", "max_new_tokens=2"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "has no chat template" in captured.err and captured.out == ""
    assert cli.main(["generate", "model=tiny", "max_new_tokens=2", "temperature=0", "hi"]) == 0


def test_chat_with_a_template_that_does_not_parse_fails_at_start(monkeypatch, capsys):
    """It failed every message with the syntax error as a notice, then exited 0 at the end of input."""
    monkeypatch.setattr("fastdecode.api.build.BYTE_CHAT_TEMPLATE", "{% for m in messages %}{{ m.content ")
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    assert cli.main(["chat", "model=tiny", "max_new_tokens=2"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "chat template has a syntax error on line 1" in captured.err


def test_chat_refuses_a_reply_budget_that_fills_the_context(capsys):
    """max_new_tokens >= max_seq_len would make every message "too long": one line up front."""
    assert cli.main(["chat", "model=tiny", "max_seq_len=32", "max_new_tokens=32"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "leaves no room for a message" in captured.err and captured.out == ""


def test_non_utf8_prompt_file_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nnot \xc3\x28 fine\n")
    assert cli.main(["generate", "model=tiny", f"prompt_file={bad}"]) == 2
    assert "not valid UTF-8: byte 0xc3 on line 2" in capsys.readouterr().err


def test_closed_stdout_ends_quietly():
    p = subprocess.Popen([sys.executable, "-m", "fastdecode", "generate", *TINY, "max_new_tokens=400",
                          "ignore_eos=true", "chat=false", "hi"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert p.stdout.read(1)
    p.stdout.close()  # like `| head -c 1`
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == EXIT_BROKEN_PIPE
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_help_lists_every_key_with_its_default():
    rc, out, _ = fd("generate", "--help")
    assert rc == 0
    for f in dataclasses.fields(cli.GenerateSettings):
        assert f"  {f.name} = {format_value(f.default)}" in out
    assert f"temperature = {format_value(SamplingParams().temperature)}" in out
    assert f"max_new_tokens = {GenerationConfig().max_new_tokens}" in out


def test_kv_dtype_key_in_generate_and_serve_help_from_one_default():
    from fastdecode.api.build import load
    import inspect

    default = inspect.signature(load).parameters["kv_dtype"].default
    for command in ("generate", "serve"):
        rc, out, _ = fd(command, "--help")
        assert rc == 0 and f"  kv_dtype = {format_value(default)}" in out, command


def test_kv_dtype_is_in_the_stats(capsys):
    assert cli.main(["generate", *TINY, "kv_dtype=bfloat16", "max_new_tokens=2", "hi"]) == 0
    assert "positions, bfloat16, " in capsys.readouterr().err


def test_version():
    rc, out, _ = fd("--version")
    assert rc == 0 and out.strip() == f"fastdecode {fastdecode.__version__}"


@pytest.mark.skipif(os.environ.get("FASTDECODE_SKIP_DEFAULT_MODEL") == "1", reason="asked to skip")
def test_bare_generate_uses_the_default_model():
    rc, out, err = fd("generate", "Tell me a joke", "max_new_tokens=4", timeout=300)
    assert rc == 0, err
    assert out.strip() and all(label in err for label in STATS_LINES)


# -- in-process ------------------------------------------------------------------------------

def test_settings_expose_every_api_field_with_the_api_default():
    fields = {f.name: f.default for f in dataclasses.fields(cli.GenerateSettings)}
    for cls in (SamplingParams, GenerationConfig):
        for f in dataclasses.fields(cls):
            if f.name not in cli.API_ONLY_KEYS:
                assert fields[f.name] == f.default, f.name
    assert {"model", "device", "dtype", "compile", "max_seq_len", "max_batch_size", "prompt",
            "max_new_tokens", "chat"} <= set(fields)


def test_shipped_config_documents_every_key_at_its_default(tmp_path):
    text = (ROOT / "configs" / "generate.yaml").read_text()
    names = [f.name for f in dataclasses.fields(cli.GenerateSettings)]
    settings_lines = [ln[2:] for ln in text.splitlines() for n in names if ln.startswith(f"# {n}: ")]
    assert [ln.split(":")[0] for ln in settings_lines] == names, \
        "regenerate with: fastdecode generate --print-config > configs/generate.yaml"
    # uncommented, the file sets every key to the dataclass default
    uncommented = tmp_path / "all.yaml"
    uncommented.write_text("\n".join(settings_lines) + "\n")
    assert cli.load_settings(cli.GenerateSettings, [], str(uncommented)) == cli.GenerateSettings()
    assert cli.load_settings(cli.GenerateSettings, [], str(ROOT / "configs" / "generate.yaml")) \
        == cli.GenerateSettings()


def test_dispatch_to_other_commands(monkeypatch, capsys):
    seen = []
    fake = types.ModuleType("fake_bench_cli")
    fake.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "fake_bench_cli", fake)
    monkeypatch.setitem(cli._DISPATCH, "bench", "fake_bench_cli")
    monkeypatch.setitem(cli._DISPATCH, "export", "fastdecode.no_such_module")
    assert cli.main(["bench", "--x", "k=v"]) == 0 and seen == [["--x", "k=v"]]
    assert cli.main(["export", "a"]) == 2
    assert "'fastdecode export' is not available" in capsys.readouterr().err


def test_unexpected_errors_are_one_line_unless_debugging(monkeypatch, capsys):
    def boom(*_):
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(cli, "cmd_generate", boom)
    assert cli.main(["generate", "hi"]) == 1
    assert capsys.readouterr().err == \
        "fastdecode: error: RuntimeError: disk on fire (set FASTDECODE_DEBUG=1 for the traceback)\n"
    monkeypatch.setenv("FASTDECODE_DEBUG", "1")
    with pytest.raises(RuntimeError):
        cli.main(["generate", "hi"])


def test_ctrl_c_outside_an_answer_exits_130(monkeypatch, capsys):
    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_generate", interrupted)
    assert cli.main(["generate", "hi"]) == EXIT_INTERRUPTED


def _session(llm, **config):
    return ChatSession(llm, SamplingParams(temperature=0), GenerationConfig(**config))


def test_ctrl_c_stops_the_answer_and_keeps_the_chat(tiny_llm):
    session = _session(tiny_llm, max_new_tokens=30, ignore_eos=True)
    real_start, calls = tiny_llm.start, []

    class Interrupting:  # the first answer is interrupted after three steps
        def __init__(self, run):
            self.run, self.n = run, 0

        def __iter__(self):
            for step in self.run:
                self.n += 1
                if self.n == 4 and len(calls) == 1:
                    raise KeyboardInterrupt
                yield step

    def start(*args):
        calls.append(args)
        return Interrupting(real_start(*args))

    session.llm = types.SimpleNamespace(start=start, chat_prompt=tiny_llm.chat_prompt,
                                        max_seq_len=tiny_llm.max_seq_len)
    out, err = io.StringIO(), io.StringIO()
    rc = run_repl(session, ["one", "two"], stdin=io.StringIO(""), stdout=out, stderr=err)
    assert rc == 0 and len(calls) == 2 and "[stopped]" in err.getvalue()
    first, second = session.turns[1]["content"], session.turns[3]["content"]
    full = tiny_llm.chat([{"role": "user", "content": "one"}], temperature=0, max_new_tokens=30, ignore_eos=True)
    assert full.text.startswith(first) and len(first) < len(full.text)  # kept as far as it was shown
    assert out.getvalue() == f"{first}\n{second}\n"


def test_history_keeps_the_system_message_and_fits_the_window(tiny_llm):
    session = _session(tiny_llm, max_new_tokens=8)
    session.system = "sys"
    session.turns = [{"role": "user", "content": "u" * 150}, {"role": "assistant", "content": "a" * 150},
                     {"role": "user", "content": "u2"}, {"role": "assistant", "content": "a2"}]
    session.llm = types.SimpleNamespace(chat_prompt=tiny_llm.chat_prompt, max_seq_len=200)
    ids, dropped = session.ask("now")
    assert dropped == 1 and len(ids) <= 200 - 8
    assert session.messages()[0] == {"role": "system", "content": "sys"}
    assert [m["content"] for m in session.turns] == ["u2", "a2", "now"]


def test_progress_draws_only_when_enabled():
    from fastdecode.cli.progress import progress

    quiet = io.StringIO()  # not a terminal: nothing is drawn
    with progress("loading", total=3, stream=quiet) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""

    shown = io.StringIO()
    with progress("loading", total=4, stream=shown, enabled=True) as bar:
        bar.update(2)
        assert bar.line().startswith("loading [############............] 2/4")
    assert shown.getvalue().endswith("\n") and "loading: done in" in shown.getvalue()

    failed = io.StringIO()
    with pytest.raises(ValueError), progress("compiling", stream=failed, enabled=True):
        raise ValueError
    assert "compiling: failed in" in failed.getvalue()
