"""The load-time transform: which module and which kernel runs each matmul.

`build_model` turns a state dict (float tensors, or the packed tensors of
`formats.py`) into a Transformer whose linears and embedding are
`QuantLinear`/`QuantEmbedding` where the weights are packed. `apply_kernels`
then sets, once, the native kernels or the PyTorch reference path on each
module, and for float32 CPU models the native GEMV where it measures faster
than `F.linear`, as `kernels.select` chooses.
Compile strategies and exported packages take the model as this leaves it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor, nn

from ..model.args import ModelArgs
from ..model.moe import gated_mlps, routers
from ..errors import FastDecodeError
from ..model.transformer import GLU_OPS, Attention, Embedding, FeedForward, RMSNorm, Transformer, adjacent_rows
from .formats import PANEL, PANEL_LAYOUTS, SUFFIXES, BlockSizeError, dequantize, layout_of, packed_k, quantize
from .linear import LAYOUT_OPS, QuantEmbedding, QuantLinear, SplitLinear, _Packed

WEIGHTS = ("auto", "float", "int8", "int4")


def check_weights(weights: object) -> str:
    if weights not in WEIGHTS:
        raise FastDecodeError(f"unknown weights={weights!r}; accepted: {', '.join(WEIGHTS)}")
    return weights


def _packed(sd: dict[str, Tensor], prefix: str) -> Optional[dict[str, Tensor]]:
    if f"{prefix}.qweight" not in sd:
        return None
    return {s: sd[f"{prefix}.{s}"] for s in SUFFIXES if f"{prefix}.{s}" in sd}


def _pop_packed(sd: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {s: sd.pop(f"{prefix}.{s}") for s in SUFFIXES if f"{prefix}.{s}" in sd}


def _module_paths(args: ModelArgs) -> list[tuple[str, tuple[str, ...]]]:
    """(module path, checkpoint prefixes it is built from) for every matrix."""
    out = []
    for i in range(args.n_layers):
        p = f"layers.{i}."
        if i in args.conv_layers:  # LFM2's short convolution (model/short_conv.py)
            out += [(p + f"attention.{w}", (p + f"attention.{w}",)) for w in ("in_proj", "out_proj")]
        else:
            out += [(p + "attention.wqkv", tuple(p + f"attention.{w}" for w in ("wq", "wk", "wv"))),
                    (p + "attention.wo", (p + "attention.wo",))]
        ff = p + "feed_forward."
        out += [(ff + name, (ff + name,)) for name, _ in routers(args, i)]  # an MoE layer's
        for m, _ in gated_mlps(args, i):  # the dense MLP, or each expert and the shared expert
            out += [(ff + m + "w13", (ff + m + "w1", ff + m + "w3")), (ff + m + "w2", (ff + m + "w2",))]
    if not args.tie_embeddings:
        out.append(("output", ("output",)))
    return out


def build_model(args: ModelArgs, state_dict: dict[str, Tensor], dtype: torch.dtype) -> tuple[Transformer, list[str]]:
    """The model for `state_dict` (consumed), and notes on matrices that had to be dequantized."""
    notes: list[str] = []
    with torch.device("meta"):
        model = Transformer(args)
    for path, parts in _module_paths(args):
        packs = [_packed(state_dict, p) for p in parts]
        if all(pk is None for pk in packs):
            continue
        layouts = [None if pk is None else layout_of(pk) for pk in packs]
        parent_name, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, name)
        if len(set(layouts)) > 1 and None in layouts:
            # Float and packed rows cannot share one matmul: run the group in float.
            for p, pk in zip(parts, packs):
                if pk is not None:
                    state_dict[f"{p}.weight"] = dequantize(_pop_packed(state_dict, p), dtype)
            notes.append(f"{path}: mixed layouts {sorted(map(str, set(layouts)))}, dequantized")
            continue
        # Each run of parts that share a layout (and for the layouts whose rows are in panels of
        # 16, follow a part of whole panels) concatenates; several runs each take their own
        # kernel (SplitLinear).
        runs: list[list[int]] = []
        for i, lay in enumerate(layouts):
            whole = lay not in PANEL_LAYOUTS or i == 0 or packs[i - 1]["qweight"].shape[0] % PANEL == 0
            if runs and layouts[runs[-1][0]] == lay and whole:
                runs[-1].append(i)
            else:
                runs.append([i])
        if len(runs) > 1:
            modules = []
            # The cache entry may store the parts' tensors fused (same dtype and row width,
            # e.g. q4k's and q6k's qweight): a tensor that would share a storage with one already
            # placed gets its own copy, as an exported layer's inputs must not alias each other.
            storages: set[int] = set()
            for j, run in enumerate(runs):
                group = [parts[i] for i in run]
                for s in SUFFIXES:
                    keys = [f"{p}.{s}" for p in group]
                    if keys[0] in state_dict:
                        ts = [state_dict.pop(key) for key in keys]
                        view = adjacent_rows(ts) if len(ts) > 1 else ts[0]
                        t = torch.cat(ts) if view is None else view
                        if t.untyped_storage().data_ptr() in storages:
                            t = t.clone()
                        storages.add(t.untyped_storage().data_ptr())
                        state_dict[f"{path}.parts.{j}.{s}"] = t
                modules.append(_new_linear(_packed(state_dict, f"{path}.parts.{j}"), False))
            setattr(parent, name, SplitLinear(modules, bias=old.bias is not None, device="meta"))
            continue
        first = _packed(state_dict, parts[0])
        n = sum(state_dict[f"{p}.qweight"].shape[0] for p in parts)
        setattr(parent, name, _new_linear(first, old.bias is not None, n))
    emb = _packed(state_dict, "tok_embeddings")
    if emb is not None:
        n, k = args.vocab_size, args.dim
        model.tok_embeddings = QuantEmbedding(n, k, layout_of(emb), dtype, device="meta")
    model.load_state_dict(state_dict, strict=True, assign=True)
    model.init_rope(next(iter(state_dict.values())).device)
    return model, notes


def _new_linear(pk: dict[str, Tensor], bias: bool, n: Optional[int] = None) -> QuantLinear:
    """An empty (meta) QuantLinear for the packed group `pk` (n rows: its own by default)."""
    layout = layout_of(pk)
    n = pk["qweight"].shape[0] if n is None else n
    return QuantLinear(packed_k(layout, pk), n, layout, bias=bias, device="meta")


def quantize_state_dict(state_dict: dict[str, Tensor], args: ModelArgs, weights: str, source: str) -> None:
    """weights=int8/int4: quantize the float matrices in place (int4: q4 linears, q8 embedding/head)."""
    layout = "q8" if weights == "int8" else "q4"
    # An MoE layer's routers stay float, as llama-quantize keeps them: small matrices whose rounding
    # would change which experts run.
    float_kept = {f"layers.{i}.feed_forward.{name}" for i in range(args.n_layers) for name, _ in routers(args, i)}
    prefixes = [p for _, parts in _module_paths(args) for p in parts if p not in float_kept] + ["tok_embeddings"]
    for p in prefixes:
        w = state_dict.get(f"{p}.weight")
        if w is None:
            continue
        if not w.is_floating_point():
            raise FastDecodeError(f"{source}: {p}.weight is not a float tensor; weights={weights} quantizes floats")
        lay = "q8" if p in ("tok_embeddings", "output") else layout
        try:
            packed = quantize(w, lay)
        except BlockSizeError as e:
            raise FastDecodeError(f"{source}: weights={weights} needs inner dimensions that are multiples of 32; "
                                  f"{p}.weight has shape {list(w.shape)} ({e}); use weights=float") from None
        del state_dict[f"{p}.weight"]
        state_dict.update({f"{p}.{s}": t for s, t in packed.items()})


# -- kernel choice ---------------------------------------------------------------------------

@dataclass
class KernelChoice:
    """What `apply_kernels` chose, for stats and exported packages."""

    quant: str = "none"  # "native (avx2|avx512-vnni)", "reference" or "none" (no packed weights)
    gemv: bool = False  # float32 linears on the native GEMV
    ops: list[str] = field(default_factory=list)  # torch.ops.fastdecode ops the model calls
    reason: Optional[str] = None  # why the native kernels are not used, if they are not


def native_ops(model: nn.Module) -> list[str]:
    """The torch.ops.fastdecode kernels `model`'s forward calls, sorted."""
    from ..kernels.linear import GemvEmbedding, GemvLinear

    ops = set()
    for m in model.modules():
        if isinstance(m, _Packed) and m.native:
            ops.add(LAYOUT_OPS[m.layout])
        elif isinstance(m, (GemvLinear, GemvEmbedding)):
            ops.add("gemv")
        elif isinstance(m, RMSNorm) and m.native:
            ops.add("rms_norm")
        elif isinstance(m, Attention) and m.native:
            ops.add("attention")
        elif isinstance(m, Transformer) and m.native_rope:
            ops.add("rope")
        elif isinstance(m, FeedForward) and m.native:
            ops.add(GLU_OPS[m.activation])
    return sorted(ops)


