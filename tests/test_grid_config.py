"""Experiment-file validation: unknown keys and bad values are errors naming the problem."""

from __future__ import annotations

import pytest

from oodeval.experiment import load_config

BASE = """
seeds = [0, 1]
[datasets]
id_train = "train"
id_test = "test"
ood = ["a", { name = "b", label = "B", split_column = "fine_grained" }]
[[models]]
name = "timm:test_resnet"
pretrained = false
[[detectors]]
name = "msp"
[[detectors]]
name = "energy"
hyperparameters = { temperature = 2.0 }
"""


def write(tmp_path, text: str, name: str = "exp.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_valid_file_parses_with_paths_relative_to_it(tmp_path):
    cfg = load_config(write(tmp_path, BASE))
    assert cfg.seeds == (0, 1)
    assert [d.label for d in cfg.ood] == ["a", "B"]
    assert cfg.ood[1].split_column == "fine_grained" and cfg.ood[0].split_column is None
    assert [d.name for d in cfg.detectors] == ["msp", "energy"]
    assert cfg.detectors[1].hyperparameters == {"temperature": 2.0}
    assert cfg.results == tmp_path / "results.parquet"
    assert cfg.store == tmp_path / "store"
    assert cfg.models[0].weights == (None,) and cfg.models[0].kind == "supervised"
    assert cfg.models[0].taps is False  # no nac in the list
    nac = load_config(write(tmp_path, BASE + '[[detectors]]\nname = "nac"\n'))
    assert nac.models[0].taps is True


def test_example_file_is_valid():
    from pathlib import Path

    cfg = load_config(Path(__file__).parents[1] / "examples" / "experiment.toml")
    assert [m.kind for m in cfg.models] == ["supervised", "supervised", "zero-shot"]
    assert cfg.ood[0].split_column == "fine_grained"


def test_yaml_equals_toml(tmp_path):
    yaml_text = """
seeds: [0, 1]
datasets:
  id_train: train
  id_test: test
  ood: [a, {name: b, label: B, split_column: fine_grained}]
models:
  - name: "timm:test_resnet"
    pretrained: false
detectors:
  - msp
  - {name: energy, hyperparameters: {temperature: 2.0}}
"""
    assert load_config(write(tmp_path, yaml_text, "exp.yaml")) == load_config(write(tmp_path, BASE))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: "bootstrap = 5\n" + s, "unknown key(s) 'bootstrap'"),
        (lambda s: s.replace('name = "timm:test_resnet"', 'name = "timm:test_resnet"\nweight = "x.pt"'), "unknown key(s) 'weight'"),
        (lambda s: s.replace('split_column = "fine_grained" }', 'split = "x" }'), "unknown key(s) 'split'"),
        (lambda s: s.replace('name = "msp"', 'name = "msq"'), "unknown detector 'msq'"),
        (lambda s: s.replace("temperature = 2.0", "t = 2.0"), "has no hyperparameter(s) t; it takes: compute_dtype, device, temperature"),
        (lambda s: s.replace("seeds = [0, 1]", "seeds = [0, 0]"), "seeds repeat"),
        (lambda s: s.replace("seeds = [0, 1]", 'seeds = ["0"]'), "seeds must be a non-empty list of integers"),
        (lambda s: s.replace('name = "timm:test_resnet"', 'name = "timm:test_resnet"\nweights = ["a.pt", "b.pt", "c.pt"]'), "lists 3 files but there are 2 seeds"),
        (lambda s: s.replace('name = "timm:test_resnet"', 'name = "timm:test_resnet"\nkind = "clip"'), "kind must be one of"),
        (lambda s: s.replace('id_train = "train"\n', ""), "id_train is required"),
        (lambda s: s.replace('"a", { name', '"b", { name').replace('label = "B", ', ""), "used twice"),
        (lambda s: s.replace("[[detectors]]\nname = \"msp\"", "[[detectors]]\nname = \"energy\"\nhyperparameters = { temperature = 2.0 }"), "configure the same detector"),
        (lambda s: s.replace('name = "timm:test_resnet"', 'name = "timm:test_resnet"\nfeatures = { c = "x" }'), "unknown dataset(s) c"),
        (lambda s: s.replace("seeds = [0, 1]", "seeds = [0, 1]\nbatch_size = true"), "batch_size' must be an integer"),
        (lambda s: s + '[[sweeps]]\nname = "w"\nvocabulary = "v.json"\nsizes = [10]\nscorer = "mcm"\n', "scorer must be a vocabulary scorer"),
        (lambda s: s + '[[sweeps]]\nname = "w"\nvocabulary = "v.json"\nsizes = []\n', "sizes must be a non-empty list"),
        (lambda s: s + '[[zeroshot]]\nname = "neglabel"\nvocabulary = "v.json"\nhyperparameters = { groups = 3 }\n', "has no hyperparameter(s) groups (did you mean n_groups?)"),
        (lambda s: s.replace('name = "msp"', 'name = "msp"\nvocabulary = "v.txt"'), "vocabulary applies to zero-shot scorers"),
    ],
)
def test_bad_files_name_the_problem(tmp_path, edit, message):
    with pytest.raises(ValueError) as err:
        load_config(write(tmp_path, edit(BASE)))
    assert message in str(err.value)


