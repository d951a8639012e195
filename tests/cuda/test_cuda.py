"""fastdecode on a CUDA device: against transformers on the same GPU, and against our own CPU run.

Skipped without CUDA (CI has none); scripts/gpu_check.sh runs them on a GPU machine. Off the
CPU, quantized checkpoints are dequantized and the matmuls and attention are PyTorch's, so the
checks here are about the engine around them: the cache, the slots, the compiled steps.

Greedy tokens are compared on a model whose output head is scaled up: a tiny random model's
logits are nearly flat, so two correct implementations could pick different tokens at a
near-tie; with the head x 40 the top two logits are far apart.
"""

import sys
from pathlib import Path

import pytest
import torch

import fastdecode

sys.path.insert(0, str(Path(__file__).parents[1] / "checkpoints"))
from tiny_checkpoints import private_cache  # noqa: E402,F401  (autouse fixture)
from tiny_checkpoints import VOCAB, gguf_tensors, hf_model, write_gguf, write_hf_dir  # noqa: E402

DEVICE = "cuda"
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
transformers = pytest.importorskip("transformers")

HEAD_SCALE = 40.0


def peaky(arch="llama", seed=3, window=64, head_dim=None):
    """An untied tiny model with its output head scaled (see the module's docstring);
    head_dim: instead of 64 / 4 heads (q8_0 caches need a multiple of 32)."""
    model = hf_model(arch, tie=False, seed=seed, window=window, head_dim=head_dim)
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    return model


