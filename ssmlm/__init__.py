"""ssmlm: pretrain, length-extend, finetune, evaluate and analyse attention-free language models in JAX.

The data flow, bottom to top (each package may import only those below it; tests/test_layering.py checks):

    errors, progress          one-line user errors; progress bars
    models                    encoder families, their configs, heads, FLOPs (no recipe, no data)
    recipe, checks            YAML recipes -> typed configs; value checks
    data, evaluate            corpora -> token shards, tasks; metrics and tables
    objectives                token rows -> typed Batches; losses, evaluations, scores
    runs                      run directories, checkpoints, importing released weights
    train                     the one loop, optimizer, mesh, stage drivers, evaluate, dry-run plans
    analyze                   figures and tables of trained runs (a registry of modules)
    cli                       the `ssmlm` command
"""

__version__ = "0.1.0"
