"""`ssmlm experiment FILE.yaml`: arms × seeds of ordinary ssmlm runs, with confidence intervals.

    spec.py     the experiment file: schema, loading, one-line errors naming the file and the field
    plan.py     the plan: one run directory per stage of every arm × seed × grid point, seed by seed
    runner.py   running the plan, resumably, with the warnings each run recorded; each arm's values
    execute.py  running (or reusing) one run of the plan in this process
    pool.py     the worker processes of --jobs > 1, and the signals that stop them with a checkpoint
    eta.py      the estimate of the time left
    stats.py    Student t and percentile-bootstrap intervals, the paired difference to an arm's reference; an
                interval from fewer than 3 values or with zero spread is marked not estimable
    report.py   results.md / .csv / .json and results.png (error bars)
    sweep_report.py  a budget sweep's tables (accuracy per budget, the first budget above chance, paired
                differences), sweep.csv and sweep-EVAL.png (accuracy against pretraining budget)

Every stage is run by the same functions the CLI calls (ssmlm.train.drive, ssmlm.checkpoint_eval.run and
ssmlm.checkpoint_eval.lm, the ssmlm.analyze commands), so a run directory of an experiment is one that
`ssmlm pretrain|finetune|evaluate|analyze` would have written.
"""
