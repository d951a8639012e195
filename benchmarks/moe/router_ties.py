"""Logits of an MoE GGUF against llama.cpp's (llama-cpp-python) on 64 random tokens, per position, with
the file's quantized experts (weights=auto) and dequantized (weights=float), and where those two runs of
ours choose different experts: a random router's top-k has near ties, so small numeric differences
change a token's experts, and the change spreads to later positions through attention.

    FASTDECODE_CACHE=/tmp/fd-oss python benchmarks/moe/router_ties.py FILE.gguf
"""
import sys

import llama_cpp
import torch

from fastdecode.checkpoints import load_checkpoint
from fastdecode.quant import apply_kernels, build_model

path = sys.argv[1]
tokens = torch.randint(100, 49000, (64,), generator=torch.Generator().manual_seed(0))
ref = llama_cpp.Llama(model_path=path, n_ctx=256, n_batch=256, logits_all=True, n_threads=2, verbose=False)
ref.eval(tokens.tolist())
theirs = torch.from_numpy(ref.scores[:64].copy()).float()
del ref
logits, chosen = {}, {}
for weights in ("auto", "float"):
    ckpt = load_checkpoint(path, dtype=torch.float32, weights=weights)
    model = build_model(ckpt.args, ckpt.state_dict, torch.float32)[0].eval()
    apply_kernels(model)
    picks = chosen[weights] = []
    for layer in model.layers:  # each layer's top-k experts per token, from its router
        layer.feed_forward.register_forward_hook(lambda mod, inp, out: picks.append(
            mod.gate(inp[0].reshape(-1, inp[0].shape[-1])).float().topk(mod.top_k).indices.sort(-1).values))
    with torch.no_grad():
        model.setup_caches(1, 256)
        logits[weights] = model(tokens[None], torch.arange(64)[None])[0]
    cos = torch.nn.functional.cosine_similarity(logits[weights], theirs, dim=-1)
    print(f"weights={weights} vs llama.cpp, cosine per position:", [round(c, 4) for c in cos.tolist()])
    print(f"  argmax agreement {(logits[weights].argmax(-1) == theirs.argmax(-1)).float().mean().item():.3f}")
    del model, ckpt
cos = torch.nn.functional.cosine_similarity(logits["auto"], logits["float"], dim=-1)
print("weights=auto vs weights=float, cosine per position:", [round(c, 4) for c in cos.tolist()])
for i, (a, b) in enumerate(zip(chosen["auto"], chosen["float"])):
    print(f"layer {i}: positions whose experts differ between auto and float:",
          (a != b).any(-1).nonzero().flatten().tolist())
