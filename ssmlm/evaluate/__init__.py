"""Metrics and result tables: pure functions of predictions and gold labels (GLUE metrics, SQuAD EM/F1)
and the tables that gather many runs' results; and the one evaluation runner (``runner``: a model's outputs on
host batches, scored), used by the training loop, `ssmlm evaluate` and the analyses. No training code: loading
a run for `ssmlm evaluate` lives in ssmlm.train.evaluate.

May import: ssmlm.errors, ssmlm.progress (and jax/flax in ``runner``). Imported by objectives (their scorers),
train, analyze and cli.
"""
