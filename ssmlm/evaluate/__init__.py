"""Metrics and result tables: pure functions of predictions and gold labels (GLUE metrics, SQuAD EM/F1)
and the tables that gather many runs' results. No model or training code: the evaluation runner that loads a
run lives in ssmlm.train.evaluate.

May import: ssmlm.errors. Imported by objectives (their scorers), train and cli.
"""
