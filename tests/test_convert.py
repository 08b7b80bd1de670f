"""Importing the official BiGS checkpoints (ssmlm.models.convert).

Each test writes a tiny checkpoint in the OFFICIAL layout (docs/faithfulness.md#bigs-heads: a Flax msgpack tree with
`s4_bert` and `cls` / `classifier`, the official key names and shapes, plus a config.json with BiGSConfig
keys and a vocab.txt), imports it, loads the run back with open_run(...).load_model(), and compares the
model's outputs with a float64 numpy computation written directly from the official equations
(docs/faithfulness.md#bigs-layer, #bigs-s4d) on the raw official dict. Nothing here touches the network.
"""

import json

import numpy as np
import pytest
from conftest import invoke
from flax import nnx, serialization
from scipy.special import erf

from ssmlm.errors import CheckpointError
from ssmlm.models.convert import model_config_from_official
from ssmlm.runs import open_run
from ssmlm.runs.importing import import_bigs, read_official

V, H, I, LAYERS, N, L = 40, 16, 48, 2, 8, 16  # noqa: E741
WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "ran", "big", "small", "red", "blue", "house", "tree"]


# ----------------------------------------------------------------------------- an official-layout checkpoint


def official_params(seed: int = 0, classifier_labels: int | None = None) -> dict:
    """Random parameters, official names and shapes (FlaxBiGSForMaskedLM / ...ForSequenceClassification)."""
    rng = np.random.default_rng(seed)
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731

    def dense(d_in, d_out):
        return {
            "kernel": f32(rng.normal(0, 1 / np.sqrt(d_in), (d_in, d_out))),
            "bias": f32(rng.normal(0, 0.1, d_out)),
        }

    def ln(d):
        return {"scale": f32(1 + rng.normal(0, 0.1, d)), "bias": f32(rng.normal(0, 0.1, d))}

    def s4():
        a_re = -rng.uniform(0.05, 1.0, N)
        a_re[0] = 0.3  # stored unconstrained; the forward pass clips it to -1e-4
        return {
            "A_re": f32(a_re),
            "A_im": f32(rng.uniform(-8, 8, N)),
            "C": f32(rng.normal(0, np.sqrt(0.5), (N, 2))),
            "D": f32(rng.normal(1, 0.3, (1,))),
            "log_step": f32(rng.uniform(np.log(0.01), 0, (1,))),
        }

    layers = {
        str(i): {
            "LayerNorm": ln(H),
            "dv": dense(H, I),
            "du_forward": dense(H, H),
            "du_backward": dense(H, H),
            "fs4": s4(),
            "bs4": s4(),
            "duc_forward": dense(H, H),
            "duc_backward": dense(H, H),
            "dol": dense(H, I),
            "do": dense(I, H),
        }
        for i in range(LAYERS)
    }
    s4_bert = {
        "embeddings": {
            "word_embeddings": {"embedding": f32(rng.normal(0, 0.5, (V, H)))},
            "position_embeddings": {"embedding": f32(rng.normal(0, 0.5, (L, H)))},
            "token_type_embeddings": {"embedding": f32(rng.normal(0, 0.5, (2, H)))},
            "LayerNorm": ln(H),
        },
        "encoder": {"layer": layers},
    }
    if classifier_labels is None:
        cls = {
            "predictions": {
                "transform": {"dense": dense(H, H), "LayerNorm": ln(H)},
                "bias": f32(rng.normal(0, 0.1, V)),
            }
        }
        return {"s4_bert": s4_bert, "cls": cls}
    s4_bert["pooler"] = {"dense": dense(H, H)}
    return {"s4_bert": s4_bert, "classifier": dense(H, classifier_labels)}


def official_config(**kw) -> dict:
    cfg = {
        "architectures": ["BiGSForMaskedLM"],
        "model_type": "BiGS",
        "vocab_size": V,
        "hidden_size": H,
        "num_hidden_layers": LAYERS,
        "intermediate_size": I,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "max_position_embeddings": L,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "num_ssm": N,
        "pre_norm": True,
        "decode": False,
        "scaling": "hippo",
        "pooler_type": "non_padding_mean",
        "tie_word_embeddings": True,
        "transformers_version": "4.26.1",
    }
    cfg.update(kw)
    return cfg


