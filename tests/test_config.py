"""Every option of every conf group composes and instantiates; typos fail at compose time."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from forge.config import CONF_DIR, ConfigError, compose_config
from forge.kvcache.context import KVCacheContext

# Options that need something this machine may lack; each must fail with a clear message instead.
NEEDS_EXTERNAL: dict[tuple[str, str], str] = {
    ("backend", "cuda"): "backend=torch",
    ("model", "gguf"): "model.path",
    ("model", "safetensors"): "model.path",
    ("clock", "profiled"): "clock.profile",
    ("workload", "trace"): "workload.path",
    ("workload", "vidur_trace"): "workload.path",
}


NOT_GROUPS = {"hydra", "hardware"}  # hardware: the operator cost model's data (forge.sim.operators), not options


def fetches_a_real_model(group: str, option: str) -> bool:
    """A model option with a ``cache_dir`` downloads real weights on first use (smollm2, gemma3): its
    case is a ``realmodel`` test, slow and deselected with ``-m 'not realmodel'``."""
    return group == "model" and "cache_dir" in OmegaConf.load(Path(CONF_DIR) / group / f"{option}.yaml")


def all_options() -> list[tuple[str, str]]:
    out = []
    for group_dir in sorted(Path(CONF_DIR).iterdir()):
        if group_dir.is_dir() and group_dir.name not in NOT_GROUPS:
            out += [(group_dir.name, p.stem) for p in sorted(group_dir.glob("*.yaml"))]
    return out


CASES = [
    pytest.param(group, option, marks=[pytest.mark.realmodel] if fetches_a_real_model(group, option) else [])
    for group, option in all_options()
]


def test_real_model_options_are_marked() -> None:
    real = {option for group, option in all_options() if fetches_a_real_model(group, option)}
    assert {"smollm2", "gemma3"} <= real and not real & {"tiny", "synthetic", "gguf", "safetensors"}


@pytest.mark.parametrize(("group", "option"), CASES)
def test_every_option_composes_and_instantiates(group: str, option: str) -> None:
    key = (group, option)
    try:
        cfg = compose_config([f"{group}={option}"])
    except ConfigError as e:
        expected = NEEDS_EXTERNAL.get(key)
        assert expected is not None and expected in str(e), e
        return
    node = cfg[group]
    if group == "drafter":  # built against the target model and backend
        from forge.engine.build import build_engine

        assert build_engine(cfg).drafter is not None
        return
    if group == "kvcache":  # built from the engine's build context
        from forge.engine.build import build_kvcache

        obj = build_kvcache(cfg, KVCacheContext(64, node.block_size, max_model_len=256))
    else:
        try:
            obj = instantiate(node)
        except Exception as e:
            expected = NEEDS_EXTERNAL.get(key)
            if expected is not None:
                assert expected in str(e), e
                return
            raise
    assert obj is not None


def test_unknown_key_in_a_group_fails_at_compose_time() -> None:
    with pytest.raises(ConfigCompositionException, match="blok_size"):
        compose_config(["kvcache.blok_size=8"])


def test_unknown_engine_key_fails() -> None:
    with pytest.raises(ConfigCompositionException, match="max_num_seq"):
        compose_config(["engine.max_num_seq=8"])


def test_wrong_type_in_engine_fails() -> None:
    with pytest.raises(ConfigCompositionException) as info:
        compose_config(["engine.max_num_seqs=lots"])
    assert isinstance(info.value.__cause__, ValidationError | ConfigKeyError) or "lots" in str(info.value)


def test_wrong_type_in_a_group_option_fails() -> None:
    with pytest.raises(ConfigError, match="kvcache.block_size"):
        compose_config(["kvcache.block_size=big"])


def test_unknown_option_fails() -> None:
    with pytest.raises(ConfigCompositionException, match="fcsf"):
        compose_config(["scheduler=fcsf"])
