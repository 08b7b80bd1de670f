"""Hawk's RG-LRU initialisation (model.rg_lru_init): the paper's rule (default) and recurrentgemma's."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmlm.models import build_lm
from ssmlm.models.config import ModelConfig
from ssmlm.models.hawk import A_RANGE, init_lambda
from ssmlm.recipe import RecipeError, load_recipe

C = 8.0
LO, HI = A_RANGE


def decay(lam, r: float = 1.0) -> np.ndarray:
    """a_t = exp(−c·r·softplus(Λ)) at a fixed gate r (r = 1: a^c; r = 1/2: a_t at init, where r ≈ σ(0))."""
    return np.asarray(jnp.exp(-C * r * jax.nn.softplus(jnp.asarray(lam, jnp.float32))), np.float64)


@pytest.fixture(scope="module")
def draws():
    return {rule: init_lambda(jax.random.key(0), (50_000,), c=C, rule=rule) for rule in ("paper", "recurrentgemma")}


def test_paper_rule_makes_the_decay_at_r1_uniform_in_a_range(draws):
    a = decay(draws["paper"])
    assert a.min() >= LO - 1e-6 and a.max() <= HI + 1e-6
    assert a.min() < LO + 1e-3 and a.max() > HI - 1e-3
    qs = np.linspace(0.1, 0.9, 9)
    np.testing.assert_allclose(np.quantile(a, qs), LO + qs * (HI - LO), atol=2e-3)  # uniform
    assert np.median(a) == pytest.approx(0.9495, abs=2e-3)
    assert np.median(decay(draws["paper"], 0.5)) == pytest.approx(0.974, abs=2e-3)  # a_t at init: ~39 tokens


def test_recurrentgemma_rule_makes_the_base_decay_uniform_in_ring_area(draws):
    lam = draws["recurrentgemma"]
    base = decay(lam, 1 / C)  # a = exp(−softplus(Λ)), the ring radius
    qs = np.linspace(0.1, 0.9, 9)
    np.testing.assert_allclose(np.quantile(base**2, qs), LO**2 + qs * (HI**2 - LO**2), atol=3e-3)  # a² uniform
    a = decay(lam)  # a^c = a^8
    assert a.min() >= LO**C - 1e-5 and a.max() <= HI**C + 1e-5
    assert a.min() < 0.44 and a.max() > 0.99  # spans ~0.43-0.99
    assert np.median(a) == pytest.approx(((LO**2 + HI**2) / 2) ** (C / 2), abs=5e-3)  # 0.668
    assert np.median(decay(lam, 0.5)) == pytest.approx(0.817, abs=5e-3)  # a_t at init: ~5.5 tokens
    assert np.mean(a < LO) > 0.8  # most channels start far shorter than the paper rule's shortest


def test_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="rg_lru_init"):
        init_lambda(jax.random.key(0), (4,), rule="griffin")


def hawk_cfg(**kw):
    return ModelConfig(
        arch="hawk",
        vocab_size=50,
        hidden_size=32,
        state_size=512,
        num_layers=2,
        dropout=0.0,
        bidirectional="none",
        **kw,
    )


@pytest.mark.parametrize("rule", ["paper", "recurrentgemma"])
def test_the_rule_reaches_the_built_model(rule):
    model = build_lm(hawk_cfg(rg_lru_init=rule), seed=0)
    lams = [block.rg_lru.a_param[...] for block in model.blocks]
    a = decay(jnp.concatenate(lams))
    if rule == "paper":
        assert a.min() >= LO - 1e-5 and np.median(a) == pytest.approx(0.9495, abs=0.02)
    else:
        assert a.min() < 0.6 and np.median(a) == pytest.approx(0.668, abs=0.04)
    # the decay the recurrence actually applies at init, on random inputs (r = σ(W_a ξ) ≈ 1/2)
    block = model.blocks[0]
    xi = jax.random.normal(jax.random.key(1), (2, 64, 512))
    a_t, _ = block.rg_lru.coefficients(xi, jnp.zeros(xi.shape, bool))
    want = 0.974 if rule == "paper" else 0.817
    assert float(jnp.median(a_t)) == pytest.approx(want, abs=0.03)


def test_the_default_is_the_paper_rule_and_recipes_accept_the_option():
    assert hawk_cfg().rg_lru_init == "paper"
    assert load_recipe("clm_hawk").model.rg_lru_init == "paper"
    cfg = load_recipe("clm_hawk", ["model.rg_lru_init=recurrentgemma"]).model
    assert cfg.rg_lru_init == "recurrentgemma"
    small = dataclasses.replace(cfg, vocab_size=50, hidden_size=32, state_size=512, num_layers=2)
    assert decay(build_lm(small).blocks[0].rg_lru.a_param[...]).min() < 0.6
    with pytest.raises(RecipeError, match="rg_lru_init"):
        load_recipe("clm_hawk", ["model.rg_lru_init=griffin"])
