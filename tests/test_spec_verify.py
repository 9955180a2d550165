"""The verification rule: greedy prefix matching, and rejection sampling that preserves the target's
distribution (chi-square at alpha = 0.01), which a wrong acceptance rule fails."""

from __future__ import annotations

import pytest
import torch

from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.sampling.sampler import SampleRow, sample_row
from forge.spec.verify import verify, verify_request

ALPHA = 0.01
N = 20_000
V = 6


def chi2_pvalue(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson's chi-square goodness of fit; cells with zero expected mass must be empty."""
    observed = observed.double()
    expected = expected_probs.double() * observed.sum()
    keep = expected > 0
    assert observed[~keep].sum() == 0, "samples where the target has no mass"
    stat = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2.0))


def dist(seed: int, n: int = V, sparsity: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(n, generator=g, dtype=torch.float64) + 0.05
    if sparsity:
        w[torch.rand(n, generator=g) < sparsity] = 0.0
    return w / w.sum()


def draw(probs: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    return torch.multinomial(probs.float(), n, replacement=True, generator=g)


def first_tokens(p: torch.Tensor, q: torch.Tensor | None, accept_u: torch.Tensor | None = None) -> torch.Tensor:
    """One draft per sample (from q, or a fixed token if q is None); the first emitted token."""
    g = torch.Generator().manual_seed(1)
    drafts = draw(q, N, g) if q is not None else torch.full((N,), 2)
    target = torch.stack([p, dist(99)]).expand(N, 2, V)
    u = torch.rand(N, 2, 2, generator=g, dtype=torch.float64)
    if accept_u is not None:
        u[..., 0] = accept_u
    tokens, _ = verify(drafts[:, None], target, None if q is None else q.expand(N, 1, V), u)
    return tokens[:, 0]


def test_greedy_is_longest_matching_prefix_plus_target_token() -> None:
    scores = torch.full((2, 4, V), -1.0)
    for b, best in enumerate([[1, 2, 3, 4], [5, 0, 0, 0]]):
        for j, t in enumerate(best):
            scores[b, j, t] = 1.0
    tokens, accepted = verify(torch.tensor([[1, 2, 0], [1, 0, 0]]), scores)
    assert accepted.tolist() == [2, 0]
    assert tokens[0, :3].tolist() == [1, 2, 3]
    assert tokens[1, :1].tolist() == [5]
    tokens, accepted = verify(torch.tensor([[1, 2, 3]]), scores[:1])
    assert accepted.tolist() == [3] and tokens[0].tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("case", ["draft_model", "one_hot", "sparse_p"])
def test_rejection_sampling_preserves_target_distribution(case: str) -> None:
    p = dist(0, sparsity=0.4 if case == "sparse_p" else 0.0)
    q = None if case == "one_hot" else dist(1)
    counts = torch.bincount(first_tokens(p, q), minlength=V)
    assert chi2_pvalue(counts, p) > ALPHA


def test_two_positions_joint_distribution_with_bonus_tokens() -> None:
    """Generate two tokens by repeated verification of k = 2 drafts; positions have different
    target and draft distributions; the pair must follow p0 x p1."""
    p = [dist(10), dist(11), dist(12)]
    q = [dist(20), dist(21), dist(22)]
    g = torch.Generator().manual_seed(3)

    def step(pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        drafts = torch.stack([draw(q[pos + j], N, g) for j in range(2)], dim=1)
        target = torch.stack([p[pos], p[pos + 1], dist(30 + pos)]).expand(N, 3, V)
        draft_probs = torch.stack([q[pos], q[pos + 1]]).expand(N, 2, V)
        return verify(drafts, target, draft_probs, torch.rand(N, 3, 2, generator=g, dtype=torch.float64))

    tokens, accepted = step(0)
    second_step, _ = step(1)
    second = torch.where(accepted >= 1, tokens[:, 1], second_step[:, 0])
    pairs = torch.bincount(tokens[:, 0] * V + second, minlength=V * V)
    assert (accepted >= 1).float().mean() > 0.3  # both branches are exercised
    assert (accepted == 2).any()
    assert chi2_pvalue(pairs, torch.outer(p[0], p[1]).flatten()) > ALPHA


def test_always_accept_fails_the_same_test() -> None:
    p, q = dist(0), dist(1)
    counts = torch.bincount(first_tokens(p, q, accept_u=torch.tensor(0.0, dtype=torch.float64)), minlength=V)
    assert chi2_pvalue(counts, p) < ALPHA
    one_hot = torch.bincount(first_tokens(p, None, accept_u=torch.tensor(0.0, dtype=torch.float64)), minlength=V)
    assert chi2_pvalue(one_hot, p) < ALPHA


def test_resampling_from_p_instead_of_the_residual_fails() -> None:
    """A classic bug: accept with min(1, p/q) but resample from p on rejection."""
    p, q = dist(0), dist(1)
    g = torch.Generator().manual_seed(5)
    drafts = draw(q, N, g)
    accept = torch.rand(N, generator=g, dtype=torch.float64) * q[drafts] < p[drafts]
    wrong = torch.where(accept, drafts, draw(p, N, g))
    assert chi2_pvalue(torch.bincount(wrong, minlength=V), p) < ALPHA


def _request(params: SamplingParams, output: list[int]) -> Request:
    return Request("r", [1, 2, 3], params, output_token_ids=list(output))


def test_verify_request_greedy_matches_argmax_with_penalties() -> None:
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(max_tokens=8, temperature=0.0)
    best = logits.argmax(-1).tolist()
    tokens, lps = verify_request(logits, _request(params, [4]), 0, best[:3])
    assert tokens == best and lps is None
    tokens, _ = verify_request(logits, _request(params, [4]), 0, [best[0], (best[1] + 1) % V, 0])
    assert tokens == best[:2]
    # A repetition penalty sees earlier drafts: a token repeated as a draft is penalised at later rows.
    logits = torch.zeros(3, V)
    logits[:, 1] = 1.0
    logits[:, 2] = 0.9
    pen = SamplingParams(max_tokens=8, temperature=0.0, repetition_penalty=2.0, logprobs=1)
    tokens, lps = verify_request(logits, Request("r", [0], pen), 0, [1, 1])
    assert tokens == [1, 2] and lps is not None and len(lps) == 2


def test_verify_request_sampling_is_a_function_of_seed_and_position() -> None:
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=7)
    a = verify_request(logits, _request(params, [4]), 7, [0, 1])
    b = verify_request(logits.clone(), _request(params, [4]), 7, [0, 1])
    assert a == b
    outs = {tuple(verify_request(logits, _request(params, [4] * n), 7, [0, 1])[0]) for n in range(30)}
    assert len(outs) > 1  # different positions draw differently
    with pytest.raises(ValueError):
        verify_request(logits[:2], _request(params, []), 7, [0, 1])


def test_sampled_verification_emits_what_sampling_without_drafts_emits() -> None:
    """The emitted tokens are the ones the request samples with no drafts at all (same draw per
    position), whatever was drafted."""
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(0))
    for seed in range(40):
        params = SamplingParams(max_tokens=8, temperature=1.0, seed=seed)
        plain = [sample_row(logits[j], SampleRow(params, seed, 3 + j)) for j in range(4)]  # prompt [1, 2, 3]
        for drafts in ([0, 0, 0], plain[:3], [*plain[:2], (plain[2] + 1) % V], [(plain[0] + 1) % V, 1, 2]):
            tokens, _ = verify_request(logits, _request(params, []), seed, drafts)
            assert tokens == plain[: len(tokens)]
            accepted = len(tokens) - 1
            assert tokens[:accepted] == drafts[:accepted]
            assert accepted == 3 or tokens[accepted] != drafts[accepted]


def test_one_hot_coupled_verification_keeps_the_target_distribution() -> None:
    """The draft is accepted with probability p(x) and a rejection emits p restricted to "not x"."""
    p = dist(3)
    logits = torch.log(p).float().expand(2, V).clone()
    params = SamplingParams(max_tokens=8, temperature=1.0)
    first = torch.tensor([verify_request(logits, _request(params, []), s, [2])[0][0] for s in range(4000)])
    assert chi2_pvalue(torch.bincount(first, minlength=V), p.float().double()) > ALPHA