def test_missing_file_and_bad_syntax(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(write(tmp_path, "seeds = [0,"))
    with pytest.raises(ValueError, match="must end in .toml"):
        load_config(write(tmp_path, BASE, "exp.ini"))


def test_per_seed_weights(tmp_path):
    (tmp_path / "w0.pt").write_text("x")
    cfg = load_config(write(tmp_path, BASE.replace('pretrained = false', 'weights = ["w0.pt", "w1.pt"]')))
    m = cfg.models[0]
    assert m.weights_for(0) == str(tmp_path / "w0.pt") and m.weights_for(1) == str(tmp_path / "w1.pt")


def test_a_model_without_a_weights_choice_is_refused_with_the_hint(tmp_path):
    with pytest.raises(ValueError, match=r"model 'timm:test_resnet': no weights chosen for extracting id_test, a, B, id_train; "
                       r"add weights = \"FILE\" .*pretrained = true .*pretrained = false \(random init, on purpose\)"):
        load_config(write(tmp_path, BASE.replace("pretrained = false\n", "")))
    with pytest.raises(ValueError, match="give either weights .* or pretrained"):
        load_config(write(tmp_path, BASE.replace("pretrained = false", 'pretrained = true\nweights = "w.pt"')))
    assert load_config(write(tmp_path, BASE)).models[0].random_init
    assert load_config(write(tmp_path, BASE.replace("pretrained = false", "pretrained = true"))).models[0].pretrained is True
    assert not load_config(write(tmp_path, BASE.replace("pretrained = false", "pretrained = true"))).models[0].random_init


@pytest.mark.parametrize(
    "zeroshot, message",
    [
        ('[[zeroshot]]\nname = "mcm"\nvocabulary = "v.txt"\n', "'mcm' takes no vocabulary; only neglabel, eoe, csp, adaneg do"),
        ('[[zeroshot]]\nname = "neglabel"\n', "'neglabel' needs a `vocabulary`"),
        ('[[zeroshot]]\nname = "eoe"\n', "'eoe' needs a `vocabulary`"),
    ],
)
def test_vocabulary_must_match_the_scorer(tmp_path, zeroshot, message):
    text = BASE + '[[models]]\nname = "open_clip:ViT-B-16"\nlabel = "clip"\nkind = "zero-shot"\npretrained = false\n' + zeroshot
    with pytest.raises(ValueError, match=message):
        load_config(write(tmp_path, text))


@pytest.mark.parametrize(
    "zeroshot, message",
    [
        ('name = "eoe"\nvocabulary = "v/EOE-gen{g}.json"\n', "holds {g} but no `generations = N`"),
        ('name = "eoe"\nvocabulary = "v/EOE-{g}.json"\ngenerations = 3\n', "file name ends in '-gen{g}'"),
        ('name = "eoe"\nvocabulary = "v/EOE-gen{g}.json"\ngenerations = 0\n', "generations must be a whole number >= 1"),
    ],
)
def test_generations_expand_one_scorer_per_llm_generation(tmp_path, zeroshot, message):
    text = BASE + '[[models]]\nname = "open_clip:ViT-B-16"\nlabel = "clip"\nkind = "zero-shot"\npretrained = false\n[[zeroshot]]\n'
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("(", r"\(").replace("[", r"\[")):
        load_config(write(tmp_path, text + zeroshot))
    cfg = load_config(write(tmp_path, text + 'name = "eoe"\nvocabulary = "v/EOE-gen{g}.json"\ngenerations = 3\n'))
    assert [s.vocabulary for s in cfg.zeroshot] == [str(tmp_path / "v" / f"EOE-gen{g}.json") for g in range(3)]
    sweep = '[[sweeps]]\nname = "k"\nkind = "siblings"\nvocabulary = "v/GPT-gen0.json"\nsizes = [1, 5]\nseed = 3\n'
    cfg = load_config(write(tmp_path, text + 'name = "mcm"\n' + sweep))
    assert (cfg.sweeps[0].kind, cfg.sweeps[0].seed, cfg.sweeps[0].sizes) == ("siblings", 3, (1, 5))
    with pytest.raises(ValueError, match="kind must be 'prefix'"):
        load_config(write(tmp_path, text + 'name = "mcm"\n' + sweep.replace('"siblings"', '"random"')))
