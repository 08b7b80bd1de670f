"""What a person reads on the terminal once a command is done: ``terminal`` (one format for a metric's value,
table titles that break between words, a nested result as tables) and ``printouts`` (a dry run's plan and
`--fit` search, a training run's summary, an evaluation's metrics and the file they are written to).

May import everything up to ssmlm.train; experiment and cli import it. Lower packages return data and leave
printing to their callers.
"""
