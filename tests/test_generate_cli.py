"""`ssmlm generate` as a user meets it: an impossible --max-tokens refused at once in one line, before any model is
loaded; the text streamed token by token, the pieces joining to exactly what the Python API returns."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import TINY_LM_SEQ_LEN, invoke

from ssmlm.errors import UserError
from ssmlm.models.config import LMConfig
from ssmlm.models.decode_limits import LENGTH_FACTOR, check_new_tokens


def test_huge_max_tokens_is_refused_at_once_in_one_line(tiny_lm):
    limit = LENGTH_FACTOR * TINY_LM_SEQ_LEN
    for n in (100_000_000, limit + 1):
        res = invoke("generate", "--ckpt", tiny_lm, "--prompt", "The cat", "--max-tokens", n, code=2)
        lines = res.output.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1, res.output
        assert f"--max-tokens {n:,}" in lines[0] and f"at most {limit:,}" in lines[0] and "Traceback" not in res.output
    # before any work: the refusal needs no jax (no model is loaded, nothing compiled)
    args = ["generate", "--ckpt", str(tiny_lm), "--prompt", "x", "--max-tokens", "100000000"]
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom ssmlm.cli import app\n"
        f"r = CliRunner().invoke(app, {args!r})\nprint(r.exit_code, 'jax' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["2", "False"], out


def test_the_python_api_refuses_too(tiny_lm):
    from ssmlm.models.decode import Sampling
    from ssmlm.runs.generate import load_generator

    with pytest.raises(UserError, match="max_new_tokens 100,000,000"):
        load_generator(tiny_lm)("The cat", Sampling(max_new_tokens=100_000_000))
    with pytest.raises(UserError, match="--max-tokens"):
        load_generator(tiny_lm, max_new_tokens=100_000_000)


def test_kv_cache_bound():
    """The Transformer's cache grows with every token: refused past half the free memory; a recurrence is not."""
    tf = LMConfig(arch="transformer_lm", hidden_size=1024, num_layers=24, max_seq_length=4096, compute_dtype="bfloat16")
    per_token = 2 * 24 * 1024 * 2
    check_new_tokens(tf, 1000, prompt_tokens=24, free_bytes=2 * per_token * 1024)  # 1024 tokens: exactly half
    with pytest.raises(UserError, match=r"KV cache of 1,025 tokens .* at most 1,000 fit"):
        check_new_tokens(tf, 1001, prompt_tokens=24, free_bytes=2 * per_token * 1024)
    check_new_tokens(LMConfig(arch="gated_ssm", max_seq_length=4096), 100_000, free_bytes=1)


def test_streaming_joins_to_the_returned_text(tiny_lm):
    from ssmlm.data.reserved import END
    from ssmlm.models.decode import Sampling, generate_ids
    from ssmlm.runs.generate import load_generator

    gen = load_generator(tiny_lm)
    end = gen.tokenizer.token_to_id(END)
    for sampling in (Sampling(max_new_tokens=24), Sampling(max_new_tokens=24, temperature=1.0, seed=4)):
        pieces: list[str] = []
        text = gen("The cat saw", sampling, on_text=pieces.append)
        assert "".join(pieces) == text == gen("The cat saw", sampling)
        ids = generate_ids(gen.model, *gen.layout("The cat saw"), sampling, stop=lambda ids: ids[-1] == end)
        assert len(pieces) == len(ids)  # once per token, as it comes
        # a stop string taken from the middle of the text: nothing of it, or after it, is ever shown
        if len(text) > 8:
            stop = (text[5:8],)
            pieces = []
            cut = gen("The cat saw", sampling, stop, on_text=pieces.append)
            assert "".join(pieces) == cut == gen("The cat saw", sampling, stop) and stop[0] not in cut


def test_the_cli_streams_the_same_text(tiny_lm):
    from ssmlm.models.decode import Sampling
    from ssmlm.runs.generate import load_generator

    res = invoke("generate", "--ckpt", tiny_lm, "--prompt", "The cat", "--max-tokens", 12)
    assert res.stdout == load_generator(tiny_lm)("The cat", Sampling(max_new_tokens=12)) + "\n"


def test_text_stream_holds_incomplete_characters(tiny_lm):
    """Characters the byte-level BPE splits over several tokens are shown only once whole."""
    from ssmlm.runs.generate import TextStream

    tok = load_tokenizer(tiny_lm)
    text = "Déjà vu — naïve café, 日本, ok. " * 3  # longer than DECODE_WINDOW tokens: settled text is kept
    ids = tok.encode(text, add_special_tokens=False).ids
    assert any("\ufffd" in tok.decode(ids[:k]) for k in range(1, len(ids)))  # some prefix ends mid-character
    decode = tok.decode
    pieces: list[str] = []
    stream = TextStream(decode, (), lambda ids: decode(ids, skip_special_tokens=False), pieces.append)
    for k in range(1, len(ids) + 1):
        stream(ids[:k], k == len(ids))
    assert len(pieces) == len(ids) and "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def load_tokenizer(run_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(run_dir / "tokenizer.json"))
