"""The constraint keys of `fastdecode generate`/`chat` (json_schema, regex, choice, grammar):
on the command line, in YAML, and their one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import jsonschema

from fastdecode.cli import main as cli
from fastdecode.structured import Constraint

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}


def fd(*args):
    p = subprocess.run([sys.executable, "-m", "fastdecode", *args], capture_output=True, timeout=180, cwd=ROOT,
                       env={**__import__("os").environ, "FASTDECODE_NO_PACKAGE": "1"})
    return p.returncode, p.stdout.decode("utf-8"), p.stderr.decode("utf-8")


def test_json_schema_on_the_command_line_matches_the_api(tiny_llm):
    rc, out, err = fd("generate", "model=tiny", "temperature=0", "max_new_tokens=40", "chat=false", "--json",
                      f"json_schema={json.dumps(SCHEMA)}", "x")
    assert rc == 0, err
    row = json.loads(out)
    jsonschema.validate(json.loads(row["text"]), SCHEMA)
    assert row["finish_reason"] == "stop"
    assert row["text"] == tiny_llm.generate(["x"], json_schema=SCHEMA, temperature=0, max_new_tokens=40)[0].text


def test_a_bad_key_is_one_line_and_exit_2():
    rc, out, err = fd("generate", "model=tiny", "regex=a(b", "x")
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "regex 'a(b' does not compile" in lines[0] and "Traceback" not in err


def test_keys_from_yaml_and_repeated_choice(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("json_schema:\n  type: object\n  properties: {n: {type: integer}}\n")
    s = cli.load_settings(cli.GenerateSettings, [], str(config))
    params, _ = cli.sampling_and_config(s)
    assert params.constraint == Constraint.json_schema({"type": "object", "properties": {"n": {"type": "integer"}}})
    s = cli.load_settings(cli.GenerateSettings, ["choice=yes", "choice=no"])
    assert cli.sampling_and_config(s)[0].constraint == Constraint.choice(["yes", "no"])
    s = cli.load_settings(cli.GenerateSettings, ["grammar=root ::= \"a\""])
    assert cli.sampling_and_config(s)[0].constraint.kind == "grammar"
    s = cli.load_settings(cli.GenerateSettings, [])
    assert cli.sampling_and_config(s)[0].constraint is None
