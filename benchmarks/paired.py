"""Paired, interleaved timing: the one way ssmlm's benchmarks compare two implementations on a shared machine.

A figure taken for one side and then the other mixes the difference between the sides with whatever else the
machine did meanwhile. Here every side runs one step in turn (the order rotates each round), so neighbouring
steps of the two sides see the same load, and each round gives one paired ratio per side against the
reference. Reported per side: the median step time, the median of the per-round ratios reference / side (above
1: the side is faster) and their range (min–max over rounds), for each of two passes; a ratio whose two passes
disagree was measured under changing load and says so by its range.

    from paired import compare
    rows = compare({"ssmlm": step_a, "peer": step_b}, reference="peer", rounds=7, warmup=2)

A step is a zero-argument callable that runs one unit of work and blocks until it is done
(``jax.block_until_ready``). ``compare_fresh`` does the same for work that must start afresh each time
(compiling). Used by benchmarks/{throughput,lm_throughput,objectives,compile,scan_impl}.py.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path


def compare(steps: dict[str, Callable[[], object]], reference: str, *, rounds: int = 7, warmup: int = 2,
            passes: int = 2, units: dict[str, float] | None = None) -> dict[str, dict]:  # fmt: skip
    """Time every step ``rounds`` times per pass, interleaved, after ``warmup`` untimed runs each.

    Returns {name: {"median_s": [per pass], "ratio": [per pass], "lo": [per pass], "hi": [per pass],
    "times": [[per round] per pass]}}; ratio = median over rounds of t(reference) / t(name).
    ``units`` (optional, {name: units of work per step}) lets the sides do different amounts of work per step
    (e.g. more samples for the faster side, so each step is long enough to time): the ratio is then per unit,
    (t(reference) / units[reference]) / (t(name) / units[name]) — how many times the reference's rate."""
    if reference not in steps:
        raise ValueError(f"reference {reference!r} is not one of the steps {list(steps)}")
    per = {n: 1.0 for n in steps} if units is None else {n: float(units[n]) for n in steps}
    names = list(steps)
    for _ in range(warmup):
        for n in names:
            steps[n]()
    passes_times = []
    for _ in range(passes):
        times = {n: [] for n in names}
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
            for n in order:
                t0 = time.perf_counter()
                steps[n]()
                times[n].append(time.perf_counter() - t0)
        passes_times.append(times)
    return summarise(passes_times, reference, per)


def compare_fresh(makers: dict[str, Callable[[], Callable[[], object]]], reference: str, *, rounds: int = 3,
                  passes: int = 2) -> dict[str, dict]:  # fmt: skip
    """compare() for work that can be timed only once per object (compiling a step): each round calls every
    ``makers[name]()`` (untimed: build the model, a fresh jit) and times the callable it returns, interleaved
    in rotating order. No warm-up: the first round is what a user waits for too."""
    names = list(makers)
    passes_times = []
    for _ in range(passes):
        times = {n: [] for n in names}
        for r in range(rounds):
            for n in names[r % len(names) :] + names[: r % len(names)]:
                work = makers[n]()
                t0 = time.perf_counter()
                work()
                times[n].append(time.perf_counter() - t0)
        passes_times.append(times)
    return summarise(passes_times, reference)


def summarise(passes_times: list[dict[str, list[float]]], reference: str, per: dict[str, float] | None = None):
    """compare()'s result from per-pass, per-side lists of round times (round i of every side paired)."""
    per = per or dict.fromkeys(passes_times[0], 1.0)
    out = {n: {"median_s": [], "ratio": [], "lo": [], "hi": [], "times": []} for n in passes_times[0]}
    for times in passes_times:
        for n, o in out.items():
            ratios = [(a / per[reference]) / (b / per[n]) for a, b in zip(times[reference], times[n], strict=True)]
            o["median_s"].append(statistics.median(times[n]))
            o["ratio"].append(statistics.median(ratios))
            o["lo"].append(min(ratios))
            o["hi"].append(max(ratios))
            o["times"].append(times[n])
    return out


def ratio_cell(row: dict) -> str:
    """'1.23 (1.10–1.31) · 1.25 (1.19–1.30)': each pass's median paired ratio and its range."""
    cells = zip(row["ratio"], row["lo"], row["hi"], strict=True)
    return " · ".join(f"{m:.2f} ({lo:.2f}–{hi:.2f})" for m, lo, hi in cells)


def machine_line() -> str:
    """What the figures were measured on: CPU model, cores, load average, date (for the docs' tables)."""
    import platform

    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from ssmlm.cli import cpu_only_host
        from ssmlm.targets import quiet_cuda_plugin

        if "JAX_PLATFORMS" not in os.environ and cpu_only_host():  # as the CLI does: no accelerator plugins' noise
            os.environ["JAX_PLATFORMS"] = "cpu"
        quiet_cuda_plugin()
        import jax

        backend = f"jax {jax.__version__} on {jax.default_backend()}"
    except ImportError:
        backend = "no jax"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    when = time.strftime("%Y-%m-%d")
    return f"{cpu}, {os.cpu_count()} cores, {backend}, load {load} (1/5/15 min), {when}"
