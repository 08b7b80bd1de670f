"""benchmarks/transfer.py end to end at --quick size on a tiny generated corpus of three documents."""

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import english_lines

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "transfer.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("transfer_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_passages_and_split():
    t = load_bench()
    pars = t.paragraphs("CHAPTER I\n\n" + "\n\n".join(" ".join(english_lines(k, seed=k)) for k in range(1, 30)))
    assert pars[0] == "CHAPTER I" and "\n" not in pars[1]
    train, held = t.split_document(pars)
    assert len(held) == len(pars) - int(0.8 * len(pars)) and train + held == pars
    ps = t.passages(pars)
    assert ps and all(40 <= len(p.split()) <= 80 for p in ps)
    assert "CHAPTER" not in " ".join(ps)


def write_corpus(root: Path) -> Path:
    d = root / "corpus"
    d.mkdir()
    for i, name in enumerate(["alpha", "beta", "gamma"]):
        lines = english_lines(480, seed=i)
        paras = [" ".join(lines[j : j + 4]) for j in range(0, len(lines), 4)]
        (d / f"{name}.txt").write_text(f"{name.upper()}\n\n" + "\n\n".join(paras) + "\n")
    return d


def run_quick(t, tmp_path, *extra):
    corpus = write_corpus(tmp_path)
    out = tmp_path / "out"
    args = ["--corpus", str(corpus), "--out", str(out), "--quick", "--steps", "12", "--lrs", "1e-3",
            "--per-class-train", "16", "--per-class-validation", "8",
            "--order-train", "96", "--order-validation", "32", *extra]  # fmt: skip
    return args, out, t.main(args)


def check_cells(t, out, res, families, tasks):
    saved = json.loads((out / "transfer.json").read_text())
    assert saved["verdict"] == res["verdict"] and set(saved["verdict"]) == set(families)
    assert (out / "transfer.md").read_text().startswith("# Transfer")
    for fam in families:
        f = saved["families"][fam]
        assert f["random_init_equals_fresh_init"] and f["params"]["encoder"] > 0
        assert t.same_as_fresh_init(Path(f["runs"]["random"]))
        assert not t.same_as_fresh_init(Path(f["runs"]["pretrained"]))  # the check can fail
        for task in tasks:
            for start in t.STARTS:
                acc = saved["best"][fam][task][start]["accuracy"]
                assert acc is not None and 0.0 <= acc <= 1.0
    return saved


@pytest.mark.slow  # 40 s on 2 cores (CI time); run with -m slow
def test_quick_run_one_family(tmp_path):
    t = load_bench()
    _, out, res = run_quick(t, tmp_path, "--families", "bigs", "--tasks", "novels")
    saved = check_cells(t, out, res, ["bigs"], ["novels"])
    assert saved["tasks"]["novels"]["num_labels"] == 3
    # The pretraining text is the first 80% only: no held-out passage reaches it.
    pre = " ".join(p.read_text() for p in (out / "data" / "pretrain").glob("*.txt"))
    held = [json.loads(ln)["text"] for ln in (out / "data" / "tasks" / "novels-val.jsonl").read_text().splitlines()]
    assert held and all(h not in pre for h in held)


@pytest.mark.slow
def test_quick_run_every_family_and_task(tmp_path):
    t = load_bench()
    args, out, res = run_quick(t, tmp_path)
    check_cells(t, out, res, t.FAMILIES, t.TASKS)
    # Every run is reused on a second invocation.
    again = t.main(args)
    assert all(r["reused"] for r in again["runs"].values())
    assert again["best"] == res["best"]