def write_official(d, params: dict, config: dict, vocab: bool = True):
    d.mkdir(parents=True, exist_ok=True)
    (d / "flax_model.msgpack").write_bytes(serialization.msgpack_serialize(params))
    (d / "config.json").write_text(json.dumps(config, indent=2))
    if vocab:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tokens = specials + WORDS + [f"##{c}" for c in "abcdefghijklmnopqrstu"]
        assert len(tokens) == V
        (d / "vocab.txt").write_text("\n".join(tokens) + "\n")
    return d


# ----------------------------------------------------------------------------- the official equations, numpy


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def gelu_exact(x):
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def layer_norm(x, p, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def dense(x, p):
    return x @ np.asarray(p["kernel"], np.float64) + p["bias"]


def s4_layer(p, u):
    """One S4dLayer on (L, H), docs/faithfulness.md#bigs-s4d, by explicit sums (not the implementation's FFT):

    K[l] = Re Σ_n C_n (e^{ΔA_n} - 1)/A_n e^{lΔA_n};  y_t = Σ_{j≤t} K_j u_{t-j} + D u_t.
    Same kernel and D for every channel."""
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    a = np.minimum(p["A_re"], -1e-4) + 1j * p["A_im"]
    c = p["C"][:, 0] + 1j * p["C"][:, 1]
    step = np.exp(p["log_step"][0])
    length = u.shape[0]
    k = np.array([np.real(np.sum(c * (np.exp(step * a) - 1) / a * np.exp(ell * step * a))) for ell in range(length)])
    y = np.zeros_like(u)
    for t in range(length):
        for j in range(t + 1):
            y[t] += k[j] * u[t - j]
    return y + p["D"][0] * u


def official_encoder(tree, ids, token_types):
    """s4_bert on one sequence (L,) -> (L, H), as FlaxBiGSModel (pre-LN GATED layers, no final LN)."""
    e = tree["s4_bert"]["embeddings"]
    h = (
        np.asarray(e["word_embeddings"]["embedding"], np.float64)[ids]
        + np.asarray(e["token_type_embeddings"]["embedding"], np.float64)[token_types]
        + np.asarray(e["position_embeddings"]["embedding"], np.float64)[np.arange(len(ids))]
    )
    h = layer_norm(h, e["LayerNorm"])
    layers = tree["s4_bert"]["encoder"]["layer"]
    for i in range(len(layers)):
        p = layers[str(i)]
        x = layer_norm(h, p["LayerNorm"])
        v = gelu_tanh(dense(x, p["dv"]))
        f = gelu_tanh(dense(x, p["du_forward"]))
        b = gelu_tanh(dense(x[::-1], p["du_backward"]))
        f = s4_layer(p["fs4"], f)
        b = s4_layer(p["bs4"], b)
        u = dense(f, p["duc_forward"]) * dense(b, p["duc_backward"])[::-1]
        o = dense(gelu_tanh(dense(u, p["dol"])) * v, p["do"])
        h = h + o
    return h


def official_mlm_logits(tree, ids, token_types):
    h = official_encoder(tree, ids, token_types)
    pred = tree["cls"]["predictions"]
    h = layer_norm(gelu_exact(dense(h, pred["transform"]["dense"])), pred["transform"]["LayerNorm"])
    word = np.asarray(tree["s4_bert"]["embeddings"]["word_embeddings"]["embedding"], np.float64)
    return h @ word.T + pred["bias"]


def official_class_logits(tree, ids, token_types, mask):
    h = official_encoder(tree, ids, token_types)
    m = mask[:, None].astype(np.float64)
    pooled = (h * m).sum(0) / m.sum()  # non_padding_mean
    pooled = np.tanh(dense(pooled, tree["s4_bert"]["pooler"]["dense"]))
    return dense(pooled, tree["classifier"])


def batch(seed=1):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, V, (2, L)).astype(np.int32)
    ids[:, 0] = 2  # [CLS]
    ids[1, 11:] = 0  # right padding in the second row
    types = np.zeros((2, L), np.int32)
    types[0, 8:] = 1  # a second segment exercises the token-type table
    mask = (ids != 0).astype(np.int32)
    return ids, types, mask


# ----------------------------------------------------------------------------- tests


