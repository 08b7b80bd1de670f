"""The lm-eval-harness adapter on a tiny pretrained run, offline: local YAML tasks over local JSONL files (one
multiple-choice, one generate_until, one loglikelihood_rolling), and the adapter's numbers against
continuation_logprobs computed directly."""

from __future__ import annotations

import dataclasses
import importlib
import json
import socket
import sys

import numpy as np
import pytest
import yaml
from conftest import english_lines, invoke
from numerics import EPS32, assert_close_scaled

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from ssmlm.checkpoint_eval.harness import SsmlmLM, run_harness  # noqa: E402
from ssmlm.data.reserved import PARADIGMS, START  # noqa: E402
from ssmlm.errors import UserError  # noqa: E402
from ssmlm.models.decode import Sampling  # noqa: E402
from ssmlm.runs.scoring import continuation_logprobs  # noqa: E402

# Scores computed in other batches (other padding, other bucket lengths) agree to float32 rounding. A log-probability
# is a sum of same-sign terms (each log p ≤ 0), so its own magnitude is its terms' (tests/numerics.py): an absolute
# 1e-5 is ~1 ulp at |log p| = 86. Measured ≤ 1ε of the value (AVX-512, SSE4.2); 128ε is far below the ≥ 1e-2 that a
# misaligned, dropped or extra token costs.
LOGPROB_RTOL = 128 * EPS32

