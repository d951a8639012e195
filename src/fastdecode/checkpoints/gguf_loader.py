"""GGUF (llama.cpp) checkpoints: tensors -> our state dict, as gguf_config.py's ModelArgs say (packed in
the kernels' layouts, or float; fused and experts' tensors split)."""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from typing import Callable, Iterator, Optional

import torch

from ..model.args import ModelArgs
from ..errors import FastDecodeError
from ..quant.formats import GGUF_LAYOUTS, REQUANTIZED, pack_gguf, requantize_gguf
from ..quant.transform import quantize_state_dict
from . import dequant
from .keys import expected_shapes, map_name
from .gguf_file import GGUFFile
from .rope_rows import unpermute_rows

# These architectures' Q/K rows come in pairs: the converter permutes Llama's so, ERNIE 4.5's, Cohere's and
# GLM 4's are so from training (GLM 4's rotary dims only; a glm4 file with M-RoPE sections has them in halves,
# as the converter wrote it).
PERMUTED = ("llama", "mistral3", "smollm3", "granite", "granitemoe", "ernie4_5", "command-r", "cohere2")

_GLOBAL_NAMES = {
    "token_embd.weight": "tok_embeddings.weight",
    "output_norm.weight": "norm.weight",
    "token_embd_norm.weight": "norm.weight",  # LFM2's final norm, as llama.cpp names it
    "output.weight": "output.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "attention_norm.weight",
    "attn_q.weight": "attention.wq.weight",
    "attn_k.weight": "attention.wk.weight",
    "attn_v.weight": "attention.wv.weight",
    "attn_q.bias": "attention.wq.bias",
    "attn_k.bias": "attention.wk.bias",
    "attn_v.bias": "attention.wv.bias",
    "attn_output.weight": "attention.wo.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate.weight": "feed_forward.w1.weight",
    "ffn_down.weight": "feed_forward.w2.weight",
    "ffn_up.weight": "feed_forward.w3.weight",
    "attn_qkv.weight": "attention.wqkv.weight",  # phi3's q, k and v in one tensor (_fused_rows)
    "attn_q_norm.weight": "attention.q_norm.weight",  # QK-norm (qwen3, gemma3)
    "attn_k_norm.weight": "attention.k_norm.weight",
    "post_attention_norm.weight": "post_attention_norm.weight",  # gemma2/3's post-norms
    "post_ffw_norm.weight": "post_ffn_norm.weight",
    "ffn_gate_inp.weight": "feed_forward.gate.weight",  # an MoE layer's router
    "ffn_gate_exps.weight": "feed_forward.experts.w1.weight",  # [experts, rows, cols]: split (_fused_rows)
    "ffn_down_exps.weight": "feed_forward.experts.w2.weight",
    "ffn_up_exps.weight": "feed_forward.experts.w3.weight",
    "ffn_gate_shexp.weight": "feed_forward.shared.w1.weight",  # qwen2moe's shared expert
    "ffn_down_shexp.weight": "feed_forward.shared.w2.weight",
    "ffn_up_shexp.weight": "feed_forward.shared.w3.weight",
    "ffn_gate_inp_shexp.weight": "feed_forward.shared_gate.weight",  # a vector in the file, a row for us
    "shortconv.in_proj.weight": "attention.in_proj.weight",  # LFM2's convolution layers (model/short_conv.py)
    "shortconv.conv.weight": "attention.conv",
    "shortconv.out_proj.weight": "attention.out_proj.weight",
    "exp_probs_b.bias": "feed_forward.selection_bias",  # lfm2moe's: added to the router's scores to choose
}
# gpt-oss's: its post_attention_norm is the MLP's input norm; biases on the attention's output, the
# router and the experts; the attention sinks.
_GPT_OSS_NAMES = {
    **_LAYER_NAMES,
    "post_attention_norm.weight": "ffn_norm.weight",
    "attn_output.bias": "attention.wo.bias",
    "attn_sinks.weight": "attention.sinks",
    "ffn_gate_inp.bias": "feed_forward.gate.bias",
    "ffn_gate_exps.bias": "feed_forward.experts.w1.bias",  # [experts, rows]: split (_expert_biases)
    "ffn_down_exps.bias": "feed_forward.experts.w2.bias",
    "ffn_up_exps.bias": "feed_forward.experts.w3.bias",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
# Tensors that carry nothing our model needs as weights: RoPE tables (read into ModelArgs).
_SKIPPED = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}


def our_name(gguf_name: str, arch: Optional[str] = None) -> Optional[str]:
    """Our state-dict key for a GGUF tensor name of architecture `arch`, or None if we do not map it."""
    return map_name(gguf_name, _GLOBAL_NAMES, _LAYER_RE, _GPT_OSS_NAMES if arch == "gpt-oss" else _LAYER_NAMES)


