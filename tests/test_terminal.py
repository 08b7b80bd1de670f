"""What a person reads at 80 columns (ssmlm.display.terminal): counts as integers, table titles broken between
words only, and an analysis's result as tables (`ssmlm analyze NAME`), with --json for the raw form."""

import io
import json
import re
from pathlib import Path

from conftest import invoke
from rich.console import Console

from ssmlm.display.terminal import fit_title, metric_text, result_tables, titled


def printed(*renderables, width: int = 80) -> list[str]:
    con = Console(width=width, record=True, file=io.StringIO())
    for r in renderables:
        con.print(r)
    return con.export_text().splitlines()


def test_counts_print_as_integers_and_other_numbers_to_four_decimals():
    assert metric_text("masked_tokens", 2275.0) == "2,275"
    assert metric_text("examples", 872) == "872"
    assert metric_text("num_pairs", 3.0) == "3"
    assert metric_text("masked_tokens", 2275.4) == "2,275.4"  # a window's mean of counts
    assert metric_text("loss", 2.0) == "2.0000" and metric_text("accuracy", 0.8125) == "0.8125"
    assert metric_text("analytic_train_flops", 832400000.0) == "8.324e+08"
    assert metric_text("lr", 1.5e-05) == "1.5e-05"
    assert metric_text("table5_accuracy", None) == "–" and metric_text("note", "text") == "text"
    assert metric_text("tokens", float("nan")) == "nan"


def test_titles_break_between_words_at_80_columns():
    con = Console(width=80, file=io.StringIO())
    for run in ("runs/default-builtin-order", "/tmp/experiments/runs/bigs-512-mnli-random-init-seed3"):
        title = f"pretrain → {run}"
        t = titled(title, con, show_header=False)
        t.add_row("steps", "0 → 30")
        lines = printed(t)
        assert lines[0].strip() == title, lines  # one line: the table is widened to hold it
    # longer than a line: it breaks at spaces; a path longer than the line keeps its end after "…"
    path = "/home/someone/" + "x" * 60 + "/runs/bigs-512-mnli-seed3"
    t = titled(f"sst2 / validation — {path} (step 1200)", con)
    t.add_column("metric")
    t.add_row("accuracy")
    lines = printed(t)
    assert all(len(line) <= 80 for line in lines), lines
    title = [line.strip() for line in lines[: lines.index(next(ln for ln in lines if ln.startswith("┏")))]]
    assert title == ["sst2 / validation —", "…" + path[-79:], "(step 1200)"], title
    assert fit_title("a " + "b" * 10, 5).plain == "a …bbbb"


def test_a_nested_result_reads_as_tables():
    result = {
        "plot": "runs/default/analysis/agreement_table5.png",
        "headline": {"items": 64, "skipped": 44.0, "table5_accuracy": 50.0, "attractors=1": None},
        "layers": [0, 1, 2],
        "table": [{"model": "BiGS", "length": 128, "paper_flops": 8.1e10}, {"model": "BERT", "length": 512}],
    }
    main, rows = result_tables(result, "agreement: BiGS Table 5 and Figure 8")
    text = "\n".join(printed(main, rows))
    assert "│ headline.items " in text and re.search(r"headline\.skipped +│ 44 ", text), text
    assert re.search(r"headline\.attractors=1 +│ – ", text) and "│ 0, 1, 2 " in text, text
    assert "paper flops" in text and "8.1e+10" in text and "BERT" in text, text
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "{" not in text  # no raw JSON


def test_analyze_prints_tables_and_json_on_request(tmp_path, monkeypatch):
    """`ssmlm analyze flops` (no run needed with --no-xla): tables at 80 columns by default, the result's JSON with
    --json."""

    monkeypatch.setenv("COLUMNS", "80")
    args = ["analyze", "flops", "--lengths", "128,512", "--no-xla", "--out", str(tmp_path)]
    shown = invoke(*args)
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("flops: BiGS Table 6"), lines[:3]
    assert all(len(line) <= 80 for line in lines), lines
    assert "forward over" in shown.stdout and "e+" in shown.stdout and not shown.stdout.lstrip().startswith("{")
    raw = invoke(*args, "--json")
    result = json.loads(raw.stdout)
    assert result["data"] == str(tmp_path / "flops.csv") and Path(result["plot"]).is_file()
    assert {r["length"] for r in result["table"]} == {128, 512}


def test_run_summary_at_80_columns(monkeypatch, capsys):
    """The table after training: its title (the run's path) on one line, counts as integers."""
    from ssmlm.display.printouts import print_summary

    monkeypatch.setenv("COLUMNS", "80")
    summary = {
        "kind": "pretrain",
        "start_step": 0,
        "final_step": 30,
        "seconds": 41.2,
        "train": {"loss": 6.34091, "masked_tokens": 2275.0},
        "validation": {"loss": 6.1, "examples": 96.0},
    }
    print_summary(summary, Path("runs/default-builtin-order"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].strip() == "pretrain → runs/default-builtin-order", lines
    text = "\n".join(lines)
    assert re.search(r"train masked_tokens +│ 2,275 ", text) and re.search(r"validation examples +│ 96 ", text), text
    assert "6.3409" in text and "2275.0000" not in text


def test_help_paragraphs_flow_instead_of_breaking_where_the_source_wrapped():
    """typer keeps a docstring's line breaks; --help shows each paragraph as one flowing text (80 columns would
    otherwise break it mid-sentence where the source wrapped at 120), and each 'Example:' on its own line."""
    from ssmlm.cli import flowing

    doc = """First line of a paragraph
    that goes on.

    Example: ssmlm a
    Example: ssmlm b
    """
    assert flowing(doc) == "First line of a paragraph that goes on.\n\nExample: ssmlm a\nExample: ssmlm b"
    for command in (["experiment"], ["finetune"], ["analyze", "report"]):
        out = invoke(*command, "--help", env={"COLUMNS": "80"}).output
        lines = [ln.rstrip() for ln in out.split("Options")[0].splitlines()]
        # a short line continued by a lowercase one: a sentence broken where the source wrapped
        broken = [(a, b) for a, b in zip(lines, lines[1:], strict=False) if 0 < len(a) < 60 and b[1:2].islower()]
        assert not broken, (command, broken)
