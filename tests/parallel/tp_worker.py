"""One rank of the TP=2 test battery (started by test_tp_gloo.py under torchrun, gloo on CPU).

Writes what it saw to OUT/rank{r}.json; the test compares the ranks with each
other and with TP=1 (computed here too, on the unsharded model).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

os.environ.setdefault("FASTDECODE_NO_PACKAGE", "1")

import fastdecode  # noqa: E402
from fastdecode.model.args import get_preset  # noqa: E402
from fastdecode.errors import FastDecodeError  # noqa: E402
from fastdecode.api.llm import split_options  # noqa: E402
from fastdecode.model.transformer import Transformer, init_random_weights  # noqa: E402
from fastdecode.parallel import shard_model  # noqa: E402
from fastdecode.quant import apply_kernels, build_model, quantize_state_dict  # noqa: E402

PROMPTS = ["Once upon a time", "def fib(n):", "The capital of France is"]
NEW = 12


def tokens(llm, prompts, **options) -> list[list[int]]:
    return [c.token_ids for c in llm.generate(prompts, max_new_tokens=NEW, **options)]


def runs(llm) -> dict:
    return {"greedy_b1": tokens(llm, PROMPTS[:1], temperature=0),
            "greedy_b3": tokens(llm, PROMPTS, temperature=0),
            "seeded_b3": tokens(llm, PROMPTS, temperature=0.9, top_p=0.95, seed=7),
            "unseeded_b3": tokens(llm, PROMPTS, temperature=1.0)}


def collectives_per_step(llm) -> dict:
    """c10d collectives in one decode step of batch 3 (eager or compiled alike)."""
    n = 3
    with profile(activities=[ProfilerActivity.CPU]) as p, torch.inference_mode():
        llm.steps.step(torch.zeros(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.long), torch.arange(n),
                       torch.arange(n)[:, None])
    names = Counter(e.name for e in p.events())
    return {"all_reduce": names["c10d::allreduce_"], "all_gather": names["_c10d_functional::all_gather_into_tensor"]}


def shapes(llm) -> dict:
    layer = llm.model.layers[0]
    a, f = layer.attention, layer.feed_forward
    return {"wqkv": list(a.wqkv.weight.shape), "wo": list(a.wo.linear.weight.shape),
            "w13": list(f.w13.weight.shape), "w2": list(f.w2.linear.weight.shape),
            "heads": [a.n_heads, a.n_kv_heads], "k_cache": list(a.kv_cache.k_cache.shape),
            "embedding": list(llm.model.tok_embeddings.weight.shape),
            "output": list(llm.model.output.linear.weight.shape), "head": llm.model.tp.head}


def sharded_logits(changes: dict, weights: str, head: str) -> dict:
    """Cache-free logits of a tiny variant, unsharded vs sharded by hand (no engine)."""
    args = get_preset("tiny").replace(**changes)
    sd = init_random_weights(Transformer(args), seed=0).state_dict()
    if weights == "int4":
        quantize_state_dict(unfused(sd, args), args, "int4", "test")  # matrices q4; table and head q8
    tokens_in = torch.tensor([[5, 17, 99, 3, 250, 42]])
    out = {}
    for tp in (1, 2):
        model, _ = build_model(args, {k: v.clone() for k, v in sd.items()}, torch.float32)
        model.eval()
        if tp == 2:
            shard_model(model, dist.group.WORLD, head=head)
        apply_kernels(model, gemv=False)
        with torch.inference_mode():
            out[tp] = model(tokens_in)
    layer, packed = model.layers[0], weights == "int4"
    result = {"max_diff": (out[1] - out[2]).abs().max().item(),
              "same_argmax": bool((out[1].argmax(-1) == out[2].argmax(-1)).all()), "head": model.tp.head,
              "head_rows": None if head == "replicated" else model.output.linear.out_features}
    if packed:
        result.update(w2_qweight=list(layer.feed_forward.w2.linear.qweight.shape),
                      w2_scales=list(layer.feed_forward.w2.linear.scales.shape),
                      wqkv_qweight=list(layer.attention.wqkv.qweight.shape))
    return result


VARIANTS = {  # hidden_dim 192: each rank's w2 gets 96 inputs, 3 blocks (an odd count, re-paired)
    "int4": ({"hidden_dim": 192}, "int4", "auto"),
    "int4_tied": ({"hidden_dim": 192, "tie_embeddings": True}, "int4", "auto"),
    "float_tied": ({"tie_embeddings": True}, "float", "auto"),
    "float_replicated_head": ({}, "float", "replicated"),
}


def unfused(sd: dict, args) -> dict:
    """A checkpoint's separate wq/wk/wv and w1/w3 (quantize_state_dict quantizes those names)."""
    q, kv = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    for i in range(args.n_layers):
        p = f"layers.{i}."
        wq, wk, wv = sd.pop(p + "attention.wqkv.weight").split([q, kv, kv])
        w1, w3 = sd.pop(p + "feed_forward.w13.weight").chunk(2)
        sd.update({p + "attention.wq.weight": wq, p + "attention.wk.weight": wk, p + "attention.wv.weight": wv,
                   p + "feed_forward.w1.weight": w1, p + "feed_forward.w3.weight": w3})
    return sd


def error(fn) -> str:
    try:
        fn()
    except FastDecodeError as e:
        return str(e)
    return ""


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1000 + rank)  # ranks must not depend on their global RNG agreeing
    result: dict = {"rank": rank}
    result["tp1"] = runs(fastdecode.load("tiny"))
    eager = fastdecode.load("tiny", tp=2)
    result["tp2_eager"] = runs(eager)
    result["shapes"] = shapes(eager)
    result["collectives_eager"] = collectives_per_step(eager)
    result["n_layers"] = eager.model.tp.full_args.n_layers
    compiled = fastdecode.load("tiny", tp=2, compile="decode")
    result["tp2_compiled"] = runs(compiled)
    result["collectives_compiled"] = collectives_per_step(compiled)
    counters = torch._dynamo.utils.counters
    result["graph_breaks"] = sum(counters["graph_break"].values())
    result["unique_graphs"] = counters["stats"]["unique_graphs"]
    result["variants"] = {name: sharded_logits(*v) for name, v in VARIANTS.items()}
    result["error_int4_tiny"] = error(lambda: fastdecode.load("tiny", tp=2, weights="int4"))
    result["error_default"] = error(lambda: fastdecode.load(tp=2))
    result["error_world_size"] = error(lambda: fastdecode.load("tiny", tp=3))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()  # leave together: a peer still in a collective would abort
    peer_death(rank, out_dir)


def peer_death(rank: int, out_dir: str) -> None:
    """Rank 1 leaves in the middle of a generation; rank 0's next step must fail, not hang."""
    llm = fastdecode.load("tiny", tp=2, max_batch_size=1)
    params, config = split_options({"max_new_tokens": 100, "temperature": 0})
    llm.engine.submit([5, 6, 7], params, config)
    if rank == 1:
        for _ in range(3):
            llm.engine.step()
        os._exit(0)  # no goodbye: its sockets just close
    t0, error = time.perf_counter(), ""
    try:
        while llm.engine.has_work():
            llm.engine.step()
    except RuntimeError as e:  # gloo's DistBackendError
        error = str(e)
    with open(os.path.join(out_dir, "peer_death.json"), "w") as f:
        json.dump({"error": error, "seconds": time.perf_counter() - t0}, f)
    os._exit(0)  # the group is broken: destroying it could wait on the dead peer


if __name__ == "__main__":
    main(sys.argv[1])