def apply_kernels(model: Transformer, *, gemv: Optional[bool] = None) -> KernelChoice:
    """Pick the kernels for `model` in place. gemv=None measures (float32 CPU models only)."""
    from .. import kernels
    from ..kernels import select

    choice = KernelChoice()
    packed = [m for m in model.modules() if isinstance(m, _Packed)]
    on_cpu = model.device.type == "cpu"
    native = select.use_native(model.device, model.dtype, quantized=bool(packed))
    if packed:
        for m in packed:
            m.native = native
        choice.quant = f"native ({kernels.active_isa()})" if native else "reference"
        if not native and on_cpu:
            choice.reason = kernels.unavailable_reason
    if native and select.native_float_layers(model.dtype):
        for m in model.modules():
            if isinstance(m, RMSNorm):
                m.native = True
            elif isinstance(m, Attention):
                m.native = select.attention_kernel_fits(m.head_dim)
            elif isinstance(m, FeedForward):
                m.native = m.activation in GLU_OPS
        model.native_rope = True
        # Time the GEMV only when the model has float matrices for it (not a fully packed one).
        has_float = (any(type(m) is nn.Linear for m in model.modules())
                     or (model.output is None and type(model.tok_embeddings) is Embedding))
        if has_float and (select.gemv_is_faster() if gemv is None else gemv):
            set_gemv(model, True)
    choice.ops = native_ops(model)
    choice.gemv = "gemv" in choice.ops
    return choice


def set_native(model: nn.Module, on: bool) -> None:
    """Run the packed matmuls on the native kernels (on=True) or the PyTorch reference."""
    for m in model.modules():
        if isinstance(m, _Packed):
            m.native = on


def set_gemv(model: Transformer, on: bool) -> None:
    """Run the float32 linears (and a tied head) on the native GEMV (on=True) or on
    F.linear; an exported package calls whichever it was exported with."""
    from ..kernels.linear import GemvEmbedding, GemvLinear, swap_class

    swaps = {nn.Linear: GemvLinear, Embedding: GemvEmbedding}
    if not on:
        swaps = {new: old for old, new in swaps.items()}
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            new = swaps.get(type(child))
            # The embedding's matmul is the head only in tied models.
            if new is not None and (not isinstance(child, nn.Embedding) or model.output is None):
                setattr(module, name, swap_class(child, new))
