import math

import pytest
import torch

from fastdecode import FastDecodeError, SamplingParams, kernels
from fastdecode.sampling import (SamplingBatch, adjust, apply_penalties, draw_from, first_max, logits_to_probs, make_generator,
                                 min_p_mask, sample, token_logprobs, top_k_mask, top_p_mask)
from fastdecode.sampling import ops as sampling_ops
from fastdecode.sampling.ops import best_of


def draw_uniforms(generator, rows, device):
    """U[0, 1) draws, one a row, as the engine's runner takes them for a step."""
    return torch.rand(rows, generator=generator, device=device)

# -- references written from the definitions, one row at a time in plain Python --


def ref_top_k_keep(row, k):
    order = sorted(range(len(row)), key=lambda i: -row[i])
    return set(order[:k])


def ref_top_p_keep(probs, p):
    """Smallest prefix of tokens by descending probability whose mass reaches p."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    keep, mass = set(), 0.0
    for i in order:
        keep.add(i)
        mass += probs[i]
        if mass >= p:
            break
    return keep


def ref_min_p_keep(probs, min_p):
    top = max(probs)
    return {i for i, q in enumerate(probs) if q >= min_p * top}


def rows(seed, B=6, V=50):
    # Distinct values so the definitions have no ties.
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def assert_mask_matches(drop, values, reference):
    """Row by row, the tokens the mask keeps are exactly those the reference keeps."""
    for r in range(values.shape[0]):
        kept = {i for i in range(values.shape[1]) if not drop[r, i]}
        assert kept == reference(values[r].tolist())


@pytest.mark.parametrize("k", [1, 3, 17, 50, 80])
def test_top_k_mask(k):
    logits = rows(0)
    assert_mask_matches(top_k_mask(logits, k), logits, lambda row: ref_top_k_keep(row, k))


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.999, 1.0])
def test_top_p_mask(p):
    probs = torch.softmax(rows(1) * 2, dim=-1)
    assert_mask_matches(top_p_mask(probs, p), probs, lambda row: ref_top_p_keep(row, p))


@pytest.mark.parametrize("min_p", [0.0, 0.01, 0.1, 0.5, 0.99])
def test_min_p_mask(min_p):
    probs = torch.softmax(rows(2) * 2, dim=-1)
    assert_mask_matches(min_p_mask(probs, min_p), probs, lambda row: ref_min_p_keep(row, min_p))


def batch_of(*params, V=8, full=False):
    return SamplingBatch.from_params(list(params), V, "cpu", full=full)


@pytest.mark.parametrize("k", [[1, 3, 17], [50, 80, 2]])
def test_top_k_mask_per_row(k):
    logits = rows(5, B=3)
    drop = top_k_mask(logits, torch.tensor(k))
    for r in range(3):
        assert {i for i in range(50) if not drop[r, i]} == ref_top_k_keep(logits[r].tolist(), k[r])


def test_top_p_zero_keeps_only_the_most_likely_token():
    """top_p=0 (which OpenAI's and llama.cpp's servers accept) samples the argmax whatever the draw."""
    logits = rows(3).float()
    p = SamplingParams(temperature=1.0, top_p=0.0)
    for seed in range(4):
        noise = draw_uniforms(torch.Generator().manual_seed(seed), 6, "cpu")
        assert torch.equal(sample(logits, batch_of(*[p] * 6, V=50), noise), logits.argmax(-1)), seed


def test_top_p_and_min_p_masks_per_row():
    probs = torch.softmax(rows(6, B=3) * 2, dim=-1)
    ps, mins = [0.3, 1.0, 0.9], [0.0, 0.2, 0.05]
    drop_p, drop_m = top_p_mask(probs, torch.tensor(ps)), min_p_mask(probs, torch.tensor(mins))
    for r in range(3):
        row = probs[r].tolist()
        assert {i for i in range(50) if not drop_p[r, i]} == ref_top_p_keep(row, ps[r])
        assert {i for i in range(50) if not drop_m[r, i]} == ref_min_p_keep(row, mins[r])


@pytest.mark.parametrize("scale, sorts", [(12.0, 0), (3.0, 0), (0.1, 1)])  # peaked: 256 or 4,096 do; flat: a sort
def test_masks_from_the_best_candidates_are_the_whole_row_masks(scale, sorts, monkeypatch):
    """Eager masks (k_limit known) look among each row's best tokens first; on distinct
    values they keep exactly what sorting whole rows keeps, widening where they must."""
    V = 6000
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(7)) * scale
    probs = torch.softmax(logits, dim=-1)
    ks, ps = torch.tensor([5, V, 300, 4500]), torch.tensor([0.5, 0.9, 1.0, 0.999])
    whole_k, whole_p = top_k_mask(logits, ks), top_p_mask(probs, ps)
    calls = []
    sort = torch.sort
    monkeypatch.setattr(torch, "sort", lambda *a, **kw: calls.append(1) or sort(*a, **kw))
    assert torch.equal(top_k_mask(logits, ks, k_limit=4500), whole_k)
    assert torch.equal(top_p_mask(probs, ps, k_limit=V), whole_p)
    assert len(calls) == sorts
    for r in (0, 1):  # p 0.5 and 0.9. (The reference has no p >= 1 rule, and a softmax row can sum
        # to 1 + 3e-9 in float64: it then stops short of the whole row.)
        kept = {i for i in range(V) if not whole_p[r, i]}
        assert kept == ref_top_p_keep(probs[r].tolist(), ps[r].item())
    # Under a top-k of 40, the nucleus lies among those 40.
    probs_k = torch.softmax(logits.masked_fill(top_k_mask(logits, 40), -math.inf), dim=-1)
    assert torch.equal(top_p_mask(probs_k, ps, k_limit=40), top_p_mask(probs_k, ps))


@pytest.mark.parametrize("V", [49152, 50001])  # rows of whole chunks, and a tail past the last one
@pytest.mark.parametrize("k", [1, 40, 256, 2000])
def test_best_of_is_topk(V, k):
    """The chunked search returns torch.topk's values, and the indices of those values
    (torch.topk's own where values are distinct), with the largest elements anywhere:
    in one chunk, spread out, in the tail, among -inf and among many ties."""
    g = torch.Generator().manual_seed(k)
    rows = torch.randn(6, V, generator=g) * 3
    rows[1, 100:100 + k] += 20  # the best all in a few neighbouring chunks
    rows[2, V - 7:] += 20  # some in the tail
    rows[3, torch.rand(V, generator=g) < 0.95] = -math.inf  # a grammar's mask
    rows[4] = torch.randint(0, 50, (V,), generator=g).float()  # ties everywhere
    rows[5, ::97] += 20  # spread over many chunks
    values, ids = best_of(rows, k)
    want = torch.topk(rows, k, dim=-1)
    assert torch.equal(values, want.values)
    assert torch.equal(rows.gather(1, ids), values) and all(len(set(r.tolist())) == k for r in ids)
    distinct = [0, 1, 2, 5]
    assert torch.equal(ids[distinct], want.indices[distinct])
    # The masks built on it keep what sorting whole rows keeps.
    probs = torch.softmax(rows[distinct], dim=-1)
    ps = torch.tensor([0.5, 0.9, 0.99, 0.999])
    assert torch.equal(top_p_mask(probs, ps, k_limit=V), top_p_mask(probs, ps))
    ks = torch.tensor([k, max(k // 2, 1), k, 1])
    assert torch.equal(top_k_mask(rows[distinct], ks, k_limit=k), top_k_mask(rows[distinct], ks))


def test_penalties_follow_their_definitions():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0], [2.0, -1.0, 0.5, 3.0]])
    seen = torch.tensor([[True, False, False, True], [True, False, False, True]])  # 0 in the prompt, 3 generated
    counts = torch.tensor([[0.0, 0, 0, 2], [0.0, 0, 0, 2]])
    b = batch_of(SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
                 SamplingParams(), V=4)
    got = apply_penalties(logits, b, counts, seen)
    # token 0: seen in prompt -> 2/2; token 3: generated twice -> 3/2 - 2*0.5 - 0.25
    expected = torch.tensor([[1.0, -1.0, 0.5, 1.5 - 1.0 - 0.25], [2.0, -1.0, 0.5, 3.0]])
    torch.testing.assert_close(got, expected)
    assert torch.equal(got[1], logits[1])  # neutral settings leave a row exactly as it was
    neg = apply_penalties(torch.tensor([[-2.0, 0, 0, 0]]), batch_of(SamplingParams(repetition_penalty=2.0), V=4),
                          counts[:1], seen[:1])
    assert neg[0, 0] == -4.0  # negative logits are multiplied


@pytest.mark.parametrize("params", [SamplingParams(temperature=1e300), SamplingParams(temperature=3.5e38),
                                    SamplingParams(temperature=1.0, repetition_penalty=1e-300),
                                    SamplingParams(temperature=1e-5, repetition_penalty=1e-40),
                                    SamplingParams(temperature=0.5, repetition_penalty=1e300)])
def test_extreme_settings_keep_the_distribution_finite(params):
    # Accepted settings beyond float32's range (inf temperature, a penalty that overflows a
    # logit) gave NaN probabilities, from which the draw picked the same token every time.
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 1.0, 0.0]])
    seen = torch.tensor([[True, True, False, False, False, True]])
    b = batch_of(params, V=6)
    adjusted = adjust(logits, b, counts=torch.zeros(1, 6), seen=seen,
                      banned=torch.tensor([[False, False, False, False, True, False]]))
    probs = logits_to_probs(adjusted, b)
    assert torch.isfinite(probs).all() and torch.isclose(probs.sum(), torch.tensor(1.0))
    assert probs[0, 4] == 0  # banned stays banned
    if params.temperature > 1e30:  # infinitely hot: every allowed token alike
        assert torch.allclose(probs[0, [0, 1, 2, 3, 5]], torch.full((5,), 0.2))
    elif params.repetition_penalty < 1:  # the seen token with a positive logit takes it all
        assert probs[0, 0] == 1
    else:  # seen: a positive logit goes to 0 (as the seen 0 is), a negative one to the bottom
        assert probs[0, 1] == 0 and torch.isclose(probs[0, 0], probs[0, 5])


def empirical(logits, params, n=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = logits.expand(n, -1)
    tokens = sample(batch, batch_of(*[params] * n, V=logits.shape[-1]), draw_uniforms(g, batch.shape[0], "cpu"))
    return torch.bincount(tokens, minlength=logits.shape[-1]).double() / n


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0), SamplingParams(temperature=0.5), SamplingParams(temperature=2.0),
    SamplingParams(temperature=1.0, top_k=3), SamplingParams(temperature=0.7, top_p=0.8),
    SamplingParams(temperature=1.0, min_p=0.2),
])
def test_sampling_frequencies_match_distribution(params):
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5, -1.0, 2.0, 0.2, -2.0]])
    # Expected distribution from the definitions: softmax(logits / T), then filters, renormalized.
    p = torch.softmax(logits[0].double() / params.temperature, -1).tolist()
    keep = set(range(len(p)))
    if params.top_k:
        keep &= ref_top_k_keep(logits[0].tolist(), params.top_k)
    q = [p[i] if i in keep else 0.0 for i in range(len(p))]
    q = [x / sum(q) for x in q]
    if params.top_p < 1:
        keep &= ref_top_p_keep(q, params.top_p)
    if params.min_p > 0:
        keep &= ref_min_p_keep(q, params.min_p)
    q = [q[i] if i in keep else 0.0 for i in range(len(q))]
    expected = torch.tensor([x / sum(q) for x in q], dtype=torch.float64)
    n = 20000
    freq = empirical(logits, params, n)
    # Each frequency is Binomial(n, p)/n: allow 5 standard deviations (false alarm ~1e-6 per cell).
    tol = 5 * torch.sqrt(expected * (1 - expected) / n) + 1e-12
    assert ((freq - expected).abs() <= tol).all(), (freq, expected)
    assert (freq[expected == 0] == 0).all()


def test_greedy_is_argmax():
    logits = rows(3).float()
    greedy = SamplingParams(temperature=0)
    assert torch.equal(sample(logits, batch_of(*[greedy] * 6, V=50)), logits.argmax(-1))


def test_a_vanishing_temperature_is_greedy():
    """Temperatures so small that logits / T overflows float32 pick the argmax, not any token."""
    logits = rows(3).float() * 30
    noise = draw_uniforms(torch.Generator().manual_seed(1), 6, "cpu")
    for t in (1e-6, 1e-30, 1e-40, 5e-324):
        p = SamplingParams(temperature=t)
        assert torch.equal(sample(logits, batch_of(*[p] * 6, V=50), noise), logits.argmax(-1)), t
        mixed = batch_of(p, SamplingParams(temperature=1.0), *[p] * 4, V=50)
        picked = sample(logits, mixed, noise)
        assert torch.equal(picked[[0, 2, 3, 4, 5]], logits.argmax(-1)[[0, 2, 3, 4, 5]]), t


@pytest.fixture(params=["native", "torch"])
def first_max_path(request, monkeypatch):
    """first_max through the kernels' op (skipped where they do not build) or torch.max."""
    if request.param == "native":
        if not kernels.load_kernels():
            pytest.skip(f"native kernels unavailable: {kernels.unavailable_reason}")
    else:
        monkeypatch.setattr(sampling_ops, "kernels_loaded", lambda: False)
    return request.param


def test_first_max_is_argmax_with_ties_nan_and_infinities(first_max_path):
    """Rows of few distinct values (many ties), a NaN (which argmax takes as the largest) in the
    vector part or the tail, rows of -inf only (banned everything), odd widths, -0 beside +0, a
    strided view."""
    g = torch.Generator().manual_seed(3)
    for b, v in [(1, 49152), (3, 7), (16, 1000), (5, 32001), (2, 1), (4, 9)]:
        x = torch.randint(-3, 3, (b, v), generator=g).float()
        x[0, v // 3] = math.nan
        x[-1] = -math.inf
        if b > 2:
            x[1, -1] = math.inf
            x[2, -1] = math.nan  # in the tail past the last 8 values
        assert torch.equal(first_max(x), x.argmax(-1)), (b, v)
    zeros = torch.tensor([[-1.0, -0.0, 0.0, -0.0], [-1.0, 0.0, -0.0, 0.0]])
    assert first_max(zeros).tolist() == zeros.argmax(-1).tolist() == [1, 1]
    wide = torch.randn(6, 2000, generator=g)[:, ::2]
    assert torch.equal(first_max(wide), wide.argmax(-1))


def test_rows_sample_independently_of_their_batch():
    """A row's token depends only on its own logits, settings and draw."""
    g = torch.Generator().manual_seed(4)
    logits, noise = torch.randn(4, 50, generator=g), draw_uniforms(g, 4, "cpu")
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_k=5),
              SamplingParams(temperature=1.2, top_p=0.8, min_p=0.05), SamplingParams(temperature=1.0)]
    together = sample(logits, batch_of(*params, V=50), noise)
    for full in (False, True):
        alone = [sample(logits[i:i + 1], batch_of(params[i], V=50, full=full), noise[i:i + 1]).item()
                 for i in range(4)]
        assert together.tolist() == alone