def test_mlm_checkpoint_matches_official_equations(tmp_path):
    tree = official_params(seed=0)
    src = write_official(tmp_path / "BiGS_tiny", tree, official_config())
    out = import_bigs(src, tmp_path / "runs" / "bigs_tiny")

    run = open_run(out)
    assert run.kind == "pretrain" and run.info["data_dir"] is None and run.info["source"] == str(src.resolve())
    m = run.recipe.model
    assert (m.hidden_size, m.num_layers, m.intermediate_size, m.max_seq_length, m.num_ssm, m.vocab_size) == (
        H,
        LAYERS,
        I,
        L,
        N,
        V,
    )
    assert m.gelu == "tanh" and m.a_init == "hippo" and m.pooler == "non_padding_mean"
    assert run.tokenizer().get_vocab_size() == V and run.tokenizer().token_to_id("cat") == 6
    assert not list((tmp_path / "runs").glob(".*importing*"))  # the temporary directory is gone

    model, meta = run.load_model()
    assert meta["step"] == 0
    ids, types, _ = batch()
    ours = np.asarray(model(ids, token_type_ids=types))
    ref = np.stack([official_mlm_logits(tree, ids[b], types[b]) for b in range(2)])
    assert ours.shape == (2, L, V)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)
    # every official leaf landed somewhere it matters: a different checkpoint gives different logits
    assert np.abs(ref).max() > 1.0


def test_classification_checkpoint_imports_as_finetune_run(tmp_path):
    tree = official_params(seed=3, classifier_labels=3)
    cfg = official_config(
        architectures=["BiGSForSequenceClassification"],
        finetuning_task="mnli",
        id2label={"0": "entailment", "1": "neutral", "2": "contradiction"},
    )
    src = write_official(tmp_path / "BiGS_tiny_MNLI", tree, cfg)
    out = import_bigs(src, tmp_path / "mnli_run")

    run = open_run(out)
    assert run.kind == "finetune"
    assert run.info["num_labels"] == 3 and run.info["task"] == "mnli" and run.info["metrics"] == ["accuracy"]
    assert run.info["label_names"] == ["entailment", "neutral", "contradiction"]
    assert run.recipe.task.name == "mnli" and run.recipe.task.max_seq_length == L

    model, _ = run.load_model()
    ids, types, mask = batch(seed=4)
    ours = np.asarray(model(ids, mask, types))
    ref = np.stack([official_class_logits(tree, ids[b], types[b], mask[b]) for b in range(2)])
    assert ours.shape == (2, 3)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)

    # an explicit task must fit the classifier
    assert "3" in _one_line_error(import_bigs, src, tmp_path / "as_sst2", "sst2")
    # an unknown finetuning_task in config.json is only recorded
    cfg["finetuning_task"] = "hyperpartisan_news_detection"
    src2 = write_official(tmp_path / "other", tree, cfg)
    run2 = open_run(import_bigs(src2, tmp_path / "other_run"))
    assert run2.info["task"] == "hyperpartisan_news_detection" and run2.recipe.task.name is None


def test_config_mapping():
    cfg = model_config_from_official(official_config(scaling="lin", pooler_type="mean", hidden_dropout_prob=0.2))
    assert (cfg.a_init, cfg.pooler, cfg.dropout, cfg.gelu, cfg.arch) == ("lin", "mean", 0.2, "tanh", "bigs")
    # BiGSConfig defaults fill missing keys
    d = model_config_from_official({})
    assert (d.vocab_size, d.hidden_size, d.num_layers, d.max_seq_length, d.num_ssm) == (
        30522,
        768,
        24,
        512,
        64,
    )
    with pytest.raises(CheckpointError, match="pre_norm"):
        model_config_from_official(official_config(pre_norm=False))
    with pytest.raises(CheckpointError, match="scaling"):
        model_config_from_official(official_config(scaling="fancy"))


def test_read_official_flat_names(tmp_path):
    src = write_official(tmp_path / "ck", official_params(), official_config())
    config, flat = read_official(src)
    assert config["num_ssm"] == N
    assert len(flat) == 26 * LAYERS + 5 + 5  # 26 leaves per layer, 5 embedding, 5 head
    assert flat["s4_bert/encoder/layer/1/fs4/C"].shape == (N, 2)
    assert flat["cls/predictions/bias"].shape == (V,)


