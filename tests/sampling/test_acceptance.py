"""The draft-model acceptance rule: whatever q is, the tokens it hands out are
distributed as p. Checked with 10^6 draws per case against p itself."""

import pytest
import torch

from fastdecode.sampling.acceptance import accept_or_resample

N = 1_000_000


def run_rule(p: torch.Tensor, q: torch.Tensor, seed: int = 0):
    """N independent uses of the rule: drafts from q, the rule's own draws. Returns
    (the output's empirical distribution, the acceptance rate)."""
    g = torch.Generator().manual_seed(seed)
    V = p.numel()
    draft = torch.multinomial(q, N, replacement=True, generator=g)
    uniform = torch.rand(N, generator=g)
    resample = torch.rand(N, generator=g)
    accepted, tokens = accept_or_resample(p.expand(N, V), q.expand(N, V), draft, uniform, resample)
    return torch.bincount(tokens, minlength=V).double() / N, accepted.double().mean().item()


def dist(*values):
    t = torch.tensor(values, dtype=torch.float64)
    return (t / t.sum()).float()


CASES = {
    "random": (dist(0.1, 0.3, 0.05, 0.25, 0.2, 0.1), dist(0.3, 0.1, 0.2, 0.05, 0.15, 0.2)),
    "q is 0 where p is not": (dist(0.2, 0.3, 0.5, 0.0), dist(0.0, 0.5, 0.5, 0.0)),
    "p is 0 where q is not": (dist(0.0, 0.4, 0.6, 0.0), dist(0.25, 0.25, 0.25, 0.25)),
    "p equals q": (dist(0.1, 0.2, 0.3, 0.4), dist(0.1, 0.2, 0.3, 0.4)),
    "p one-hot": (dist(0.0, 0.0, 1.0, 0.0, 0.0), dist(0.2, 0.2, 0.2, 0.2, 0.2)),
    "q one-hot": (dist(0.3, 0.3, 0.4), dist(1.0, 0.0, 0.0)),
    "both one-hot, different": (dist(0.0, 1.0, 0.0), dist(1.0, 0.0, 0.0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_output_follows_the_target_distribution(case):
    p, q = CASES[case]
    empirical, acceptance = run_rule(p, q)
    tv = 0.5 * (empirical - p.double()).abs().sum().item()
    assert tv <= 4 / N ** 0.5, (case, tv, empirical.tolist(), p.tolist())
    # The chance of keeping the draft is sum_x min(p(x), q(x)).
    assert acceptance == pytest.approx(torch.minimum(p, q).sum().item(), abs=4 / N ** 0.5)
    if case == "p equals q":
        assert acceptance == 1.0
    assert (empirical[p == 0] == 0).all()  # a token p rules out never comes out


def test_random_pairs_over_a_larger_vocabulary():
    g = torch.Generator().manual_seed(1)
    for seed in range(3):
        p = torch.softmax(torch.randn(32, generator=g) * 2, -1)
        q = torch.softmax(torch.randn(32, generator=g) * 2, -1)
        empirical, _ = run_rule(p, q, seed)
        tv = 0.5 * (empirical - p.double()).abs().sum().item()
        assert tv <= 4 / N ** 0.5, (seed, tv)


def test_a_broken_rule_would_be_caught():
    """Control: returning the draft itself (as if every draft were accepted) is far from p."""
    p, q = CASES["random"]
    g = torch.Generator().manual_seed(0)
    draft = torch.multinomial(q, N, replacement=True, generator=g)
    empirical = torch.bincount(draft, minlength=p.numel()).double() / N
    assert 0.5 * (empirical - p.double()).abs().sum().item() > 4 / N ** 0.5