MC = [
    {"question": "The cat saw", "choices": ["the garden", "a red ball", "the river"], "label": 0},
    {"question": "A dog liked", "choices": ["the market", "the tall tree"], "label": 1},
    {"question": "My sister found", "choices": ["an open window", "the river", "a quiet house"], "label": 2},
    {"question": "The farmer helped", "choices": ["a red ball", "the garden"], "label": 0},
    {"question": "Our neighbour called", "choices": ["the market", "a quiet house"], "label": 1},
    {"question": "The teacher watched", "choices": ["the tall tree", "the garden", "the river"], "label": 1},
]


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt of lm-eval (or datasets) to reach a server fails the test."""

    def refuse(sock, address, *args):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"network access attempted: {address}")
        return real_connect(sock, address, *args)

    real_connect = socket.socket.connect
    monkeypatch.setattr(socket.socket, "connect", refuse)


ROLLING = [" ".join(english_lines(8, seed=s)) for s in range(2)]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny gated-SSM run (d = 32) on Birdie's fixed-ratio mixture (prompts go in the prefix), pretrained for
    2 steps through the CLI, max_seq_length 32 (so that rolling windows are exercised: conftest's tiny_lm is
    longer)."""
    tmp = tmp_path_factory.mktemp("harness-run")
    corpus = tmp / "corpus"
    corpus.mkdir()
    for i in range(20):
        (corpus / f"doc{i:02d}.txt").write_text("\n".join(english_lines(30, seed=i)) + "\n")
    recipe = {
        "base": "lm_tiny",
        "name": "tiny",
        "model": {"arch": "gated_ssm", "hidden_size": 32, "num_layers": 2, "state_size": 32, "max_seq_length": 32},
        "data": {"source": str(corpus), "vocab_size": 300},
        "objective": {"mixture": "birdie_fixed", "min_sample_space": 8},
        "train": {
            "steps": 2,
            "batch_size": 4,
            "log_every": 1,
            "eval_every": 0,
            "checkpoint_every": 0,
            "out_dir": str(tmp / "runs"),
        },
    }
    (tmp / "r.yaml").write_text(yaml.safe_dump(recipe))
    invoke("pretrain", tmp / "r.yaml", "-q")
    return tmp / "runs" / "tiny"


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    """lm-eval task YAMLs over local JSONL files (`dataset_path: json`: no hub access)."""
    d = tmp_path_factory.mktemp("tasks")

    def task(name: str, rows: list[dict], **config):
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        spec = {
            "task": name,
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(d / f"{name}.jsonl")}},
            "test_split": "test",
            **config,
            "metadata": {"version": 1.0},
        }
        (d / f"{name}.yaml").write_text(yaml.safe_dump(spec))

    acc = {"metric": "acc", "aggregation": "mean", "higher_is_better": True}
    task(
        "tiny_mc",
        MC,
        output_type="multiple_choice",
        doc_to_text="{{question}}",
        doc_to_choice="choices",
        doc_to_target="label",
        metric_list=[acc],
    )
    task(
        "tiny_gen",
        [{"question": f"{s}\nQ:", "answer": " yes"} for s in english_lines(3, seed=7)],
        output_type="generate_until",
        doc_to_text="{{question}}",
        doc_to_target="{{answer}}",
        generation_kwargs={"until": ["\n"], "max_gen_toks": 6, "do_sample": False},
        metric_list=[{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    )
    task(
        "tiny_rolling",
        [{"text": t} for t in ROLLING],
        output_type="loglikelihood_rolling",
        doc_to_text="",
        doc_to_target="{{text}}",
        metric_list=[{"metric": "word_perplexity"}, {"metric": "bits_per_byte"}],
    )
    return d


def test_run_harness_on_local_tasks(run_dir, task_dir):
    out = run_harness(run_dir, ["tiny_mc", "tiny_gen", "tiny_rolling"], include_path=task_dir, bootstrap_iters=0)
    results = out["results"]
    assert 0.0 <= results["tiny_mc"]["acc,none"] <= 1.0
    # the accuracy is the adapter's loglikelihoods' argmax (lm-eval joins context and choice with a space)
    lm = SsmlmLM.create_from_arg_string(f"ckpt={run_dir}")
    picked = [
        np.argmax(
            [
                ll
                for ll, _ in lm.loglikelihood(
                    [Instance("loglikelihood", {}, (r["question"], f" {c}"), 0) for c in r["choices"]],
                    disable_tqdm=True,
                )
            ]
        )
        for r in MC
    ]
    assert results["tiny_mc"]["acc,none"] == pytest.approx(
        np.mean([p == r["label"] for p, r in zip(picked, MC, strict=True)])
    )
    assert 0.0 <= results["tiny_gen"]["exact_match,none"] <= 1.0
    # bits per byte: −Σ log p(text) / Σ bytes / ln 2 over the documents
    ll = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), 0) for t in ROLLING], disable_tqdm=True)
    bpb = -sum(ll) / sum(len(t.encode()) for t in ROLLING) / np.log(2)
    assert results["tiny_rolling"]["bits_per_byte,none"] == pytest.approx(bpb, rel=1e-5) and bpb > 0
    assert out["n-samples"]["tiny_mc"]["effective"] == len(MC)


def test_loglikelihoods_are_continuation_logprobs(run_dir):
    # as lm-eval's command line builds it: its own --batch_size default beside the model arguments
    lm = SsmlmLM.create_from_arg_string(f"ckpt={run_dir},batch_size=3", {"batch_size": 1, "device": None})
    gen = lm.generator
    assert lm.batch_size == 3 and gen.mode == "prefix"  # a Birdie run: contexts in the bidirectional prefix
    pairs = [(r["question"], f" {c}") for r in MC[:3] for c in r["choices"]] + [("", " the river"), ("A dog ", "ran")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)], disable_tqdm=True)
    tok = gen.tokenizer
    lead, start = tok.token_to_id(PARADIGMS["prefix_lm"]), tok.token_to_id(START)
    split = [*pairs[:-1], ("A dog", " ran")]  # a context's trailing space goes to the continuation
    by_hand = [
        ([lead, *tok.encode(c, add_special_tokens=False).ids], [start], tok.encode(x, add_special_tokens=False).ids)
        for c, x in split
    ]
    want = continuation_logprobs(gen.model, by_hand, batch_size=5)
    assert_close_scaled([g[0] for g in got], [w[0] for w in want], rtol=LOGPROB_RTOL, axis=(), name="log p")
    assert [g[1] for g in got] == [w[2] for w in want]
    assert all(g[0] < 0 for g in got)
    # a causal layout (as for a clm run): the context after START, led by the next-token paradigm token
    causal = SsmlmLM(generator=dataclasses.replace(gen, mode="causal"), batch_size=3)
    got = causal.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)], disable_tqdm=True)
    lead = tok.token_to_id(PARADIGMS["next_token"])
    by_hand = [
        ([lead], [start, *tok.encode(c, add_special_tokens=False).ids], tok.encode(x, add_special_tokens=False).ids)
        for c, x in split
    ]
    want = continuation_logprobs(gen.model, by_hand, batch_size=5)
    assert_close_scaled([g[0] for g in got], [w[0] for w in want], rtol=LOGPROB_RTOL, axis=(), name="log p")


