"""Recipes (ssmlm.recipe): shipped files load, base: inheritance, --set overrides, and errors that name the
file and the dotted key."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from ssmlm.errors import RecipeError, UserError
from ssmlm.recipe import DataConfig, ModelConfig, Recipe, TrainConfig, builtin_recipes, load_recipe

RECIPES = sorted((Path(__file__).resolve().parent.parent / "recipes").glob("*.yaml"))


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- shipped recipes


def test_recipes_directory_is_not_empty():
    names = {p.stem for p in RECIPES}
    assert {"default", "default_extend", "finetune_default"} <= names
    shipped = builtin_recipes()
    assert names <= set(shipped)
    assert all(shipped[n].resolve() == p.resolve() for n, p in ((p.stem, p) for p in RECIPES))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_loads_by_name_and_path(path, tmp_path):
    by_name = load_recipe(path.stem)
    by_path = load_recipe(str(path))
    assert isinstance(by_name, Recipe)
    assert by_name == by_path
    assert isinstance(by_name.model, ModelConfig) and isinstance(by_name.train, TrainConfig)
    assert isinstance(by_name.train.learning_rate, float) and by_name.train.learning_rate > 0
    # dumping to YAML and loading that gives the same recipe back (the dump is self-contained)
    dumped = write(tmp_path / "dumped.yaml", by_name.to_yaml())
    assert load_recipe(str(dumped)) == by_name


def expected_from_yaml(path: Path) -> dict:
    """Independent reading of a shipped recipe: plain YAML, base chain merged by hand."""
    raw = yaml.safe_load(path.read_text()) or {}
    base = raw.pop("base", None)
    if base is None:
        return raw
    parent_path = path.parent / base if (path.parent / base).is_file() else path.parent / f"{base}.yaml"
    merged = expected_from_yaml(parent_path)
    for k, v in raw.items():
        merged[k] = {**merged.get(k, {}), **v} if isinstance(v, dict) else v
    return merged


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_shipped_recipe_values_match_the_yaml(path):
    raw = expected_from_yaml(path)
    r = load_recipe(path.stem)
    for section, cls in [("model", ModelConfig), ("data", DataConfig), ("train", TrainConfig)]:
        given = raw.get(section) or {}
        got = getattr(r, section)
        for f in dataclasses.fields(cls):
            value = getattr(got, f.name)
            if f.name in given:
                want = given[f.name]
                if isinstance(want, str) and f.type in ("float", "float | None"):
                    want = float(want)
                assert value == pytest.approx(want) if isinstance(want, float) else value == want, (
                    section,
                    f.name,
                )
            else:
                default = f.default_factory() if f.default is dataclasses.MISSING else f.default
                assert value == default, (section, f.name)  # defaults live only in the dataclasses


def test_default_recipe_values():
    r = load_recipe(None)
    assert r == load_recipe("default")
    assert r.name == "default"
    assert r.model.arch == "bigs" and r.data.source == "builtin"
    assert type(r.train.learning_rate) is float and type(r.model.hidden_size) is int
    # keys the file does not set keep the dataclass defaults (the paper's)
    assert r.model.num_ssm == 64 and r.model.a_init == "hippo" and r.model.layer_norm_eps == 1e-12
    assert r.train.beta2 == 0.98 and r.train.eps == 1e-6
    assert r.seq_len == r.model.max_seq_length


def test_default_extend_inherits_from_default():
    d, r = load_recipe("default"), load_recipe("default_extend")
    assert r.model.max_seq_length == 512 and r.seq_len == 512
    assert r.model.hidden_size == d.model.hidden_size and r.model.num_layers == d.model.num_layers
    assert r.data.vocab_size == d.data.vocab_size and r.data.source == d.data.source
    assert r.train.log_every == d.train.log_every  # inherited
    assert r.train.schedule == "linear" != d.train.schedule


def test_finetune_default():
    r = load_recipe("finetune_default")
    assert r.train.epochs == 3.0 and type(r.train.epochs) is float  # int in YAML, coerced to float
    assert r.train.beta2 == 0.999 and r.train.weight_decay == 0.01 and r.train.learning_rate == 2e-5


# ----------------------------------------------------------------------------- base: inheritance


def test_base_chain_merges_nested_sections(tmp_path, monkeypatch):
    write(
        tmp_path / "grand.yaml",
        "model: {hidden_size: 64, num_layers: 3}\ntrain: {steps: 10, batch_size: 4}\n",
    )
    sub = tmp_path / "sub"
    sub.mkdir()
    write(sub / "parent.yaml", "base: ../grand.yaml\nmodel: {num_layers: 5}\ndata: {vocab_size: 500}\n")
    child = write(sub / "child.yaml", "base: parent.yaml\nname: kid\ntrain: {steps: 20}\n")
    monkeypatch.chdir(tmp_path.parent)  # base paths resolve relative to the including file, not the cwd
    r = load_recipe(str(child))
    assert r.name == "kid"
    assert r.model.hidden_size == 64 and r.model.num_layers == 5
    assert r.data.vocab_size == 500
    assert r.train.steps == 20 and r.train.batch_size == 4
    assert r.model.intermediate_size == ModelConfig().intermediate_size


def test_base_by_shipped_name(tmp_path):
    child = write(tmp_path / "mine.yaml", "base: default\nname: mine\nmodel: {hidden_size: 32}\n")
    r = load_recipe(str(child))
    d = load_recipe("default")
    assert r.model.hidden_size == 32 and r.name == "mine"
    assert r.model.num_layers == d.model.num_layers and r.train == d.train and r.data == d.data


def test_empty_recipe_is_an_error(tmp_path):
    # it would otherwise silently be the paper's full-size configuration
    for text in ("", "# only a comment\n"):
        msg = error(str(write(tmp_path / "empty.yaml", text)))
        assert str(tmp_path / "empty.yaml") in msg and "empty" in msg


def test_minimal_recipe_gets_defaults_and_file_stem(tmp_path):
    r = load_recipe(str(write(tmp_path / "small.yaml", "train: {steps: 5}\n")))
    assert r.name == "small" and r.train.steps == 5
    assert r.model == ModelConfig() and r.data == DataConfig()


def test_inheriting_recipe_is_named_after_its_own_file(tmp_path):
    child = write(tmp_path / "variant.yaml", "base: default\nmodel: {hidden_size: 32}\n")
    assert load_recipe(str(child)).name == "variant"


# ----------------------------------------------------------------------------- overrides


def test_overrides_are_parsed_and_coerced(tmp_path):
    r = load_recipe(
        "default",
        [
            "model.hidden_size=256",
            "train.learning_rate=1e-4",  # YAML reads this as a string: coerced to float
            "train.warmup_steps=null",
            "train.epochs=2",
            "data.lowercase=false",
            "objective.max_predictions=20",
            "task.name=sst2",
            "task.text_fields=[sentence1, sentence2]",
            "model.a_init=inv",
            "name=custom",
        ],
    )
    assert r.model.hidden_size == 256 and type(r.model.hidden_size) is int
    assert r.train.learning_rate == 1e-4 and type(r.train.learning_rate) is float
    assert r.train.warmup_steps is None
    assert r.train.epochs == 2.0 and type(r.train.epochs) is float
    assert r.data.lowercase is False and r.objective.max_predictions == 20
    assert r.task.name == "sst2" and r.task.text_fields == ["sentence1", "sentence2"]
    assert r.model.a_init == "inv" and r.name == "custom"
    # untouched keys stay as in the file
    d = load_recipe("default")
    assert r.model.num_layers == d.model.num_layers and r.train.steps == d.train.steps


def test_overrides_beat_the_file_and_its_base(tmp_path):
    child = write(tmp_path / "c.yaml", "base: default\nname: c\nmodel: {hidden_size: 32}\n")
    r = load_recipe(str(child), ["model.hidden_size=48", "model.num_layers=1"])
    assert r.model.hidden_size == 48 and r.model.num_layers == 1
    assert load_recipe(str(child)).model.hidden_size == 32  # the override did not stick
    assert r.train == load_recipe("default").train


def test_integral_float_for_int_and_int_for_float():
    r = load_recipe("default", ["train.steps=1000.0", "train.learning_rate=1"])
    assert r.train.steps == 1000 and type(r.train.steps) is int
    assert r.train.learning_rate == 1.0 and type(r.train.learning_rate) is float


# ----------------------------------------------------------------------------- errors


def error(ref, overrides=None) -> str:
    with pytest.raises(RecipeError) as e:
        load_recipe(ref, overrides)
    assert isinstance(e.value, UserError)
    return str(e.value)


def test_unknown_key_names_file_key_and_suggestion(tmp_path):
    path = write(tmp_path / "typo.yaml", "model:\n  hiden_size: 64\n")
    msg = error(str(path))
    assert str(path) in msg and "'model.hiden_size'" in msg and "did you mean 'hidden_size'" in msg


def test_unknown_section_and_unknown_key_without_close_match(tmp_path):
    msg = error(str(write(tmp_path / "sec.yaml", "modle: {hidden_size: 64}\n")))
    assert "sec.yaml" in msg and "'modle'" in msg and "did you mean 'model'" in msg
    msg = error(str(write(tmp_path / "far.yaml", "train: {zzzzzz: 1}\n")))
    assert "'train.zzzzzz'" in msg and "valid keys" in msg and "learning_rate" in msg


def test_unknown_key_via_override_is_reported():
    msg = error("default", ["model.hiden_size=256"])
    # the mistake is on the command line, so the message points there rather than at default.yaml
    assert "'model.hiden_size'" in msg and "did you mean 'hidden_size'" in msg and msg.startswith("--set")


@pytest.mark.parametrize(
    "text,key,expected",
    [
        ("model: {hidden_size: big}\n", "model.hidden_size", "expected int"),
        ("model: {hidden_size: true}\n", "model.hidden_size", "expected int"),  # bool is not an int
        ("model: {num_layers: 2.5}\n", "model.num_layers", "expected int"),
        ("train: {learning_rate: fast}\n", "train.learning_rate", "expected float"),
        ("data: {lowercase: maybe}\n", "data.lowercase", "expected bool"),
        ("data: {max_documents: many}\n", "data.max_documents", "expected int or null"),
        ("task: {text_fields: sentence}\n", "task.text_fields", "expected a list of str"),
        ("task: {text_fields: [a, 3.5]}\n", "task.text_fields", "expected a list of str or int"),  # names or positions
        ("name: [a, b]\n", "name", "expected str"),
    ],
)
def test_wrong_types(tmp_path, text, key, expected):
    path = write(tmp_path / "bad.yaml", text)
    msg = error(str(path))
    assert str(path) in msg and f"'{key}'" in msg and expected in msg


def test_bad_literal_value_with_suggestion(tmp_path):
    msg = error(str(write(tmp_path / "lit.yaml", "model: {a_init: hipo}\n")))
    assert "'model.a_init'" in msg and "'hipo'" in msg and "one of 'hippo', 'lin', 'inv'" in msg
    assert "did you mean 'hippo'" in msg
    msg = error("default", ["train.schedule=cosin"])
    assert "'train.schedule'" in msg and "did you mean 'cosine'" in msg


def test_section_that_is_not_a_mapping(tmp_path):
    msg = error(str(write(tmp_path / "sec.yaml", "model: 5\n")))
    assert "sec.yaml" in msg and "model" in msg and "expected a mapping" in msg


def test_bad_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path / "broken.yaml", "name: x\nmodel:\n  hidden_size: [1, 2\n  num_layers: 3\n")
    msg = error(str(path))
    assert str(path) in msg and "not valid YAML" in msg and "line" in msg
    msg = error(str(write(tmp_path / "list.yaml", "- a\n- b\n")))
    assert "list.yaml" in msg and "mapping" in msg


def test_base_loops(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: a.yaml\n")
    msg = error(str(tmp_path / "a.yaml"))
    assert "loops back" in msg and ("a.yaml" in msg or "b.yaml" in msg)
    write(tmp_path / "self.yaml", "base: self.yaml\n")
    assert "loops back" in error(str(tmp_path / "self.yaml"))


def test_base_must_be_a_string(tmp_path):
    msg = error(str(write(tmp_path / "b.yaml", "base: [default]\n")))
    assert "b.yaml" in msg and "'base'" in msg


def test_missing_recipe_and_missing_base(tmp_path):
    msg = error("defualt")
    assert "recipe not found" in msg and "'defualt'" in msg and "did you mean 'default'" in msg
    msg = error("qqqqqqqqqq")
    assert "recipe not found" in msg and "default" in msg  # lists the shipped recipes
    msg = error(str(write(tmp_path / "orphan.yaml", "base: no_such_parent.yaml\n")))
    assert "recipe not found" in msg and "no_such_parent" in msg


def test_override_syntax_errors():
    assert "expected KEY=VALUE" in error("default", ["model.hidden_size"])
    msg = error("default", ["name.first=1"])
    assert "'name' is not a section" in msg
    msg = error("default", ["model.num_layers=two"])
    assert "'model.num_layers'" in msg and "expected int" in msg


def test_error_in_base_names_the_base_file(tmp_path):
    write(tmp_path / "parent_with_typo.yaml", "model: {hiden_size: 64}\n")
    child = write(tmp_path / "child.yaml", "base: parent_with_typo.yaml\nname: child\n")
    msg = error(str(child))
    assert "'model.hiden_size'" in msg  # (this part holds)
    assert "parent_with_typo.yaml" in msg


# ----------------------------------------------------------------------------- the Recipe object


def test_recipe_is_frozen_and_fingerprint():
    r = load_recipe("default")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.name = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.model.hidden_size = 1  # type: ignore[misc]
    same = load_recipe("default")
    other = load_recipe("default", ["train.steps=601"])
    assert r.fingerprint() == same.fingerprint() and len(r.fingerprint()) == 16
    assert r.fingerprint() != other.fingerprint()
    assert r.fingerprint("model", "data") == other.fingerprint("model", "data")
    assert r.fingerprint("train") != other.fingerprint("train")
    assert yaml.safe_load(r.to_yaml()) == r.to_dict()
    assert load_recipe("default", ["data.max_seq_length=64"]).seq_len == 64


def test_yaml_duplicate_keys_are_refused_but_merges_may_override():
    """PyYAML keeps the last of two equal keys silently; ssmlm's loader names both lines. A merge's keys are not
    duplicates: overriding them is what a merge (``<<: *anchor``) is for."""
    from ssmlm import yamlfile

    with pytest.raises(yamlfile.DuplicateKeyError, match=r"key 'steps' appears twice \(lines 3 and 4\)"):
        yamlfile.load("arms:\n  - name: a\n    steps: 1\n    steps: 2\n")
    merged = yamlfile.load("x-base: &b {lr: 1, steps: 2}\narm:\n  <<: *b\n  steps: 5\n")
    assert merged["arm"] == {"lr": 1, "steps": 5}
    assert yamlfile.load("a: [{k: 1}, {k: 2}]") == {"a": [{"k": 1}, {"k": 2}]}  # equal keys in separate maps
