"""Test environment: never touch the network, keep caches in temp dirs, share a JAX compile cache."""

import os
import tempfile

# Set before anything imports datasets / huggingface_hub / jax.
_TMP = tempfile.mkdtemp(prefix="ssmlm-tests-")
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_HOME", os.path.join(_TMP, "hf"))
os.environ.setdefault("SSMLM_HOME", os.path.join(_TMP, "ssmlm"))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_TMP, "jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Most tests are compile-bound (tiny shapes, hundreds of programs): without LLVM's optimisation passes such files
# take a quarter to a half less time, and what is computed does not change (XLA's HLO passes, which fix the
# numerics, still run).
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()

import random  # noqa: E402

import pytest  # noqa: E402

SUBJECTS = [
    "the cat",
    "a dog",
    "the old man",
    "my sister",
    "the teacher",
    "a small bird",
    "the farmer",
    "our neighbour",
]
VERBS = ["saw", "liked", "followed", "found", "helped", "watched", "called", "remembered"]
OBJECTS = ["the garden", "a red ball", "the river", "an open window", "the tall tree", "a quiet house", "the market"]
TAILS = ["in the morning", "after the rain", "before dinner", "near the bridge", "every day", "with great care"]


def english_lines(n: int, seed: int = 0) -> list[str]:
    """Simple generated English sentences: a tiny but real corpus for tokenizers and MLM."""
    rng = random.Random(seed)
    return [
        f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}."
        for _ in range(n)
    ]


@pytest.fixture
def corpus_file(tmp_path):
    """A small .txt corpus: 40 documents' worth of lines in one file per document."""
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(40):
        (d / f"doc{i:02d}.txt").write_text("\n".join(english_lines(30, seed=i)) + "\n")
    return d


def tiny_recipe(path, corpus, model=None, data=None, train=None, objective=None):
    """Write a recipe over the shipped `default` with a tiny model, the given corpus and runs under
    path's folder; ``model``/``data``/``train``/``objective`` override the small defaults."""
    import yaml

    ssm = {} if (model or {}).get("arch") in ("gmlp", "amlp") else {"num_ssm": 8}  # gMLP has no SSM fields
    recipe = {
        "base": "default",
        "model": {"hidden_size": 16, "num_layers": 1, "intermediate_size": 32, "max_seq_length": 32, **ssm,
                  **(model or {})},
        "data": {"source": str(corpus), "vocab_size": 150, **(data or {})},
        "objective": {"duplicate_factor": 1, **(objective or {})},
        "train": {"steps": 6, "batch_size": 8, "log_every": 1, "eval_every": 0, "checkpoint_every": 0,
                  "out_dir": str(path.parent / "runs"), **(train or {})},
    }  # fmt: skip
    path.write_text(yaml.safe_dump(recipe))
    return path
