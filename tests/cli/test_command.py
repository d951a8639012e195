"""cli/command.py: every key=value command parses, checks and fails the same way."""

from dataclasses import dataclass

import pytest

from fastdecode.cli.command import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, run_command
from fastdecode.errors import FastDecodeError


@dataclass
class Demo:
    n: int = 1
    json: bool = False

    def __post_init__(self):
        if self.n < 1:
            raise FastDecodeError(f"n={self.n} is out of range; accepted: an integer >= 1")


def run(argv, fn=lambda s: 0, **kw):
    return run_command(argv, Demo, "usage: demo\n", fn, **kw)


def test_settings_reach_the_command_and_flags_spell_keys():
    seen = []
    assert run(["n=3", "--json"], lambda s: seen.append(s) or 0, flags={"--json": "json=true"}) == 0
    assert seen == [Demo(n=3, json=True)]


def test_help_prints_usage_and_keys(capsys):
    assert run(["--help"], lambda s: pytest.fail("ran")) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: demo\n") and "n = 1" in out and "json = false" in out


@pytest.mark.parametrize("argv, message", [
    (["n=0"], "n=0 is out of range"),
    (["m=2"], "unknown key 'm'"),
    (["stray"], "unexpected argument 'stray'"),
    (["--config"], "--config needs a file path"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert run(argv, lambda s: pytest.fail("ran")) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("fastdecode: error: ") and err.count("\n") == 1 and message in err


def test_failures_while_running(monkeypatch, capsys):
    def boom(s):
        raise RuntimeError("disk on fire\nmore")

    def interrupted(s):
        raise KeyboardInterrupt

    assert run([], boom) == EXIT_FAILED
    assert capsys.readouterr().err == \
        "fastdecode: error: RuntimeError: disk on fire (set FASTDECODE_DEBUG=1 for the traceback)\n"
    assert run([], interrupted) == EXIT_INTERRUPTED
    monkeypatch.setenv("FASTDECODE_DEBUG", "1")
    with pytest.raises(RuntimeError):
        run([], boom)
