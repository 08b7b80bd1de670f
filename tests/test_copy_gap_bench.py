"""benchmarks/copy_gap.py: its rows, and that a model that can copy is scored as copying."""

import numpy as np
from conftest import load_benchmark


def test_rows_repeat_the_payload_after_the_gap_and_separator():
    b = load_benchmark("copy_gap")
    r = b.rows(np.random.default_rng(0), 5, k=3, gap=4, vocab=20)
    assert r.shape == (5, 3 + 4 + 1 + 3)
    assert (r[:, :3] == r[:, -3:]).all() and (r[:, 7] == b.SEP).all()
    assert ((r[:, :3] >= b.PAYLOAD_FROM) & (r[:, :3] < 20)).all()
    assert all(x in b.FILLER for x in r[:, 3:7].ravel())


def test_a_transformer_learns_a_short_copy_and_the_table_says_so(capsys):
    b = load_benchmark("copy_gap")
    args = ["--archs", "transformer_lm", "--gaps", "2", "--seeds", "0", "--steps", "150", "--width", "32"]
    assert b.main([*args, "--layers", "1"]) == 0
    row = capsys.readouterr().out.splitlines()[-1].split("|")
    assert row[1].strip() == "transformer_lm" and row[2].strip() == "2"
    assert float(row[3]) > 0.9  # chance: 1/54
    assert b.main(["--gaps", "x"]) == 2 and "expected comma-separated whole numbers" in capsys.readouterr().err
    assert b.main(["--archs", "hawk", "--forget-bias", "3"]) == 2
    assert "only for gated_ssm and gated_ssm_plus" in capsys.readouterr().err


def test_the_forget_bias_sets_where_the_gated_ssm_forget_gates_start():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from ssmlm.models.config import LMConfig
    from ssmlm.models.lm import LanguageModel

    b = load_benchmark("copy_gap")
    cfg = LMConfig(arch="gated_ssm_plus", hidden_size=8, num_layers=2, state_size=8, num_heads=2, vocab_size=20,
                   max_seq_length=8, bidirectional="none")  # fmt: skip
    model = LanguageModel(cfg, rngs=nnx.Rngs(0))
    b.set_forget_bias(model, 3.0)
    u = jnp.zeros((1, 8))  # a zero input: f = σ(b_f)
    for block in model.blocks:
        np.testing.assert_allclose(np.asarray(jax.nn.sigmoid(block.w_f(u))), 1 / (1 + np.exp(-3.0)), rtol=1e-6)
