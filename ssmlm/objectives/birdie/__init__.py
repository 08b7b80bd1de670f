"""Birdie's pre-training objectives (docs/faithfulness.md#birdie-objectives): pure objective functions, the
configuration grid and named mixtures, START-layout row packing and a key-deterministic row pipeline.

    functions.py  the objectives: (src, space, rng, ids, **params) -> Sample | None
    mixtures.py   Config, the 104-config Birdie grid, initial action, named mixtures
    packing.py    [prefix…, START, y_1…y_{M−1}] rows with targets, weights, segments, types, positions
    pipeline.py   make_row / make_batch_rows: rows as a function of an integer key
"""

from ssmlm.objectives.birdie.functions import OBJECTIVES, Ids, Sample, sample
from ssmlm.objectives.birdie.mixtures import MIXTURES, Config, birdie_grid, initial_action, mixture
from ssmlm.objectives.birdie.packing import pack
from ssmlm.objectives.birdie.pipeline import make_batch_rows, make_row

__all__ = [
    "Config",
    "Ids",
    "MIXTURES",
    "OBJECTIVES",
    "Sample",
    "birdie_grid",
    "initial_action",
    "make_batch_rows",
    "make_row",
    "mixture",
    "pack",
    "sample",
]
