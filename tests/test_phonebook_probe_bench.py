"""benchmarks/phonebook_probe.py: the probe it runs (a constant rate after the warmup, a new book per row), its
trace in nats per digit read from the run's own validation records, and a greedy decoding at the last step."""

import json
import shutil

import pytest
from conftest import load_benchmark


@pytest.mark.slow  # two real runs in their own processes (~30 s): .ci/run runs it
def test_the_probe_traces_nats_per_digit_at_a_constant_rate_and_decodes_at_the_end(tiny_lm, tmp_path, capsys):
    b = load_benchmark("phonebook_probe")
    src = tmp_path / "src"
    shutil.copytree(tiny_lm, src)
    out = tmp_path / "probe"
    args = ["--ckpt", str(src), "--lrs", "2e-3", "--steps", "6", "--every", "3", "--warmup", "2", "--batch", "2"]
    assert b.main([*args, "--val-books", "6", "--decode-books", "3", "--seq-len", "256", "--out", str(out)]) == 0
    run = out / "probe-lr0.002"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in rows if "lr" in r and r["step"] > 2]
    assert lrs and all(abs(lr - 2e-3) < 1e-9 for lr in lrs)  # constant after the warmup: step s is an s-step probe
    val = [r for r in rows if r.get("split") == "validation"]
    assert [r["step"] for r in val] == [3, 6] and all(r["samples"] == 6 for r in val)
    recipe = (run / "recipe.yaml").read_text()
    assert "train_books: 12" in recipe  # 6 steps x 2 rows: every row a new book
    result = json.loads((out / "probe.json").read_text())["runs"][0]
    for t, r in zip(result["trace"], val, strict=True):  # the whole reply's nats over its 4 digits
        assert abs(t["nats_per_digit"] - r["loss"] * r["target_tokens"] / r["samples"] / 4) < 1e-9
    assert result["greedy"]["digit_accuracy"] is not None
    decoded = json.loads((run / "eval" / "phonebook-validation.json").read_text())
    assert decoded["split"] == "validation" and decoded["limit"] == 3 and decoded["step"] == 6
    table = capsys.readouterr().out
    assert "| 2e-3 |" in table.replace("0.002", "2e-3") and "nats per digit (chance ln 10 = 2.303)" in table