def _one_line_error(fn, *args) -> str:
    with pytest.raises(CheckpointError) as e:
        fn(*args)
    msg = str(e.value)
    assert "\n" not in msg and msg
    return msg


def test_unknown_leaf_is_named(tmp_path):
    tree = official_params()
    tree["s4_bert"]["encoder"]["layer"]["0"]["dv"]["weight"] = tree["s4_bert"]["encoder"]["layer"]["0"]["dv"].pop(
        "kernel"
    )
    src = write_official(tmp_path / "ck", tree, official_config())
    msg = _one_line_error(import_bigs, src, tmp_path / "out")
    assert "s4_bert/encoder/layer/0/dv/weight" in msg
    assert not (tmp_path / "out").exists()


def test_missing_leaf_is_named(tmp_path):
    tree = official_params()
    del tree["s4_bert"]["encoder"]["layer"]["1"]["bs4"]["log_step"]
    src = write_official(tmp_path / "ck", tree, official_config())
    msg = _one_line_error(import_bigs, src, tmp_path / "out")
    assert "s4_bert/encoder/layer/1/bs4/log_step" in msg and "missing" in msg


def test_wrong_shape_is_named(tmp_path):
    tree = official_params()
    src = write_official(tmp_path / "ck", tree, official_config(max_position_embeddings=2 * L))
    msg = _one_line_error(import_bigs, src, tmp_path / "out")
    assert "s4_bert/embeddings/position_embeddings/embedding" in msg and str((L, H)) in msg


def test_bad_sources(tmp_path):
    assert "no such directory" in _one_line_error(import_bigs, tmp_path / "nowhere", tmp_path / "out")
    d = tmp_path / "torch_only"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(official_config()))
    (d / "pytorch_model.bin").write_bytes(b"")
    assert "flax_model.msgpack" in _one_line_error(import_bigs, d, tmp_path / "out")
    (d / "flax_model.msgpack").write_bytes(b"not msgpack at all")
    assert "msgpack" in _one_line_error(import_bigs, d, tmp_path / "out")
    src = write_official(tmp_path / "novocab", official_params(), official_config(), vocab=False)
    assert "vocab.txt" in _one_line_error(import_bigs, src, tmp_path / "out")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "x").write_text("")
    assert "not empty" in _one_line_error(import_bigs, src, occupied)


def test_hub_source_offline_is_one_line(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    msg = _one_line_error(import_bigs, "hub:JunxiongWang/BiGS_128", tmp_path / "out")
    assert "hub:JunxiongWang/BiGS_128" in msg and "offline" in msg
    assert "hub:" in _one_line_error(read_official, "hub:not a repo name")
    assert not (tmp_path / "out").exists()


def test_cli_import_then_analyze_and_finetune_from_mnli(tmp_path):
    """`ssmlm import-bigs` as a user runs it; then the MNLI convention: a 2-label finetune from a
    3-label (MNLI-style) checkpoint keeps encoder and pooler and starts a fresh classifier."""
    write_official(tmp_path / "mlm", official_params(), official_config())
    r = invoke("import-bigs", tmp_path / "mlm", "--out", tmp_path / "runs/imported")
    assert json.loads(r.stdout)["kind"] == "pretrain"
    r = invoke("analyze", "kernels", "--ckpt", tmp_path / "runs/imported")
    r = invoke("evaluate", "--ckpt", tmp_path / "runs/imported", code=None)
    assert r.exit_code == 2 and "has no MLM data of its own" in r.output

    write_official(tmp_path / "mnli", official_params(classifier_labels=3), official_config())
    r = invoke("import-bigs", tmp_path / "mnli", "--out", tmp_path / "runs/mnli")
    from ssmlm.models import build_classifier
    from ssmlm.runs import open_run
    from ssmlm.train.transplant import transplant

    src = open_run(tmp_path / "runs/mnli")
    mnli, _ = src.load_model()
    model = build_classifier(src.recipe.model, 2, seed=5)
    report = transplant(model, nnx.state(mnli, nnx.Param))
    assert report["fresh"] == 2  # classifier kernel and bias
    np.testing.assert_array_equal(np.asarray(model.pooler.dense.kernel[...]), np.asarray(mnli.pooler.dense.kernel[...]))