def prompts(lengths=(5, 13, 30), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


def ids(completions):
    return [c.token_ids for c in completions]


def greedy(llm, ps, n=24):
    return ids(llm.generate(ps, max_new_tokens=n, min_new_tokens=n, temperature=0))


@pytest.fixture(autouse=True)
def _exact_fp32():
    """float32 matmuls in float32 (no TF32), as transformers' reference runs them."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_logits_match_transformers_and_our_cpu_run(tmp_path, arch):
    model = hf_model(arch, tie=arch != "llama", seed=1)
    write_hf_dir(tmp_path, model)
    gpu = fastdecode.load(str(tmp_path), device=DEVICE, dtype="float32", max_seq_len=128, max_batch_size=2)
    cpu = fastdecode.load(str(tmp_path), dtype="float32", max_seq_len=128, max_batch_size=2)
    assert gpu.device.type == "cuda" and gpu.dtype == torch.float32
    t = torch.tensor(prompts((30,))).to(DEVICE)
    with torch.no_grad():
        ours = gpu.model(t, None)
        theirs = model.to(DEVICE)(t).logits
        mine_on_cpu = cpu.model(t.cpu(), None)
    assert (ours - theirs).abs().max().item() <= 1e-4
    assert (ours.cpu() - mine_on_cpu).abs().max().item() <= 1e-4


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_greedy_tokens_match_transformers_past_the_window(tmp_path, arch):
    """The engine's cache, slots and chunked prefill on CUDA against transformers' own
    generation, with prompts and outputs longer than the sliding window (8)."""
    model = peaky(arch, seed=2, window=8)
    write_hf_dir(tmp_path, model)
    llm = fastdecode.load(str(tmp_path), device=DEVICE, dtype="float32", max_seq_len=128, max_batch_size=3,
                          prefill_chunk=16)
    ps = prompts()
    got = greedy(llm, ps)
    model = model.to(DEVICE)
    for prompt, ours in zip(ps, got):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt], device=DEVICE), max_new_tokens=24, min_new_tokens=24,
                                 do_sample=False, pad_token_id=0)
        assert ours == out[0, len(prompt):].tolist()


def test_bfloat16_is_the_default_off_the_cpu(tmp_path):
    model = peaky()
    write_hf_dir(tmp_path, model)
    llm = fastdecode.load(str(tmp_path), device=DEVICE, max_seq_len=128, max_batch_size=2)
    assert llm.dtype == torch.bfloat16 and llm.engine.kv_dtype == "bfloat16"
    t = torch.tensor(prompts((30,))).to(DEVICE)
    with torch.no_grad():
        ours = llm.model(t, None).float()
        ref = model.to(DEVICE)(t).logits
    # bfloat16 keeps 8 bits of mantissa: the same top token at nearly every position
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
    cos = torch.nn.functional.cosine_similarity(ours, ref, dim=-1).min().item()
    assert agree >= 0.9 and cos >= 0.99, (agree, cos)


def test_a_batch_gives_each_prompt_its_own_tokens(tmp_path):
    write_hf_dir(tmp_path, peaky())
    llm = fastdecode.load(str(tmp_path), device=DEVICE, dtype="float32", max_seq_len=128, max_batch_size=3)
    ps = prompts()
    together = greedy(llm, ps)
    alone = [greedy(llm, [p])[0] for p in ps]
    assert together == alone


@pytest.mark.parametrize("strategy", ["decode", "generate"])
def test_compiled_steps_give_the_eager_tokens(tmp_path, strategy):
    """compile=decode (CUDA graphs on CUDA) and the compiled generate loop, greedy and seeded."""
    write_hf_dir(tmp_path, peaky(seed=4))
    kw = dict(device=DEVICE, dtype="float32", max_seq_len=128, max_batch_size=3, compiled=None)
    eager = fastdecode.load(str(tmp_path), **kw)
    compiled = fastdecode.load(str(tmp_path), compile=strategy, **kw)
    ps = prompts((4, 17, 33), seed=1)
    assert greedy(compiled, ps) == greedy(eager, ps)
    sampled = dict(max_new_tokens=16, temperature=0.8, top_p=0.9, seed=5)
    assert ids(compiled.generate(ps, **sampled)) == ids(eager.generate(ps, **sampled))


def test_prefix_cache_hit_gives_the_cold_tokens(tmp_path):
    write_hf_dir(tmp_path, peaky(seed=5))
    kw = dict(device=DEVICE, dtype="float32", max_seq_len=128, max_batch_size=2, prefill_chunk=16)
    on = fastdecode.load(str(tmp_path), **kw)
    off = fastdecode.load(str(tmp_path), prefix_cache=False, **kw)
    first = prompts((41,), seed=2)[0]  # ends mid-chunk
    reply = on.generate([first], max_new_tokens=12, min_new_tokens=12, temperature=0)[0]
    turn = first + reply.token_ids + prompts((9,), seed=3)[0]
    hit = on.generate([turn], max_new_tokens=16, min_new_tokens=16, temperature=0)[0]
    cold = off.generate([turn], max_new_tokens=16, min_new_tokens=16, temperature=0)[0]
    assert hit.cached_tokens == len(first) + len(reply.token_ids) - 1 and cold.cached_tokens == 0
    assert hit.token_ids == cold.token_ids


def test_quantized_gguf_is_dequantized_and_matches_the_cpu(tmp_path):
    """Q8_0/Q4_0 matrices on CUDA run dequantized: the logits of the CPU with weights=float."""
    from gguf import GGMLQuantizationType as T

    model = hf_model("llama", tie=True, seed=6)
    tensors = gguf_tensors(model)
    quant = {n: (T.Q8_0 if "attn" in n else T.Q4_0) for n, a in tensors.items() if a.ndim == 2}
    path = str(write_gguf(tmp_path / "q.gguf", tensors, quant=quant))
    gpu = fastdecode.load(path, device=DEVICE, dtype="float32", max_seq_len=128, max_batch_size=2)
    cpu = fastdecode.load(path, weights="float", dtype="float32", max_seq_len=128, max_batch_size=2)
    assert gpu.weights == "float"
    t = torch.tensor(prompts((30,)))
    with torch.no_grad():
        diff = (gpu.model(t.to(DEVICE), None).cpu() - cpu.model(t, None)).abs().max().item()
    assert diff <= 1e-4


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16", "q8_0"])
def test_kv_dtypes_stay_close_to_a_float32_cache(tmp_path, kv_dtype):
    """The cache in another dtype, read by a chunked prefill (later chunks read the earlier
    ones from the cache) and by every decode step: the same tokens, logprobs close."""
    write_hf_dir(tmp_path, peaky(seed=7, head_dim=32))
    kw = dict(device=DEVICE, dtype="float32", max_seq_len=128, max_batch_size=1, prefill_chunk=8)
    ref = fastdecode.load(str(tmp_path), kv_dtype="float32", **kw)
    llm = fastdecode.load(str(tmp_path), kv_dtype=kv_dtype, **kw)
    assert llm.engine.kv_dtype == kv_dtype
    p = prompts((40,), seed=4)
    opts = dict(max_new_tokens=8, min_new_tokens=8, temperature=0, logprobs=3)
    a, b = ref.generate(p, **opts)[0], llm.generate(p, **opts)[0]
    assert a.token_ids == b.token_ids
    assert max(abs(x.logprob - y.logprob) for x, y in zip(a.logprobs, b.logprobs)) <= 0.1