def test_rolling_windows_cover_every_token_once(run_dir):
    lm = SsmlmLM.create_from_arg_string(f"ckpt={run_dir}")
    tok = lm.generator.tokenizer
    text = " ".join(english_lines(6, seed=3))
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(ids) > 2 * lm.max_length  # several windows
    windows = lm.rolling_windows(text)
    lead, start = [tok.token_to_id(PARADIGMS["next_token"])], tok.token_to_id(START)
    assert [t for _, _, targets in windows for t in targets] == ids
    at = 0
    for prefix, causal, targets in windows:
        assert prefix == lead and causal[0] == start
        assert len(prefix) + len(causal) + len(targets) - 1 <= lm.max_length
        assert causal[1:] == ids[at - len(causal) + 1 : at]  # the text just before the window's targets
        at += len(targets)
    assert windows[0][1] == [start] and len(windows[-1][1]) > 1
    total = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True)[0]
    by_window = continuation_logprobs(lm.generator.model, windows)
    assert total == pytest.approx(sum(s[0] for s in by_window), rel=LOGPROB_RTOL)


def test_generate_until_stops_at_the_stop_string(run_dir):
    lm = SsmlmLM.create_from_arg_string(f"ckpt={run_dir}")
    free = lm.generator("The cat saw", Sampling(max_new_tokens=6))
    reqs = [Instance("generate_until", {}, ("The cat saw", {"until": [], "max_gen_toks": 6}), 0)]
    assert lm.generate_until(reqs, disable_tqdm=True) == [free]
    if len(free) > 1:  # stopping at the greedy text's second character leaves its first
        reqs = [Instance("generate_until", {}, ("The cat saw", {"until": [free[1]], "max_gen_toks": 6}), 0)]
        assert lm.generate_until(reqs, disable_tqdm=True) == [free[: free.index(free[1])]]


def test_user_errors(run_dir, task_dir):
    with pytest.raises(UserError, match="ckpt=RUN_DIR"):
        SsmlmLM.create_from_arg_string("")
    with pytest.raises(UserError, match="no such folder of lm-eval task YAML files"):
        run_harness(run_dir, ["tiny_mc"], include_path=task_dir / "nope")
    # (an unknown task name is a UserError too, but finding that out indexes every built-in task: seconds)


def test_missing_lm_eval_is_a_one_line_user_error(monkeypatch):
    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "ssmlm.checkpoint_eval.harness")
    with pytest.raises(UserError, match=r"pip install 'ssmlm\[harness\]'") as e:
        importlib.import_module("ssmlm.checkpoint_eval.harness")
    assert "\n" not in str(e.value)


@pytest.mark.slow  # finding out means indexing every built-in lm-eval task
def test_unknown_task_is_a_user_error(run_dir, task_dir):
    with pytest.raises(UserError, match="'no_such_task': not found among lm-eval's tasks or"):
        run_harness(run_dir, ["tiny_mc", "no_such_task"], include_path=task_dir)