def gguf_state_dict(f: GGUFFile, args: ModelArgs, dtype: torch.dtype,
                    weights: str = "float") -> tuple[dict[str, torch.Tensor], str]:
    """The file's tensors (on CPU) under our key names, and a one-line summary of what became of each type.

    weights="float" dequantizes everything to `dtype`; "auto" keeps matrices of
    types with a native layout packed (see quant/formats.py) and dequantizes
    the rest; "int8"/"int4" quantize a float file's matrices.
    """
    kinds: Counter[str] = Counter()
    out: dict[str, torch.Tensor] = {}
    for part in gguf_shards(f, args, dtype, weights, kinds):
        out.update(part)
    return out, summarize(kinds, weights)


def summarize(kinds: Counter, weights: str = "auto") -> str:
    """What became of each tensor type, e.g. "F32 x33, Q4_K->q4k x96, Q6_K->q6k x17"."""
    quantized = f"; quantized to {weights} at load" if weights in ("int8", "int4") else ""
    return ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) + quantized


def gguf_shards(f: GGUFFile, args: ModelArgs, dtype: torch.dtype, weights: str,
                kinds: Counter) -> Iterator[dict[str, torch.Tensor]]:
    """The file's tensors converted one layer at a time (the layers in file order, then the
    rest), so that a caller writing each part out holds one layer at a time. Counts what
    became of each tensor type in `kinds`. Names and types are all checked before the first
    part is converted. int8/int4 quantize each part's float matrices, so the float model is never
    held whole."""
    f.check_tensor_types()
    names = [n for n in f.tensors if n not in _SKIPPED]
    arch = f.get("general.architecture")
    unknown = [n for n in names if our_name(n, arch) is None]
    if unknown:
        raise FastDecodeError(f"{f.path}: unexpected tensor {unknown[0]!r} for a {arch} model")
    # Shapes against the metadata's before any conversion: un-permuting Q/K rows, for one, reshapes
    # by the head count (check_state_dict checks our converted tensors again later).
    expected = expected_shapes(args)
    for name in names:
        fused = _fused_rows(name, args, arch)
        want = fused[1] if fused else _expert_biases(name, args) or expected.get(our_name(name, arch))
        got = f.raw(name)[2]
        if name.endswith(_SHARED_GATE):
            got = (1, *got)
        if want is not None and tuple(got) != tuple(want):
            raise FastDecodeError(f"{f.path}: tensor {name!r} has shape {list(got)}, but the file's metadata "
                                  f"makes it {list(want)}")
    if weights in ("int8", "int4"):
        for name in names:
            _, qtype, shape = f.raw(name)
            if len(shape) == 2 and qtype.name not in ("F32", "F16", "BF16"):
                raise FastDecodeError(f"{f.path}: weights={weights} quantizes float checkpoints, but {name} is "
                                      f"already {qtype.name}; use weights=auto (keeps the file's quantization) "
                                      "or float")
    groups: dict[Optional[int], list[str]] = {}
    for name in names:
        m = _LAYER_RE.match(name)
        groups.setdefault(int(m.group(1)) if m else None, []).append(name)
    if None in groups:  # the embedding, the final norm and the head last
        groups[None] = groups.pop(None)
    for group in groups.values():
        out: dict[str, torch.Tensor] = {}
        for name in group:
            out.update(_convert(f, name, args, dtype, weights, arch, kinds))
        if weights in ("int8", "int4"):
            quantize_state_dict(out, args, weights, str(f.path))
        yield out
        del out  # the caller has written it out
        f.drop_pages()


_SHARED_GATE = "ffn_gate_inp_shexp.weight"
_EXPERTS = {"ffn_gate_exps.weight": "w1", "ffn_down_exps.weight": "w2", "ffn_up_exps.weight": "w3"}


def _fused_rows(name: str, args: ModelArgs,
                arch: str) -> Optional[tuple[list[tuple[str, int, int]], tuple[int, ...]]]:
    """For a tensor holding several of our matrices: our keys with their row ranges [r0, r1) of
    the tensor's rows (all dims but the last), and the tensor's expected shape; else None. Phi-3's
    attn_qkv holds q, k, v, its ffn_up (and GLM 4's) gate then up; an MoE layer's *_exps each expert's matrix."""
    m = _LAYER_RE.fullmatch(name)
    if m is None:
        return None
    layer, sub = int(m.group(1)), m.group(2)
    p = f"layers.{layer}."
    if sub in _EXPERTS and layer < args.n_layers:
        n, dim, hidden = args.experts(layer), args.dim, args.expert_hidden_dim
        rows, cols = (dim, hidden) if sub == "ffn_down_exps.weight" else (hidden, dim)
        keys = [(f"{p}feed_forward.experts.{e}.{_EXPERTS[sub]}.weight", e * rows, (e + 1) * rows) for e in range(n)]
        return keys, (n, rows, cols)
    fused = ("attn_qkv.weight", "ffn_up.weight") if arch == "phi3" else ("ffn_up.weight",) if arch == "glm4" else ()
    if sub not in fused:
        return None
    if sub == "ffn_up.weight":
        h = args.hidden_dim
        return [(p + "feed_forward.w1.weight", 0, h), (p + "feed_forward.w3.weight", h, 2 * h)], (2 * h, args.dim)
    q, kv = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    return [(p + "attention.wq.weight", 0, q), (p + "attention.wk.weight", q, q + kv),
            (p + "attention.wv.weight", q + kv, q + 2 * kv)], (q + 2 * kv, args.dim)


