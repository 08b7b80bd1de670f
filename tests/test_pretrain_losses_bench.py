"""benchmarks/pretrain_losses.py on a real (tiny) pretraining run laid out as an experiment's."""

import json
from pathlib import Path

import pytest
import yaml
from conftest import corpus_dir, invoke, load_benchmark


def test_losses_and_passes_at_the_logged_steps(tmp_path, capsys, monkeypatch):
    out = tmp_path / "exp"
    recipe = {
        "base": "lm_tiny",
        "name": "pretrain",
        "model": {"hidden_size": 32, "num_layers": 1, "state_size": 16, "num_heads": 2, "max_seq_length": 64},
        "data": {"source": str(corpus_dir(tmp_path / "corpus", 12, 20)), "vocab_size": 300,
                 "validation_fraction": 0.25},
        "train": {"steps": 4, "batch_size": 2, "log_every": 1, "eval_every": 2, "eval_batches": 1,
                  "checkpoint_every": 0, "out_dir": str(out / "runs/clm/seed0")},
    }  # fmt: skip
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    invoke("pretrain", tmp_path / "r.yaml", "-q")
    run = out / "runs/clm/seed0/pretrain"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    val4 = next(r["lm_loss"] for r in rows if r.get("split") == "validation" and r["step"] == 4)
    train4 = [r["loss"] for r in rows if "split" not in r and "loss" in r]
    assert len(train4) == 4
    meta = json.loads((Path(json.loads((run / "run.json").read_text())["data_dir"]) / "metadata.json").read_text())
    b = load_benchmark("pretrain_losses")
    assert b.passes(run, 4) == pytest.approx(4 * 2 * 64 / meta["splits"]["train"]["tokens"])
    # the training loss is the mean over the last quarter of the steps, at most 100: here step 4 alone
    assert [b.window(s) for s in (4, 100, 400, 1600)] == [1, 25, 100, 100]
    assert b.losses(run, 4) == (pytest.approx(train4[-1]), val4)
    monkeypatch.setattr(b, "window", lambda step: 4)
    assert b.losses(run, 4) == (pytest.approx(sum(train4) / 4), val4)
    monkeypatch.undo()
    assert b.losses(run, 3)[1] is None  # no validation logged at step 3
    assert b.main([str(out), "--steps", "2,3,4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| clm | 1 | 2 |") and lines[3].startswith("| clm | 1 | 4 |")
    assert lines[3].endswith(f"| {val4 - train4[-1]:+.3f} |")
    assert b.main([str(out), "--steps", "two"]) == 2
    with pytest.raises(SystemExit, match="no pretraining runs"):
        b.main([str(tmp_path / "empty")])