def test_logit_bias_moves_greedy_and_is_validated():
    logits = torch.zeros(1, 6)
    logits[0, 2] = 1.0
    bias = torch.zeros(1, 6)
    bias[0, 4] = 5.0
    assert sample(logits, batch_of(SamplingParams(temperature=0), V=6), bias=bias).item() == 4
    assert SamplingParams(logit_bias={"4": 5, 1: -100}).logit_bias == ((1, -100.0), (4, 5.0))
    for bad in ({"x": 1}, {3: 101}, {3: "a"}, [1, 2]):
        with pytest.raises(FastDecodeError, match="logit_bias"):
            SamplingParams(logit_bias=bad)


def test_token_logprobs_are_log_softmax():
    logits = rows(7, B=2).float()
    chosen, top_v, top_i = token_logprobs(logits, torch.tensor([3, 9]), 5)
    ref = torch.log_softmax(logits, -1)
    torch.testing.assert_close(chosen, ref[[0, 1], [3, 9]])
    torch.testing.assert_close(top_v, ref.topk(5).values)
    assert torch.equal(top_i, ref.topk(5).indices)


def test_banned_tokens_never_sampled():
    logits = torch.zeros(1000, 5)
    logits[:, 2] = 10.0
    banned = torch.tensor([False, False, True, False, False]).expand(1000, 5)
    g = torch.Generator().manual_seed(0)
    out = sample(logits, batch_of(*[SamplingParams(temperature=1.0)] * 1000, V=5),
                 draw_uniforms(g, logits.shape[0], "cpu"), banned=banned)
    assert not (out == 2).any()
    assert not (sample(logits, batch_of(*[SamplingParams(temperature=0)] * 1000, V=5), banned=banned) == 2).any()


