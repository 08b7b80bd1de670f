"""Birdie objectives, grid, packing and row pipeline (docs/faithfulness.md#birdie-objectives, #birdie-layout)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from ssmlm.data import reserved as R
from ssmlm.objectives.birdie import functions as F
from ssmlm.objectives.birdie.mixtures import MIXTURES, Config, birdie_grid, initial_action, mixture
from ssmlm.objectives.birdie.packing import pack
from ssmlm.objectives.birdie.pipeline import make_batch_rows, make_row

IDS = F.Ids.for_tests(1000)
SENT = set(IDS.sentinels.tolist())
C = IDS.copy


def text(n, start=1):
    return np.arange(start, start + n, dtype=np.int32)


def rng(seed=0):
    return np.random.default_rng(seed)


# ----------------------------------------------------------------------------- objectives


def test_ids_from_reserved():
    ids = F.Ids.from_reserved({t: 500 + i for i, t in enumerate(R.RESERVED)})
    assert ids.start == 500 and ids.sentinels[0] == 501 and len(ids.sentinels) == 100
    assert set(ids.paradigms) == set(R.CLASSES) and set(ids.copy) == set(R.COPY_MARKERS)


def test_next_token():
    s = F.next_token(text(10), 6, rng(), IDS)
    assert len(s.prefix) == 0 and s.target.tolist() == [1, 2, 3, 4, 5, 6] and s.used == 6
    assert F.next_token(text(1), 6, rng(), IDS) is None


def test_prefix_lm_split_bounds():
    for seed in range(200):
        n = 8 + seed % 40
        s = F.prefix_lm(text(n), 1000, rng(seed), IDS)
        assert len(s.prefix) >= 4 and len(s.target) >= 4
        assert len(s.prefix) >= min(n // 2, n - 4)
        assert np.concatenate([s.prefix, s.target]).tolist() == text(n).tolist()
    assert F.prefix_lm(text(7), 100, rng(), IDS) is None


def _infill_parts(s):
    """Rebuild the original from an infilling sample: each sentinel in the prefix is its target span."""
    spans, cur = [], []
    for t in s.target.tolist():
        if t in SENT:
            spans.append((cur, t))
            cur = []
        else:
            cur.append(t)
    out, j = [], 0
    for t in s.prefix.tolist():
        if t in SENT:
            assert spans[j][1] == t  # the sentinel in the prefix is the one that closes its span
            out += spans[j][0]
            j += 1
        else:
            out.append(t)
    assert j == len(spans) > 0
    return out, spans


def test_infilling_target_is_span_then_sentinel():
    src = text(200)
    for seed in range(20):
        s = F.infilling(src, 1000, rng(seed), IDS, rate=0.15, mean=3.0)
        original, spans = _infill_parts(s)
        assert original == src[: s.used].tolist()
        assert all(len(sp) >= 1 for sp, _ in spans)
        assert s.target[-1] in SENT


def test_infilling_hand_example():
    # rate 1, spans of exactly 2 (μ=2.5, std 1 can vary: check structure only on a tiny source)
    s = F.infilling(text(6), 100, rng(3), IDS, rate=1.0, mean=2.0)
    original, _ = _infill_parts(s)
    assert original == [1, 2, 3, 4, 5, 6][: s.used]


@pytest.mark.parametrize("rate", [0.15, 0.5])
def test_infilling_masked_fraction(rate):
    """The masked fraction of the taken text is ≈ c/(1 + 4c/3) (each span start also blocks ⌊ℓ/3⌋ + 1
    positions); masked : unmasked is ≈ c/(1 + c/3), the figure sometimes quoted (0.143 / 0.429)."""
    g, src = rng(1), text(1024)
    masked = total = 0
    for _ in range(150):
        s = F.infilling(src, 10**6, g, IDS, rate=rate, mean=8.0)
        m = len(s.target) - int(np.isin(s.target, IDS.sentinels).sum())
        masked, total = masked + m, total + s.used
    assert abs(masked / total - rate / (1 + 4 * rate / 3)) < 0.03
    assert abs(masked / (total - masked) - rate / (1 + rate / 3)) < 0.03


def test_small_space_leaves_leftover():
    for kind, params in [("infilling", {"rate": 0.5, "mean": 3.0}), ("autoencoding", {"rate": 0.5, "mean": 3.0})]:
        s = F.sample(kind, kind, text(100), 12, rng(4), IDS, **params)
        assert s.size <= 12 and s.used < 100


def test_infilling_rejects_short_sources():
    assert F.infilling(text(50), 1000, rng(), IDS, rate=0.15, mean=8.0, min_len=53) is None
    assert F.infilling(text(60), 1000, rng(), IDS, rate=0.15, mean=8.0, min_len=53) is not None


def test_autoencoding_target_is_original():
    src = text(300)
    for seed in range(20):
        s = F.autoencoding(src, 1000, rng(seed), IDS, rate=0.5, mean=3.0)
        assert s.target.tolist() == src[: s.used].tolist()
        nsent = int(np.isin(s.prefix, IDS.sentinels).sum())
        assert nsent >= 1
        kept = [t for t in s.prefix.tolist() if t not in SENT]
        assert kept == sorted(kept) and set(kept) < set(s.target.tolist())
        # each span drops ℓ + 1 tokens (the last may not if it reaches the end)
        assert len(kept) + nsent * 2 <= s.used + 1


def _runs(prefix):
    runs, cur = [], []
    for t in prefix.tolist():
        cur.append(t)
        if t in SENT:
            runs.append(tuple(cur))
            cur = []
    if cur:
        runs.append(tuple(cur))
    return runs


def test_autoencoding_deshuffle_permutes_runs():
    src = text(400)
    moved = 0
    for seed in range(20):
        plain = F.autoencoding(src, 1000, rng(seed), IDS, rate=0.5, mean=3.0)
        shuf = F.autoencoding(src, 1000, rng(seed), IDS, rate=0.5, mean=3.0, shuffle=True)
        assert shuf.target.tolist() == plain.target.tolist()  # same walk, same target
        assert sorted(shuf.prefix.tolist()) == sorted(plain.prefix.tolist())
        hay = "," + ",".join(map(str, shuf.prefix.tolist())) + ","
        for run in _runs(plain.prefix):  # every run of the unshuffled input stays whole (runs are permuted)
            assert "," + ",".join(map(str, run)) + "," in hay
        moved += shuf.prefix.tolist() != plain.prefix.tolist()
    assert moved >= 15


def _walk_one_token_at_a_time(src, space, g, rate, mean, autoencode, shuffle=False, min_len=0, max_len=None):
    """The v1 span-corruption walk written plainly, one position per step (the spec that functions.py's
    vectorised walk reproduces draw for draw): per pass, n span lengths, n uniforms and n sentinel indices
    drawn up front; at position t (draw i) a span starts if t is past the gap and u_i·ℓ_i < c, else token t
    is kept; stop at the end of the text or before the cost would exceed ``space``; up to 100 passes."""
    n = min(len(src), max_len or len(src), space)
    if n < max(min_len, 1) or space < 3:
        return None
    for _ in range(100):
        lengths = np.maximum(1, np.floor(g.normal(mean, 1.0, n))).astype(np.int64)
        draws, sent = g.random(n), g.integers(0, len(IDS.sentinels), n)
        runs, cur, target = [], [], []
        cost, t, gap_end, i = 0, 0, -1, 0
        while t < n:
            ell = int(lengths[i])
            corrupt = t > gap_end and draws[i] * ell < rate
            i += 1
            if corrupt:
                ell = min(ell, n - t)
                drop = 1 if autoencode and t + ell < n else 0
                extra = 1 + ell + drop if autoencode else ell + 2
                if cost + extra > space:
                    break
                s = int(IDS.sentinels[sent[i - 1]])
                runs.append([*cur, s])
                cur = []
                target += [*src[t : t + ell].tolist(), s]
                cost += extra
                gap_end = (t + ell - 1) + ell // 3 + 1
                t += ell + drop
            else:
                step = 2 if autoencode else 1
                if cost + step > space:
                    break
                cur.append(int(src[t]))
                cost += step
                t += 1
        if runs:
            break
    else:
        return None
    runs = [*runs, cur] if cur else runs
    if shuffle:
        runs = [runs[j] for j in g.permutation(len(runs))]
    prefix = [tok for r in runs for tok in r]
    return prefix, (src[:t].tolist() if autoencode else target), t


def test_span_walk_equals_the_one_token_at_a_time_walk():
    """Same rng, same sample: the vectorised walk against the plain one, over sizes, budgets and rates (short
    and long sources, budgets that cut the text or a span, spans reaching the text's end)."""
    g = rng(11)
    for case in range(400):
        autoencode = case % 2 == 1
        n, space = int(g.integers(0, 700)), int(g.integers(0, 700))
        params = {"rate": float(g.choice([0.05, 0.15, 0.5, 1.0])), "mean": float(g.choice([1.0, 3.0, 8.0, 32.0]))}
        if autoencode:
            params["shuffle"] = bool(g.random() < 0.5)
        if g.random() < 0.2:
            params["max_len"] = int(g.integers(1, 400))
        src, seed = text(n, start=7), int(g.integers(1 << 30))
        fn = F.autoencoding if autoencode else F.infilling
        got = fn(src, space, rng(seed), IDS, **params)
        want = _walk_one_token_at_a_time(src, space, rng(seed), autoencode=autoencode, **params)
        assert (got is None) == (want is None), (case, n, space, params)
        if got is not None:
            assert (got.prefix.tolist(), got.target.tolist(), got.used) == want, (case, n, space, params)
            assert got.prefix.dtype == got.target.dtype == np.int32


@pytest.mark.parametrize("p", [0.5, 1.0])
def test_deshuffling_keeps_multiset(p):
    s = F.deshuffling(text(100), 1000, rng(2), IDS, p=p)
    assert s.target.tolist() == text(100).tolist()
    assert sorted(s.prefix.tolist()) == s.target.tolist()
    moved = int((s.prefix != s.target).sum())
    assert 0 < moved <= int(p * 100)
    if p == 0.5:
        assert (s.prefix == s.target).sum() >= 50


def test_copying():
    s = F.copying(text(100), 60, rng(), IDS)
    assert s.prefix.tolist() == s.target.tolist() == text(30).tolist() and s.used == 30


@pytest.mark.parametrize("form", ["query_context", "context_query"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_selective_copying_format(form, k):
    src = text(400, start=1)
    s = F.selective_copying(src, 2048, rng(k), IDS, k=k, form=form)
    p = s.prefix.tolist()
    ci = p.index(C["context"])
    if form == "query_context":
        assert p[0] == C["copy"] and p[ci + 1 :] == src[: s.used].tolist()
        query = p[1:ci]
    else:
        assert p[0] == C["context"] and p.index(C["copy"]) == 1 + s.used
        query = p[p.index(C["copy"]) + 1 :]
        assert p[1 : 1 + s.used] == src[: s.used].tolist()
    # target: span_1 SEP … span_K DONE
    tgt = s.target.tolist()
    assert tgt[-1] == C["done"] and tgt.count(C["sep"]) == k - 1
    spans, cur = [], []
    for t in tgt:
        if t in (C["sep"], C["done"]):
            spans.append(cur)
            cur = []
        else:
            cur.append(t)
    assert len(spans) == k and all(8 <= len(x) <= 16 for x in spans)
    # query: per span [START] sd [END] ed with sd the tokens just before the span, ed just after
    assert query.count(C["span_start"]) == k and query.count(C["span_end"]) == k
    blocks = [b for b in _split(query, C["span_start"]) if b]
    covered = []
    for block, span in zip(blocks, spans, strict=True):
        e = block.index(C["span_end"])
        sd, ed = block[:e], block[e + 1 :]
        assert 1 <= len(sd) <= 8 and 1 <= len(ed) <= 4
        a = span[0] - 1  # text(…) starting at 1: token value v sits at index v-1
        assert sd == src[a - len(sd) : a].tolist() and span == src[a : a + len(span)].tolist()
        assert ed == src[a + len(span) : a + len(span) + len(ed)].tolist()
        covered.append((a - len(sd), a + len(span) + len(ed)))
    covered.sort()
    assert all(x[1] <= y[0] for x, y in zip(covered, covered[1:], strict=False))  # non-overlapping


def _split(seq, marker):
    out, cur = [], []
    for t in seq:
        if t == marker:
            out.append(cur)
            cur = []
        else:
            cur.append(t)
    out.append(cur)
    return out


CASES = [
    ("next_token", {}),
    ("prefix_lm", {}),
    ("infilling", {"rate": 0.15, "mean": 3.0}),
    ("infilling", {"rate": 0.5, "mean": 32.0}),
    ("autoencoding", {"rate": 0.5, "mean": 8.0}),
    ("autoencoding", {"rate": 0.05, "mean": 3.0, "shuffle": True}),
    ("deshuffling", {"p": 0.5}),
    ("copying", {}),
    ("selective_copying", {"k": 4, "form": "context_query"}),
]


@pytest.mark.parametrize("kind,params", CASES)
def test_never_exceeds_space(kind, params):
    g = rng(7)
    ok = 0
    for _ in range(150):
        n, space = int(g.integers(0, 700)), int(g.integers(0, 600))
        paradigm = ["start", "end_half", "none"][int(g.integers(3))]
        s = F.sample(kind, "infilling", text(n), space, g, IDS, paradigm, **params)
        if s is None:
            continue
        ok += 1
        assert s.size <= space and len(s.target) >= 1 and 0 < s.used <= n
    assert ok > 20


def test_paradigm_placement():
    s = F.sample("copying", "copying", text(20), 100, rng(), IDS, "start")
    assert s.prefix[0] == IDS.paradigms["copying"] and s.size <= 100
    ends = [F.sample("copying", "copying", text(20), 100, rng(i), IDS, "end_half").prefix[-1] for i in range(40)]
    share = np.mean(np.array(ends) == IDS.paradigms["copying"])
    assert 0.25 < share < 0.75
    assert IDS.paradigms["copying"] not in F.sample("copying", "copying", text(20), 100, rng(), IDS, "none").prefix


# ----------------------------------------------------------------------------- grid and mixtures


def test_grid_counts():
    grid = birdie_grid()
    assert len(grid) == 104
    counts = collections.Counter(c.cls for c in grid)
    assert counts == {
        "infilling": 26,
        "autoencoding": 54,
        "copying": 2,
        "deshuffling": 4,
        "next_token": 1,
        "prefix_lm": 1,
        "selective_copying": 16,
    }
    assert not any(c.params == {"rate": 0.05, "mean": 32.0, "min_len": 320, "max_len": 256} for c in grid)
    assert sum(c.params.get("shuffle", False) for c in grid) == 27
    assert sorted(c.params["p"] for c in grid if c.cls == "deshuffling") == [0.5, 0.5, 1.0, 1.0]
    a = initial_action(grid)
    assert np.isclose(a.sum(), 1)
    for cls, n in counts.items():
        assert np.allclose(a[[c.cls == cls for c in grid]], 1 / (7 * n))


def test_named_mixtures():
    for name in MIXTURES:
        configs, p = mixture(name)
        assert len(configs) == len(p) and np.isclose(p.sum(), 1) and (p > 0).all()
    configs, p = mixture("ul2")
    assert np.allclose(p, [0.2, 0.2, 0.1, 0.1, 0.1, 0.1, 0.2]) and configs[-1].kind == "prefix_lm"
    assert np.allclose(mixture("ul2_decoder")[1], [0.6, 0.2, 0.1, 0.1])
    # birdie starts uniform over configurations (paper A.1.4); birdie_fixed is v1's class-balanced action
    grid, start = mixture("birdie")
    assert np.allclose(start, 1 / 104)
    auto = np.array([c.cls == "autoencoding" for c in grid])
    assert start[auto].sum() == pytest.approx(54 / 104)
    fixed = mixture("birdie_fixed")[1]
    assert np.allclose(fixed, initial_action(grid)) and fixed[auto].sum() == pytest.approx(1 / 7)


# ----------------------------------------------------------------------------- packing


def test_pack_paper_example():
    row = pack([([4, 5, 6], [7, 8, 9])], 8, start=1)
    assert row["tokens"].tolist() == [4, 5, 6, 1, 7, 8, 0, 0]
    assert row["targets"].tolist()[3:6] == [7, 8, 9]
    assert row["loss_weights"].tolist() == [0, 0, 0, 1, 1, 1, 0, 0]
    assert row["token_types"].tolist() == [1, 1, 1, 3, 3, 3, 0, 0]
    assert row["segment_ids"].tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert row["positions"].tolist() == [0, 1, 2, 3, 4, 5, 0, 0]


def test_pack_two_samples_v2_example():
    # v2 test_packer ([1,2,3]->[4,5,6], [7,8]->[9,10] into 16 slots), in the START layout (START = 99)
    row = pack([([1, 2, 3], [4, 5, 6]), ([7, 8], [9, 10])], 16, start=99)
    assert row["tokens"].tolist() == [1, 2, 3, 99, 4, 5, 7, 8, 99, 9] + [0] * 6
    w = row["loss_weights"].astype(bool)
    assert row["targets"][w].tolist() == [4, 5, 6, 9, 10]
    assert np.flatnonzero(w).tolist() == [3, 4, 5, 8, 9]
    assert row["segment_ids"].tolist() == [1] * 6 + [2] * 4 + [0] * 6
    assert row["token_types"].tolist() == [1, 1, 1, 3, 3, 3, 1, 1, 3, 3] + [0] * 6
    assert row["positions"].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3] + [0] * 6
    with pytest.raises(ValueError):
        pack([([1, 2, 3], [4, 5, 6]), ([7, 8], [9, 10])], 9, start=99)


def test_pack_spacing_and_empty_prefix():
    row = pack([([], [5, 6]), ([7], [8])], 10, start=1, spacing=3)
    assert row["tokens"].tolist() == [1, 5, 0, 0, 0, 7, 1, 0, 0, 0]
    assert row["segment_ids"].tolist() == [1, 1, 0, 0, 0, 2, 2, 0, 0, 0]
    assert row["token_types"].tolist() == [3, 3, 0, 0, 0, 1, 3, 0, 0, 0]
    assert row["loss_weights"].tolist() == [1, 1, 0, 0, 0, 0, 1, 0, 0, 0]


# ----------------------------------------------------------------------------- pipeline


def _docs(n=60, seed=0):
    g = rng(seed)
    return [g.integers(1, 900, int(g.integers(20, 1500))).astype(np.int32) for _ in range(n)]


def test_make_row_deterministic_and_consistent():
    docs = _docs()
    configs, probs = mixture("birdie")
    a = make_row(docs, configs, probs, 1024, 123, IDS)
    b = make_row(docs, configs, probs, 1024, 123, IDS)
    c = make_row(docs, configs, probs, 1024, 124, IDS)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["tokens"], c["tokens"])
    seg = a["segment_ids"]
    assert seg.max() == len(a["sample_configs"]) and (a["config"][seg > 0] >= 0).all()
    assert (a["loss_weights"][a["token_types"] != 3] == 0).all()
    assert (a["tokens"][a["token_types"] == 0] == 0).all()
    assert (seg > 0).sum() > 1024 - 32  # filled to within min_space


def test_make_row_spacing_and_leftover():
    docs = [text(5000)]
    configs = [Config("next_token", "next_token", {"max_len": 50})]
    row = make_row(docs, configs, [1.0], 256, 5, IDS, paradigm="none", spacing=3, max_failures=1)
    seg = row["segment_ids"]
    assert seg.max() == 5 and (seg[50:53] == 0).all() and seg[53] == 2  # 4 x (50 + 3) + 44: 5th is 44 long
    # one document, so the leftover carries on: every sample continues where the previous stopped
    targets = row["targets"][row["loss_weights"] > 0]
    assert len(targets) == 244 and (np.diff(targets) == 1).all()


def test_mixture_fractions():
    docs = _docs(40, 1)
    configs = [
        Config("next_token", "next_token", {"max_len": 64}),
        Config("copying", "copying", {"max_len": 64}),
        Config("infilling", "infilling", {"rate": 0.15, "mean": 3.0, "max_len": 64}),
    ]
    probs = np.array([0.6, 0.3, 0.1])
    rows = make_batch_rows(docs, configs, probs, 512, range(60), IDS)
    counts = np.bincount(np.concatenate(rows["sample_configs"]), minlength=3)
    assert counts.sum() > 300
    assert np.allclose(counts / counts.sum(), probs, atol=0.05)
    assert rows["tokens"].shape == (60, 512)


# ----------------------------------------------------------------------------- LMObjective


def test_lm_objective_batches_and_loss():
    import jax

    from ssmlm.objectives.lm import LMObjective

    reserved = {t: 1000 + i for i, t in enumerate(R.RESERVED)}
    docs = _docs(30, 2)
    obj = LMObjective(None, reserved, docs, _docs(10, 3), 256, seed=3, mixture="ul2_decoder", batch_size=2)
    b = obj.train_batch(0)
    assert b.tokens.shape == b.targets.shape == b.loss_weights.shape == (2, 256) and b.target_positions is None
    assert np.array_equal(b.tokens, obj.train_batch(0).tokens)
    assert not np.array_equal(b.tokens, obj.train_batch(1).tokens)
    only_ntp = obj.train_rows(0, state=[1.0, 0, 0, 0])
    assert (np.concatenate(only_ntp["sample_configs"]) == 0).all()
    ev = obj.eval_batches(2)
    assert len(ev) == 2 and np.array_equal(ev[0].tokens, obj.eval_batches(1)[0].tokens)

    vocab = 1200

    def model(tokens, segment_ids=None, token_types=None, positions=None, rng=None):
        return jax.nn.one_hot(tokens, vocab) * 0.0  # uniform logits

    loss, aux = obj.loss(model, b, jax.random.PRNGKey(0))
    assert np.isclose(float(loss), np.log(vocab), atol=1e-4)
    assert float(aux["weight"]) == b.loss_weights.sum()
    out = obj.eval(model, b)
    scores = obj.score([out], [b])
    assert np.isclose(scores["lm_loss"], np.log(vocab), atol=1e-4) and scores["target_tokens"] > 0
    assert set(scores) == {"lm_loss", "lm_accuracy", "perplexity", "target_tokens"}


@pytest.mark.parametrize("paradigm,spacing", [("start", 0), ("end_half", 3), ("none", 1)])
def test_rows_are_consistent(paradigm, spacing):
    docs = _docs(50, 4)
    configs, probs = mixture("birdie")
    rows = make_batch_rows(docs, configs, probs, 768, range(30), IDS, paradigm, spacing)
    for k in range(30):
        tok, tgt, w, seg, typ = (
            rows[f][k] for f in ("tokens", "targets", "loss_weights", "segment_ids", "token_types")
        )
        for s in range(1, seg.max() + 1):
            idx = np.flatnonzero(seg == s)
            assert (np.diff(idx) == 1).all()
            t = typ[idx]
            first3 = int(np.argmax(t == 3))
            assert (t[:first3] == 1).all() and (t[first3:] == 3).all() and tok[idx[first3]] == IDS.start
            # the target at each causal slot is the next slot's token (teacher forcing)
            assert (tgt[idx[first3:-1]] == tok[idx[first3 + 1 :]]).all() and (w[idx[first3:]] == 1).all()
            if paradigm == "start":
                assert tok[idx[0]] in IDS.paradigms.values()
            if spacing and s > 1:
                assert (seg[idx[0] - spacing : idx[0]] == 0).all()
