"""The per-operator cost model (``clock.cost=operators``): a step's time is the sum, over the
layers, of what each operator of a layer takes for the step's batch, plus the LM head, the
embedding and the tensor-parallel all-reduces. Its constants per GPU are data:
``conf/hardware/<clock.hardware>.yaml``, each documented with where it comes from."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from forge.models.base import ModelDims
from forge.sim.decode_attention import DecodeAttentionProfile, EfficiencyColumn
from forge.sim.prefill_attention import PrefillAttentionCurve, PrefillAttentionProfile
from forge.sim.step_sums import StepSums, SummedCostModel

HARDWARE_DIR = Path(__file__).resolve().parent.parent.parent / "conf" / "hardware"


@dataclass(frozen=True)
class OperatorConstants:
    """One GPU's figures (SI units: FLOP/s, B/s, s); ``conf/hardware/*.yaml`` says where each comes from.

    Decode attention's bandwidth efficiency is either a measured table (``decode_attn_profile``,
    by (request, KV head) pairs and context) or, for a GPU without one, the context curve
    ``decode_attn_bw_efficiency · (1 − 2^(−c / decode_attn_half_context))``; a preset gives one of the two.
    Prefill attention's causal pairs run at ``prefill_attn_flops_efficiency`` of peak, or, where the preset
    gives a measured ``prefill_attn_profile``, take the time it gives for their work."""

    name: str
    peak_flops: float
    mem_bw: float
    gemm_bw_efficiency: float
    gemm_flops_efficiency: float
    small_ops_floor_s: float
    small_ops_per_token_s: float
    prefill_attn_flops_efficiency: float
    link_bw: float
    link_latency_s: float
    step_overhead_s: float = 0.0
    decode_attn_bw_efficiency: float | None = None
    decode_attn_half_context: float | None = None
    decode_attn_profile: DecodeAttentionProfile | None = None
    prefill_cached_attn_flops_efficiency: float | None = None
    prefill_attn_profile: PrefillAttentionProfile | None = None

    @classmethod
    def load(cls, hardware: str, directory: Path = HARDWARE_DIR) -> OperatorConstants:
        path = directory / f"{hardware}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in directory.glob("*.yaml"))
            raise ValueError(
                f"clock.cost=operators has no constants for clock.hardware={hardware!r} (known: {known}; "
                f"add conf/hardware/{hardware}.yaml, or use clock.cost=roofline)"
            )
        data = yaml.safe_load(path.read_text())
        names = {f.name for f in fields(cls)}
        optional = {"step_overhead_s", "decode_attn_profile", "decode_attn_bw_efficiency", "decode_attn_half_context"}
        optional |= {"prefill_cached_attn_flops_efficiency", "prefill_attn_profile"}
        missing = sorted(names - set(data) - optional)
        unknown = sorted(set(data) - names)
        if missing or unknown:
            raise ValueError(f"{path}: missing {missing}, unknown {unknown}")
        profile, prefill = data.pop("decode_attn_profile", None), data.pop("prefill_attn_profile", None)
        try:
            table = None if profile is None else DecodeAttentionProfile.from_yaml(profile)
            prefill_table = None if prefill is None else PrefillAttentionProfile.from_yaml(prefill)
            numbers = {k: float(v) for k, v in data.items() if k != "name"}
            return cls(str(data["name"]), decode_attn_profile=table, prefill_attn_profile=prefill_table, **numbers)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None

    def __post_init__(self) -> None:
        for name in ("prefill_attn_flops_efficiency", "prefill_cached_attn_flops_efficiency"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        curve = (self.decode_attn_bw_efficiency, self.decode_attn_half_context)
        table_only = self.decode_attn_profile is not None and curve == (None, None)
        if not table_only and (self.decode_attn_profile is not None or None in curve):
            raise ValueError(
                "give either decode_attn_profile or both decode_attn_bw_efficiency and decode_attn_half_context"
            )


def all_reduce_time(num_bytes: float, tensor_parallel: int, link_bw: float, latency: float) -> float:
    """A ring all-reduce of ``num_bytes`` over ``tensor_parallel`` GPUs: each sends and receives
    2(N − 1)/N of the data over its link, after a fixed latency. 0 on one GPU."""
    if tensor_parallel == 1:
        return 0.0
    return latency + 2 * (tensor_parallel - 1) / tensor_parallel * num_bytes / link_bw


class OperatorCostModel(SummedCostModel):
    """Per layer (every GPU of a ``tensor_parallel`` group holds 1/N of the weights and heads):

    - GEMMs (qkv, o, gate+up, down): ``hypot(weight bytes / (bw · e_bw), FLOPs / (peak · e_flops))``,
      a smooth knee from memory-bound (few tokens) to compute-bound (many);
    - decode attention: the decodes' K/V bytes at the mean context c, read at the bandwidth
      efficiency the GPU's measured ``decode_attn_profile`` gives for its (request, KV head) pairs and
      c (``forge/sim/decode_attention.py``), or else at ``bw · e_attn · (1 − 2^(−c / c_half))``
      (short contexts do too little work per thread block to reach the bandwidth);
    - prefill attention: causal (query, key) pairs at ``prefill_attn_flops_efficiency`` of peak, or
      the time the GPU's measured ``prefill_attn_profile`` gives for their work (pairs x heads x head
      size, ``forge/sim/prefill_attention.py``). Either way a step's pairs are charged together, which
      equals Vidur's lookup of several prompts as one of length sqrt(Σq²): Σ q²/2 pairs either way.
      The pairs whose keys were cached before the step (a chunk after earlier chunks or a prefix-cache
      hit: Σ q·start) run at ``prefill_cached_attn_flops_efficiency`` where a preset gives one (a dense
      block of keys, no causal mask: the kernel runs near its peak; on Vidur's A100 profile 3x the
      masked part's efficiency), else as causal ones;
    - small operators (norms, RoPE, activation, residual add): a floor plus a cost per token;
    - with N > 1, two all-reduces of the step's hidden states (after attention and after the MLP).

    Plus, once per step: the LM head for the sampled rows (a GEMM like the others), reading the
    new tokens' embeddings, and ``step_overhead_s``.
    """

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def __init__(self, dims: ModelDims, constants: OperatorConstants, tensor_parallel: int = 1) -> None:
        if tensor_parallel < 1:
            raise ValueError(f"clock.tensor_parallel must be >= 1, got {tensor_parallel}")
        if dims.num_heads % tensor_parallel:
            raise ValueError(
                f"clock.tensor_parallel={tensor_parallel} does not divide the model's {dims.num_heads} heads"
            )
        self.dims, self.c, self.tp = dims, constants, tensor_parallel
        d, c, n = dims, constants, tensor_parallel
        bpp = d.bytes_per_param
        layer_params = d.hidden_size * d.head_dim * (2 * d.num_heads + 2 * d.num_kv_heads)
        layer_params += 3 * d.hidden_size * d.intermediate_size
        self.gemm_mem_s = layer_params * bpp / n / (c.mem_bw * c.gemm_bw_efficiency)
        self.gemm_flop_s = 2 * layer_params / n / (c.peak_flops * c.gemm_flops_efficiency)
        head_params = d.vocab_size * d.hidden_size
        self.head_mem_s = head_params * bpp / n / (c.mem_bw * c.gemm_bw_efficiency)
        self.head_flop_s = 2 * head_params / n / (c.peak_flops * c.gemm_flops_efficiency)
        self.embed_s = d.hidden_size * bpp / c.mem_bw
        kv_heads = max(d.num_kv_heads // n, 1)
        self.kv_heads = kv_heads  # on one GPU
        self.kv_bytes = 2 * kv_heads * d.head_dim * d.kv_value_bytes  # per token of context, per layer
        self.pair_flop_s = 4 * (d.num_heads // n) * d.head_dim / (c.peak_flops * c.prefill_attn_flops_efficiency)
        cached_eff = c.prefill_cached_attn_flops_efficiency
        self.cached_pair_flop_s = (
            None if cached_eff is None else self.pair_flop_s * c.prefill_attn_flops_efficiency / cached_eff
        )
        self.hidden_bytes = d.hidden_size * bpp
        profile = c.decode_attn_profile
        self._grid = None if profile is None else profile.at(c.mem_bw)
        self._prefill = None if c.prefill_attn_profile is None else c.prefill_attn_profile.curve()
        self.pair_work = (d.num_heads // n) * d.head_dim  # one causal pair's work in the profile's units
        self._terms_of: dict[int, CountTerms] = {}  # per count, computed on first use

    def terms(self, count: int) -> CountTerms:
        """The parts of a step's time that depend on one count only (``CountTerms``)."""
        terms = self._terms_of.get(count)
        if terms is None:
            c, n = self.c, count
            terms = CountTerms(
                dense=math.hypot(self.gemm_mem_s, self.gemm_flop_s * n)
                + (c.small_ops_floor_s + c.small_ops_per_token_s * n),
                all_reduces=2 * all_reduce_time(n * self.hidden_bytes, self.tp, c.link_bw, c.link_latency_s),
                head=math.hypot(self.head_mem_s, self.head_flop_s * n) if n else 0.0,
                embed=self.embed_s * n,
                attention=None if self._grid is None else self._grid.column(n * self.kv_heads),
            )
            self._terms_of[count] = terms
        return terms

    def decode_attention_time(self, num_decodes: int, mean_context: float) -> float:
        """One layer's decode attention for ``num_decodes`` requests at ``mean_context`` tokens."""
        return self._attention(self.terms(num_decodes), num_decodes, mean_context)

    def _attention(self, terms: CountTerms, num_decodes: int, mean_context: float) -> float:
        c, e_max, c_half = self.c, self.c.decode_attn_bw_efficiency, self.c.decode_attn_half_context
        if terms.attention is not None:
            eff = terms.attention.efficiency(mean_context)
        elif e_max is not None and c_half is not None:
            eff = e_max * (1.0 - 2.0 ** (-mean_context / c_half))
        else:  # excluded by OperatorConstants.__post_init__
            raise ValueError(f"{c.name}: no decode attention efficiency")
        return num_decodes * mean_context * self.kv_bytes / (c.mem_bw * eff)

    def layer_time(self, s: StepSums) -> float:
        """One transformer layer's time for the step (all operators, all-reduces included)."""
        return self._layer_time(s, self.terms(s.tokens))

    def _layer_time(self, s: StepSums, terms: CountTerms) -> float:
        t = terms.dense
        if s.num_decodes:
            t += self.decode_attention_time(s.num_decodes, s.decode_context / s.num_decodes)
        cached, cached_s = s.prefill_cached_pairs, self.cached_pair_flop_s
        if (curve := self._prefill) is not None:
            t += self._prefill_time(curve, s.prefill_pairs, cached)
        elif cached and cached_s is not None:  # else the bits of the one-efficiency sum
            t += self.pair_flop_s * (s.prefill_pairs - cached) + cached_s * cached
        else:
            t += self.pair_flop_s * s.prefill_pairs
        if self.tp > 1:
            t += terms.all_reduces
        return t

    def _prefill_time(self, curve: PrefillAttentionCurve, pairs: float, cached: int) -> float:
        """One layer's prefill attention with a measured profile (``curve``): the causal pairs by the
        profile, those over cached keys at ``prefill_cached_attn_flops_efficiency`` (else as causal ones)."""
        cached_s = self.cached_pair_flop_s
        causal = pairs - cached if cached_s is not None else pairs
        t = curve.time(causal * self.pair_work) if causal > 0 else 0.0
        return t + cached_s * cached if cached_s is not None and cached else t

    def time_of(self, sums: StepSums) -> float:
        terms = self.terms(sums.tokens)
        head = self.terms(sums.num_sampled).head
        return self.dims.num_layers * self._layer_time(sums, terms) + head + terms.embed + self.c.step_overhead_s

    def decode_step_time(self, num_decodes: int, context_sum: int) -> float | None:
        """``time_of`` a step of plain decodes, term by term in ``time_of``'s order (no prefill pairs:
        adding their 0.0 changes no bits) from the terms of ``num_decodes``."""
        terms = self.terms(num_decodes)
        t = terms.dense + self._attention(terms, num_decodes, context_sum / num_decodes)
        if self.tp > 1:
            t += terms.all_reduces
        return self.dims.num_layers * t + terms.head + terms.embed + self.c.step_overhead_s


@dataclass(frozen=True, slots=True)
class CountTerms:
    """What ``OperatorCostModel`` charges for a count ``n``: per layer, a step of n tokens' GEMMs and
    small operators (``dense``) and all-reduces (``all_reduces``, both of them; 0 on one GPU); per step,
    the LM head for n sampled rows (``head``) and n tokens' embeddings (``embed``); the decode-attention
    efficiency of n decodes by context (``attention``; None without a ``decode_attn_profile``)."""

    dense: float
    all_reduces: float
    head: float
    embed: float
    attention: EfficiencyColumn | None
