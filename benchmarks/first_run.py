"""Time a new user's first run: the README's generate command from a fresh clone.

    python3 benchmarks/first_run.py [--repo PATH] [--out benchmarks/first_run.json]

In a new temporary folder with an empty HOME (so no kernels, converted
checkpoints or packages are cached, and pip's cache is empty too), in this
machine's environment otherwise (its pip settings, such as PIP_FIND_LINKS):
1. clone the repository and run the README's first command exactly as written,
   timing the whole command and the moment its first generated text reaches stdout;
2. run `.venv/bin/fastdecode generate` again in a new process (warm: kernels and the
   converted checkpoint are cached; the package may still be exporting);
3. wait for the background export to finish, then run it once more (the package path);
4. start `fastdecode serve` on a model this HOME has never seen (the Gemma 3 270M
   preset's random weights, so no conversion) and time /health's first 200.
Each time is measured from the start of its command. Prints and writes a JSON report.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_command(n: int) -> str:
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    return blocks[n].strip()


def timed(cmd: list[str] | str, cwd: Path, env: dict, shell: bool = False) -> dict:
    """Run `cmd`; seconds to its first stdout byte and to its exit, and its stderr tail."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, shell=shell, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.read(1)
    t_first = time.perf_counter() - t0 if first else None
    rest = p.stdout.read()
    err = p.stderr.read().decode("utf-8", "replace")
    p.wait()
    return {"rc": p.returncode, "first_output_s": t_first, "total_s": time.perf_counter() - t0,
            "stdout": (first + rest).decode("utf-8", "replace")[:200], "stderr_tail": err.strip().splitlines()[-14:]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_health(work: Path, env: dict) -> dict:
    port = free_port()
    log = open(work / "serve.log", "w")
    t0 = time.perf_counter()
    p = subprocess.Popen([str(work / "repo/.venv/bin/fastdecode"), "serve", "model=random-gemma3-270m",
                          f"port={port}"], cwd=work / "repo", env=env, stdout=log, stderr=subprocess.STDOUT)
    ready = None
    try:
        while time.perf_counter() - t0 < 300 and p.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        ready = time.perf_counter() - t0
                        break
            except OSError:
                pass
            time.sleep(0.2)
    finally:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
        log.close()
    return {"health_200_s": ready, "log_tail": (work / "serve.log").read_text().strip().splitlines()[-6:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=str(ROOT))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "first_run.json"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fd-first-run-"))
    home = work / "home"
    home.mkdir()
    # This machine's environment (its pip settings included: PIP_FIND_LINKS is how a new user here
    # gets the torch wheel that is on disk), with an empty HOME and nothing of fastdecode's or a venv's.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FASTDECODE_", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "XDG_"))}
    env.update(HOME=str(home), LANG=env.get("LANG", "C.UTF-8"))
    report: dict = {"cpu": "", "load_before": os.getloadavg(), "commit": subprocess.run(
        ["git", "-C", a.repo, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()}
    try:
        with open("/proc/cpuinfo") as f:
            report["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    subprocess.run(["git", "clone", "-q", a.repo, str(work / "repo")], check=True)
    cmd = readme_command(0)
    report["readme_command"] = cmd
    report["cold"] = timed(cmd, work / "repo", env, shell=True)
    fd = str(work / "repo/.venv/bin/fastdecode")
    report["warm"] = timed([fd, "generate", "Tell me a joke"], work / "repo", env)
    packages = home / ".cache/fastdecode/packages"
    deadline = time.time() + 300
    while time.time() < deadline and any(packages.glob("*.lock")):
        time.sleep(2)
    report["packaged"] = timed([fd, "generate", "Tell me a joke"], work / "repo", env)
    report["serve_new_model"] = serve_health(work, env)
    report["load_after"] = os.getloadavg()
    text = json.dumps(report, indent=1)
    print(text)
    Path(a.out).write_text(text + "\n", encoding="utf-8")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
