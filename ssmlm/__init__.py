"""ssmlm: pretrain, length-extend, finetune, evaluate and analyse attention-free language models in JAX."""

__version__ = "0.1.0"
