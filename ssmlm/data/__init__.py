"""Data: text in, tokens out. Corpora (local files, the built-in corpus, the hub), tokenizers, preprocessing
into token shards on disk, the deterministic batch sampler over them, and the finetuning tasks' readers
(GLUE, SQuAD, SCROLLS, local files). Turning tokens into training examples is not done here: that is an
objective's job (ssmlm.objectives).

May import: ssmlm.errors, ssmlm.progress, ssmlm.schema (its config section), ssmlm.evaluate's metrics (the
SCROLLS scorer). Never models, objectives, recipe, runs, train, analyze or cli.
"""
