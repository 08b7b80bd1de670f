"""benchmarks/refusals.py: real refusals timed against a bare interpreter, and what it checks of each side."""

import sys

import pytest
from conftest import load_benchmark


def test_one_round_of_every_side(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["refusals.py", "--rounds", "1", "--passes", "1"])
    load_benchmark("refusals").main()
    out = capsys.readouterr().out
    for side in ("python", "help", "recipe error", "usage error"):
        assert any(line.startswith(side) for line in out.splitlines()), out


def test_a_side_that_does_not_refuse_stops_the_benchmark(tmp_path):
    bench = load_benchmark("refusals")
    step = bench.process("-c", "pass", code=2, cwd=tmp_path)  # exits 0, not the refusal's 2
    with pytest.raises(SystemExit, match="exit 0, expected 2"):
        step()