def test_draw_from_follows_the_weights_and_never_picks_a_zero():
    w = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0]]).expand(4, 5)
    u = torch.tensor([0.0, 0.2999, 0.3001, 1 - 2 ** -24])  # the ends of [0, 1) included
    assert draw_from(w, u).tolist() == [1, 1, 3, 3]
    assert draw_from(w * 1e-30, u).tolist() == [1, 1, 3, 3]  # unnormalized weights
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(64, generator=g) * 2, -1)
    n = 200_000
    freq = torch.bincount(draw_from(p.expand(n, -1), torch.rand(n, generator=g)), minlength=64).double() / n
    assert 0.5 * (freq - p.double()).abs().sum() <= 4 / n ** 0.5


def test_seeded_generator_reproduces():
    a = draw_uniforms(make_generator(SamplingParams(seed=7), "cpu"), 30, "cpu")
    b = draw_uniforms(make_generator(SamplingParams(seed=7), "cpu"), 30, "cpu")
    c = draw_uniforms(make_generator(SamplingParams(seed=8), "cpu"), 30, "cpu")
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_logits_to_probs_normalized():
    p = SamplingParams(temperature=0.9, top_k=10, top_p=0.7, min_p=0.05)
    probs = logits_to_probs(rows(4).float(), batch_of(*[p] * 6, V=50))
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[0]))


@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("temperature", math.inf), ("temperature", "hot"), ("top_k", 0), ("top_k", 2.5),
    ("top_p", -0.1), ("top_p", 1.5), ("min_p", 1.0), ("min_p", -0.1), ("repetition_penalty", 0.0),
    ("frequency_penalty", 2.5), ("presence_penalty", -3.0), ("seed", "abc"), ("top_p", float("nan")),
    ("logprobs", 21), ("logprobs", -1), ("logprobs", 1.5), ("seed", 2**64), ("seed", -2**63 - 1),
])
def test_invalid_params_name_field_value_and_range(field, value):
    with pytest.raises(FastDecodeError) as e:
        SamplingParams(**{field: value})
    msg = str(e.value)
    assert field in msg and "\n" not in msg
