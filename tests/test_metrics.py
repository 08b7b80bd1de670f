"""GLUE metrics (ssmlm.evaluate.metrics) against independent computations: hand-written confusion-matrix
formulas, numpy correlation, and scipy.stats (sklearn is deliberately not used)."""

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from ssmlm.evaluate import metrics


def confusion(pred, gold):
    tp = sum(1 for p, g in zip(pred, gold, strict=True) if p == 1 and g == 1)
    tn = sum(1 for p, g in zip(pred, gold, strict=True) if p != 1 and g != 1)
    fp = sum(1 for p, g in zip(pred, gold, strict=True) if p == 1 and g != 1)
    fn = sum(1 for p, g in zip(pred, gold, strict=True) if p != 1 and g == 1)
    return tp, tn, fp, fn


def mcc_binary(pred, gold):
    tp, tn, fp, fn = confusion(pred, gold)
    den = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / den if den else 0.0


def mcc_multiclass(pred, gold):
    """MCC as the correlation of one-hot indicator matrices:
    Σ_k cov(X_k, Y_k) / sqrt(Σ_k var X_k · Σ_k var Y_k)."""
    classes = sorted(set(pred) | set(gold))
    x = np.array([[p == c for c in classes] for p in pred], float)
    y = np.array([[g == c for c in classes] for g in gold], float)
    x -= x.mean(0)
    y -= y.mean(0)
    den = math.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / den) if den else 0.0


@pytest.fixture(params=range(5))
def binary(request):
    rng = np.random.default_rng(request.param)
    n = int(rng.integers(20, 400))
    gold = rng.integers(0, 2, n)
    flip = rng.random(n) < rng.uniform(0.05, 0.5)
    pred = np.where(flip, 1 - gold, gold)
    return pred, gold


def test_accuracy(binary):
    pred, gold = binary
    assert metrics.accuracy(pred, gold) == pytest.approx(
        sum(p == g for p, g in zip(pred, gold, strict=True)) / len(gold)
    )
    assert metrics.accuracy(np.array([0, 1, 2, 2]), np.array([0, 1, 1, 2])) == 0.75
    assert isinstance(metrics.accuracy(pred, gold), float)


def test_f1_binary(binary):
    pred, gold = binary
    tp, tn, fp, fn = confusion(pred, gold)
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    assert metrics.f1(pred, gold) == pytest.approx(2 * precision * recall / (precision + recall), rel=1e-12)


def test_f1_hand_example_and_edge_cases():
    gold = np.array([1, 1, 1, 0, 0, 0, 0, 1])
    pred = np.array([1, 0, 1, 1, 0, 0, 0, 0])
    # tp 2, fp 1, fn 2: P = 2/3, R = 1/2, F1 = 4/7
    assert metrics.f1(pred, gold) == pytest.approx(4 / 7)
    assert metrics.f1(1 - pred, 1 - gold) == pytest.approx(2 * 3 / (2 * 3 + 2 + 1))  # positive class 0 ...
    assert metrics.f1(pred, gold, positive=0) == pytest.approx(6 / 9)  # ... same via `positive`
    assert metrics.f1(np.zeros(5, int), np.ones(5, int)) == 0.0  # no true positives
    assert metrics.f1(np.zeros(5, int), np.zeros(5, int)) == 0.0  # no positives at all
    assert metrics.f1(gold, gold) == 1.0


def test_matthews_binary(binary):
    pred, gold = binary
    assert metrics.matthews(pred, gold) == pytest.approx(mcc_binary(list(pred), list(gold)), abs=1e-12)


def test_matthews_binary_hand_example():
    gold = np.array([1, 1, 1, 0, 0, 0, 0, 1])
    pred = np.array([1, 0, 1, 1, 0, 0, 0, 0])
    # tp 2, tn 3, fp 1, fn 2: (6 - 2) / sqrt(3 · 4 · 4 · 5)
    assert metrics.matthews(pred, gold) == pytest.approx(4 / math.sqrt(240))
    assert metrics.matthews(gold, gold) == pytest.approx(1.0)
    assert metrics.matthews(1 - gold, gold) == pytest.approx(-1.0)
    assert metrics.matthews(np.ones(8, int), gold) == 0.0  # constant prediction: defined as 0
    assert metrics.matthews(np.ones(8, int), np.ones(8, int)) == 0.0