def _expert_biases(name: str, args: ModelArgs) -> Optional[tuple[int, int]]:
    """The expected shape [experts, rows] of gpt-oss's biases of a layer's experts, else None."""
    m = _LAYER_RE.fullmatch(name)
    sub = m.group(2) if m else ""
    if not sub.endswith(".bias") or sub.removesuffix(".bias") + ".weight" not in _EXPERTS:
        return None
    layer = int(m.group(1))
    rows = args.dim if sub.startswith("ffn_down") else args.expert_hidden_dim
    return (args.experts(layer), rows) if layer < args.n_layers else None


def _convert(f: GGUFFile, name: str, args: ModelArgs, dtype: torch.dtype, weights: str, arch: str,
             kinds: Counter) -> dict[str, torch.Tensor]:
    """One GGUF tensor under our key names: its packed tensors, or one float tensor (a fused
    tensor: each part's)."""
    raw, qtype, shape = f.raw(name)
    permuted = arch in PERMUTED or (arch == "glm4" and f.get(f"{arch}.rope.dimension_sections") is None)
    fused = _fused_rows(name, args, arch)
    if name.endswith(_SHARED_GATE):
        kinds[qtype.name] += 1
        return {our_name(name, arch): f.tensor(name, dtype).reshape(1, -1)}
    if _expert_biases(name, args):
        kinds[qtype.name] += 1
        base, w, _ = our_name(name, arch).rsplit(".", 2)  # layers.N.feed_forward.experts, wK, bias
        return {f"{base}.{e}.{w}.bias": row for e, row in enumerate(f.tensor(name, dtype))}
    if fused is None:
        return _convert_rows(name, our_name(name, arch), raw, qtype, shape, args, weights, permuted, kinds,
                             lambda: f.tensor(name, dtype))
    cols, n_rows = shape[-1], math.prod(shape[:-1])
    # The float path decodes the tensor once for its parts.
    whole = functools.cache(lambda: f.tensor(name, dtype).reshape(n_rows, cols))
    out: dict[str, torch.Tensor] = {}
    for key, r0, r1 in fused[0]:
        rows = raw.reshape(n_rows, -1)[r0:r1].reshape(-1)
        out.update(_convert_rows(name, key, rows, qtype, (r1 - r0, cols), args, weights, permuted, kinds,
                                 lambda r0=r0, r1=r1: whole()[r0:r1]))
    return out


def _convert_rows(name: str, key: str, raw, qtype, shape: tuple[int, ...], args: ModelArgs, weights: str,
                  permuted: bool, kinds: Counter, floats: Callable[[], torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rows of tensor `name` (`raw` their bytes, `floats()` them in the model's dtype) as our `key`."""
    packed = None
    if weights == "auto" and len(shape) == 2:
        # Q and K rows are put back in order before packing (q4 packs rows in panels of 16).
        heads = _qk_heads(name, args) if permuted else None
        order = None if heads is None else unpermute_rows(torch.arange(shape[0]), heads, args.rope_dim).numpy()
        if qtype in REQUANTIZED:
            packed = requantize_gguf(raw, qtype, *shape, dequant.decoder(qtype), order=order)
            became = f"q8 (requantized: no native kernel for {qtype.name})"
        else:
            packed = pack_gguf(raw, qtype, *shape, order=order)
            became = GGUF_LAYOUTS[qtype].layout if packed is not None else ""
    if packed is not None:
        kinds[f"{qtype.name}->{became}"] += 1
        base = key.removesuffix(".weight")
        return {f"{base}.{suffix}": t for suffix, t in packed.items()}
    note = " (dequantized: no native layout)" if weights == "auto" and qtype in GGUF_LAYOUTS else ""
    kinds[f"{qtype.name}->float{note}" if len(shape) == 2 else qtype.name] += 1
    t = floats()
    return {key: (_unpermute(t, name, args) if permuted else t).contiguous()}


def _qk_heads(name: str, args: ModelArgs) -> Optional[int]:
    """The heads whose rows llama.cpp's converter permuted in tensor `name` (Q or K), else None."""
    if ".attn_q." in name:
        return args.n_heads
    if ".attn_k." in name:
        return args.n_kv_heads
    return None


def _unpermute(t: torch.Tensor, name: str, args: ModelArgs) -> torch.Tensor:
    """A float matrix's Q or K rows back to Hugging Face's order."""
    heads = _qk_heads(name, args)
    return t if heads is None else unpermute_rows(t, heads, args.rope_dim).contiguous()
