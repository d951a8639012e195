"""fastdecode's logits against llama.cpp's (llama-cpp-python) on the same GGUF file and token ids.

For each file: the built-in perplexity text's first N tokens through `fastdecode.load(path)`'s
cache-free forward and through llama-cpp-python with `logits_all`; per position, the cosine of
the two logit vectors, the largest absolute difference, and whether the top-1 tokens agree.

    PYTHONPATH=src .venv/bin/python benchmarks/logits_vs_llamacpp.py FILE.gguf [FILE.gguf ...] [--tokens 128]
"""

from __future__ import annotations

import argparse
import json

import torch


def compare(path: str, n_tokens: int) -> dict:
    import llama_cpp

    from importlib import resources

    import fastdecode
    from fastdecode.evaluation.perplexity import encode_text

    llm = fastdecode.load(path)
    text = (resources.files("fastdecode") / "data" / "perplexity.txt").read_text(encoding="utf-8")
    ids = encode_text(llm.tokenizer, text)[:n_tokens]
    with torch.inference_mode():
        ours = llm.model(torch.tensor([ids]), None)[0].float()
    ref = llama_cpp.Llama(model_path=path, n_ctx=n_tokens, n_batch=n_tokens, n_ubatch=n_tokens, logits_all=True,
                          verbose=False)
    ref.eval(ids)
    theirs = torch.from_numpy(ref.scores[:len(ids)].copy()).float()
    ref.close()
    cos = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1)
    return {"file": path, "tokens": len(ids), "cosine_min": round(cos.min().item(), 5),
            "cosine_mean": round(cos.mean().item(), 5), "max_abs_diff": round((ours - theirs).abs().max().item(), 4),
            "logit_scale": round(theirs.abs().max().item(), 2),
            "top1_agree": round((ours.argmax(-1) == theirs.argmax(-1)).float().mean().item(), 4),
            "weights": llm.weights_summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    for f in args.files:
        print(json.dumps(compare(f, args.tokens)), flush=True)


if __name__ == "__main__":
    main()
