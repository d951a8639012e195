"""One way to run a `fastdecode` command: parse its arguments, load and check its
settings, run it, and turn what went wrong into one line on stderr and an exit code.

`fastdecode generate`/`chat` and every dispatched command (bench, bench-engine,
bench-spec, export, perplexity, serve) go through `exit_code`; the dispatched ones
take `--config FILE`, key=value and `-h/--help` through `run_command`, so each
behaves the same whether it runs as `fastdecode NAME` or from its module.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Mapping, Optional

from ..errors import FastDecodeError
from ..parallel.launch import end_process
from .keys import describe_settings, load_settings, parse_config_args

EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE, EXIT_FAILED = 2, 130, 141, 1


def run_command(argv: list[str], settings: type, usage: str, run: Callable[..., int],
                flags: Optional[Mapping[str, str]] = None) -> int:
    """Run a key=value command: `usage` and every key of `settings` for -h/--help,
    else `run(settings loaded from --config FILE and key=value arguments)`.
    `flags` spells keys as flags (e.g. {"--json": "json=true"})."""
    def main() -> int:
        args = [flags.get(a, a) for a in argv] if flags else argv
        config, overrides, wants_help = parse_config_args(args)
        if wants_help:
            print(usage + describe_settings(settings))
            return 0
        return run(load_settings(settings, overrides, config))

    return exit_code(main)


def exit_code(main: Callable[[], int]) -> int:
    """`main()`'s exit code, with the error policy of every command: bad input
    (FastDecodeError) is one line and exit 2; Ctrl-C exits 130; a reader that went
    away (`| head -1`) exits 141 quietly; anything else is one line and exit 1, or
    its traceback with FASTDECODE_DEBUG=1. A tensor-parallel rank ends here, with
    its code (see `end_process`)."""
    return end_process(_exit_code(main))


def _exit_code(main: Callable[[], int]) -> int:
    try:
        return main()
    except FastDecodeError as e:
        error(str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Point stdout at devnull so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as e:  # noqa: BLE001 - one line for users; FASTDECODE_DEBUG=1 shows the traceback
        if os.environ.get("FASTDECODE_DEBUG") == "1":
            raise
        error(f"{type(e).__name__}: {_first_line(str(e))} (set FASTDECODE_DEBUG=1 for the traceback)")
        return EXIT_FAILED


def error(message: str) -> None:
    print(f"fastdecode: error: {_first_line(message)}", file=sys.stderr)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "(no message)"
