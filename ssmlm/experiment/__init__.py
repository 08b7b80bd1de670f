"""`ssmlm experiment FILE.yaml`: arms × seeds of ordinary ssmlm runs, with confidence intervals.

    spec.py     the experiment file: schema, loading, one-line errors naming the file and the field
    runner.py   the plan (one run directory per stage of every arm × seed × grid point, seed by seed) and running
                it, resumably, with the warnings each run recorded
    stats.py    Student t and percentile-bootstrap intervals, the paired difference to an arm's reference; an
                interval from fewer than 3 values or with zero spread is marked not estimable
    report.py   results.md / .csv / .json and results.png (error bars)

Every stage is run by the same functions the CLI calls (ssmlm.train.drive, ssmlm.evaluate.run and ssmlm.evaluate.lm,
the ssmlm.analyze commands), so a run directory of an experiment is one that `ssmlm pretrain|finetune|evaluate|
analyze` would have written.
"""
