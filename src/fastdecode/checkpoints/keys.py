"""The state-dict keys and shapes our `Transformer` expects, and a check against them.

Loaders run this before handing weights to the model, so a wrong or partial
checkpoint fails with one line naming the file and tensor rather than a long
`load_state_dict` report.
"""

from __future__ import annotations

import re
from typing import Optional

import torch

from ..model.args import ModelArgs
from ..model.moe import gated_mlps, routers
from ..errors import FastDecodeError
from ..quant.formats import SUFFIXES, layout_of, packed_shapes


def expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    q_rows, kv_rows = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "tok_embeddings.weight": (args.vocab_size, args.dim),
        "norm.weight": (args.dim,),
    }
    if not args.tie_embeddings:
        shapes["output.weight"] = (args.vocab_size, args.dim)
    for i in range(args.n_layers):
        p = f"layers.{i}."
        if args.pre_norms:
            shapes[p + "attention_norm.weight"] = (args.dim,)
        if args.pre_norms and not args.parallel_block:  # Cohere's MLP reads the attention's input
            shapes[p + "ffn_norm.weight"] = (args.dim,)
        shapes.update(_mlp_shapes(args, i))
        if args.post_norms:
            shapes.update({p + "post_attention_norm.weight": (args.dim,), p + "post_ffn_norm.weight": (args.dim,)})
        if i in args.conv_layers:  # LFM2's short convolution in place of attention (model/short_conv.py)
            shapes.update({p + "attention.in_proj.weight": (3 * args.dim, args.dim),
                           p + "attention.conv": (args.dim, args.conv_kernel),
                           p + "attention.out_proj.weight": (args.dim, args.dim)})
            continue
        shapes.update({
            p + "attention.wq.weight": (q_rows, args.dim),
            p + "attention.wk.weight": (kv_rows, args.dim),
            p + "attention.wv.weight": (kv_rows, args.dim),
            p + "attention.wo.weight": (args.dim, q_rows),
        })
        if args.attn_out_bias:
            shapes[p + "attention.wo.bias"] = (args.dim,)
        if args.attn_sinks:
            shapes[p + "attention.sinks"] = (args.n_heads,)
        if args.qkv_bias:
            shapes.update({
                p + "attention.wq.bias": (q_rows,),
                p + "attention.wk.bias": (kv_rows,),
                p + "attention.wv.bias": (kv_rows,),
            })
        if args.qk_norm:
            full = args.qk_norm_full
            shapes.update({p + "attention.q_norm.weight": (q_rows if full else args.head_dim,),
                           p + "attention.k_norm.weight": (kv_rows if full else args.head_dim,)})
    return shapes


def _gated_mlp(prefix: str, dim: int, hidden: int, bias: bool) -> dict[str, tuple[int, ...]]:
    shapes = {prefix + "w1.weight": (hidden, dim), prefix + "w2.weight": (dim, hidden),
              prefix + "w3.weight": (hidden, dim)}
    if bias:
        shapes.update({prefix + "w1.bias": (hidden,), prefix + "w2.bias": (dim,), prefix + "w3.bias": (hidden,)})
    return shapes


def _mlp_shapes(args: ModelArgs, layer: int) -> dict[str, tuple[int, ...]]:
    """Layer `layer`'s MLP: one gated MLP, or an MoE layer's router, experts and shared expert (with
    biases on the router and the experts where args.expert_bias)."""
    p = f"layers.{layer}.feed_forward."
    shapes = {}
    for name, rows in routers(args, layer):
        shapes[f"{p}{name}.weight"] = (rows, args.dim)
        if args.expert_bias and name == "gate":
            shapes[f"{p}{name}.bias"] = (rows,)
    if args.expert_selection_bias and args.experts(layer):
        shapes[f"{p}selection_bias"] = (args.n_experts,)
    for prefix, hidden in gated_mlps(args, layer):
        shapes.update(_gated_mlp(p + prefix, args.dim, hidden, args.expert_bias and prefix.startswith("experts.")))
    return shapes


def _expand_packed(expected: dict[str, tuple[int, ...]], state_dict: dict[str, torch.Tensor]) -> None:
    """Matrices stored packed (quant/formats.py) replace `X.weight` by `X.qweight`, `X.scales`[, `X.mins`]."""
    for key, shape in list(expected.items()):
        base = key.removesuffix(".weight")
        q = state_dict.get(f"{base}.qweight")
        if len(shape) != 2 or key in state_dict or q is None:
            continue
        del expected[key]
        group = {s: state_dict[f"{base}.{s}"] for s in SUFFIXES if f"{base}.{s}" in state_dict}
        expected.update({f"{base}.{s}": t for s, t in packed_shapes(layout_of(group), *shape).items()})


def check_state_dict(state_dict: dict[str, torch.Tensor], args: ModelArgs, source: str) -> None:
    """Fail on the first missing, unexpected or mis-shaped tensor."""
    expected = expected_shapes(args)
    _expand_packed(expected, state_dict)
    for key, shape in expected.items():
        if key not in state_dict:
            raise FastDecodeError(f"{source}: missing tensor for {key}")
        got = tuple(state_dict[key].shape)
        if got != shape:
            raise FastDecodeError(f"{source}: tensor {key} has shape {list(got)}, expected {list(shape)}")
    extra = sorted(set(state_dict) - set(expected))
    if extra:
        raise FastDecodeError(f"{source}: unexpected tensor {extra[0]} ({len(extra)} unexpected in all)")


def map_name(name: str, global_names: dict[str, str], layer_re: re.Pattern,
             layer_names: dict[str, str]) -> Optional[str]:
    """A checkpoint's tensor name -> our state-dict key, or None if we do not use it.

    `layer_re` captures (layer index, per-layer suffix); both formats differ only in these tables.
    """
    if name in global_names:
        return global_names[name]
    m = layer_re.fullmatch(name)
    if m is None:
        return None
    if m.group(2) in layer_names:
        return f"layers.{m.group(1)}.{layer_names[m.group(2)]}"
    # An MoE expert's tensor: the tables name it with "{}" for the expert's number.
    e = _EXPERT_RE.fullmatch(m.group(2))
    if e and (ours := layer_names.get(f"{e.group(1)}.{{}}.{e.group(3)}")):
        return f"layers.{m.group(1)}.{ours.format(int(e.group(2)))}"
    return None


_EXPERT_RE = re.compile(r"(.+\.experts)\.(\d+)\.(.+)")