@pytest.mark.parametrize("seed", range(4))
def test_matthews_multiclass(seed):
    rng = np.random.default_rng(seed)
    n, k = 300, 3 + seed % 2
    gold = rng.integers(0, k, n)
    pred = np.where(rng.random(n) < 0.6, gold, rng.integers(0, k, n))
    want = mcc_multiclass(list(pred), list(gold))
    assert metrics.matthews(pred, gold) == pytest.approx(want, abs=1e-12)
    # a class that only appears in the predictions is handled too
    pred2 = pred.copy()
    pred2[:5] = k
    assert metrics.matthews(pred2, gold) == pytest.approx(mcc_multiclass(list(pred2), list(gold)), abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_pearson_and_spearman(seed):
    rng = np.random.default_rng(seed)
    gold = rng.uniform(0, 5, 200)
    pred = gold + rng.normal(0, 1 + seed, 200)
    assert metrics.pearson(pred, gold) == pytest.approx(np.corrcoef(pred, gold)[0, 1], abs=1e-12)
    assert metrics.pearson(pred, gold) == pytest.approx(stats.pearsonr(pred, gold)[0], abs=1e-12)
    ranks_p, ranks_g = stats.rankdata(pred), stats.rankdata(gold)
    assert metrics.spearman(pred, gold) == pytest.approx(np.corrcoef(ranks_p, ranks_g)[0, 1], abs=1e-12)
    assert metrics.spearman(pred, gold) == pytest.approx(stats.spearmanr(pred, gold)[0], abs=1e-12)


def test_spearman_with_ties_and_monotone():
    gold = np.array([1.0, 2.0, 2.0, 3.0, 4.0, 4.0, 5.0])
    pred = np.array([0.1, 0.3, 0.3, 0.2, 0.9, 0.8, 1.0])
    ranks_p = np.array([1, 3.5, 3.5, 2, 6, 5, 7])  # average ranks for ties, by hand
    ranks_g = np.array([1, 2.5, 2.5, 4, 5.5, 5.5, 7])
    assert metrics.spearman(pred, gold) == pytest.approx(np.corrcoef(ranks_p, ranks_g)[0, 1], abs=1e-12)
    x = np.linspace(0, 3, 30)
    assert metrics.spearman(np.exp(x), x) == pytest.approx(1.0)
    assert metrics.pearson(np.exp(x), x) < 0.95  # nonlinear: Pearson < 1 while Spearman = 1
    assert metrics.pearson(-2 * x + 1, x) == pytest.approx(-1.0)


def test_constant_predictions_give_zero_correlation():
    gold = np.array([1.0, 2.0, 3.0])
    assert metrics.pearson(np.full(3, 0.5), gold) == 0.0
    assert metrics.spearman(np.full(3, 0.5), gold) == 0.0


def test_score_from_logits():
    logits = np.array([[0.1, 0.9], [2.0, -1.0], [0.3, 0.4], [5.0, 1.0]])
    gold = np.array([1, 0, 0, 0])
    out = metrics.score(("accuracy", "f1", "matthews"), logits, gold)
    assert set(out) == {"accuracy", "f1", "matthews"}
    pred = [1, 0, 1, 0]
    assert out["accuracy"] == 0.75
    assert out["f1"] == pytest.approx(2 / 3)
    assert out["matthews"] == pytest.approx(mcc_binary(pred, list(gold)))
    # regression: one column, the score itself is the prediction
    reg = np.array([[0.5], [1.5], [2.0], [3.5]])
    g = np.array([0.4, 1.0, 2.5, 3.0])
    out = metrics.score(("pearson", "spearman"), reg, g)
    assert out["pearson"] == pytest.approx(np.corrcoef(reg[:, 0], g)[0, 1])
    assert out["spearman"] == pytest.approx(1.0)
    assert set(metrics.METRICS) >= {"accuracy", "f1", "matthews", "pearson", "spearman"}


# ----------------------------------------------------------------------------- degenerate inputs: 0.0, never NaN


def finite_and_quiet(fn, *args):
    """fn(*args) with every warning an error (scipy warns before it returns NaN), checked finite."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = fn(*args)
    assert isinstance(out, float) and math.isfinite(out), (fn.__name__, args, out)
    return out


@pytest.mark.parametrize("corr", [metrics.pearson, metrics.spearman])
def test_correlations_are_zero_where_undefined(corr):
    gold = np.array([1.0, 2.0, 3.0])
    assert finite_and_quiet(corr, gold, np.full(3, 2.5)) == 0.0  # constant gold
    assert finite_and_quiet(corr, np.full(3, 0.5), gold) == 0.0  # constant predictions
    # 0.1 three times has a rounding-error std of ~1e-17 > 0: still constant, not scipy's NaN
    assert np.std(np.full(3, 0.1)) > 0
    assert finite_and_quiet(corr, np.full(3, 0.1), gold) == 0.0
    assert finite_and_quiet(corr, np.full(4, 7.0), np.full(4, 7.0)) == 0.0  # both constant
    assert finite_and_quiet(corr, np.array([0.3]), np.array([2.0])) == 0.0  # one example
    assert finite_and_quiet(corr, np.array([]), np.array([])) == 0.0  # none
    assert finite_and_quiet(corr, np.array([0.1, np.nan, 0.4]), gold) == 0.0  # a diverged regression head
    assert finite_and_quiet(corr, np.array([0.1, np.inf, 0.4]), gold) == 0.0
    with pytest.raises(ValueError, match="predictions for"):  # a length mismatch is a bug, not a degenerate case
        corr(np.zeros(2), np.zeros(3))


@pytest.mark.parametrize("corr", [metrics.pearson, metrics.spearman])
def test_small_but_defined_correlations_match_scipy(corr):
    ref = {metrics.pearson: stats.pearsonr, metrics.spearman: stats.spearmanr}[corr]
    cases = [
        ([0.2, 0.9], [1.0, 4.0]),  # two examples: ±1
        ([0.9, 0.2], [1.0, 4.0]),
        ([0.1, 0.5, 0.3], [1.0, 1.0, 2.0]),  # ties in gold
        ([1.0, 1.0, 1.0 + 1e-9], [0.0, 1.0, 2.0]),  # nearly constant but not constant
    ]
    for pred, gold in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy's near-constant warning
            want = float(ref(pred, gold)[0])
        assert finite_and_quiet(corr, np.array(pred), np.array(gold)) == pytest.approx(want, abs=1e-9)


def test_sweep_of_tiny_inputs_never_nan():
    """Every metric on many tiny, tie-heavy inputs (0 to 5 examples, 1 to 3 values): finite, no warning,
    and equal to scipy's correlation wherever scipy's is defined."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(0, 6))
        k = int(rng.integers(1, 4))
        pred, gold = rng.integers(0, k, n), rng.integers(0, k, n)
        for name, fn in metrics.METRICS.items():
            got = finite_and_quiet(fn, pred, gold)
            if name in ("pearson", "spearman"):
                ref = stats.pearsonr if name == "pearson" else stats.spearmanr
                defined = n >= 2 and len(set(pred)) > 1 and len(set(gold)) > 1
                want = float(ref(pred.astype(float), gold.astype(float))[0]) if defined else 0.0
                assert got == pytest.approx(want, abs=1e-12)


def test_classification_metrics_on_degenerate_sets():
    empty = np.array([], dtype=int)
    assert finite_and_quiet(metrics.accuracy, empty, empty) == 0.0  # no examples: nothing shown right
    assert finite_and_quiet(metrics.f1, empty, empty) == 0.0
    assert finite_and_quiet(metrics.matthews, empty, empty) == 0.0
    ones, mixed = np.ones(6, int), np.array([1, 0, 1, 1, 0, 1])
    assert finite_and_quiet(metrics.matthews, mixed, ones) == 0.0  # gold of a single class
    assert finite_and_quiet(metrics.matthews, ones, mixed) == 0.0  # predictions of a single class
    assert finite_and_quiet(metrics.f1, np.zeros(6, int), np.zeros(6, int)) == 0.0  # no positives anywhere
    assert finite_and_quiet(metrics.f1, mixed, np.zeros(6, int)) == 0.0  # no gold positives
    assert finite_and_quiet(metrics.accuracy, np.array([2]), np.array([2])) == 1.0


def test_score_with_no_rows_or_constant_outputs():
    names = tuple(metrics.METRICS)
    for width in (1, 3):
        out = metrics.score(names, np.zeros((0, width)), np.zeros(0))
        assert out == dict.fromkeys(names, 0.0)
    out = metrics.score(("pearson", "spearman"), np.full((5, 1), 0.7), np.arange(5.0))  # collapsed regressor
    assert out == {"pearson": 0.0, "spearman": 0.0}
