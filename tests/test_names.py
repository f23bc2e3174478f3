"""One pattern for every name a user chooses (runs, suites, experiments, sizes, domains, recipes): it becomes a
file or folder name, so it is matched whole (``re.fullmatch``), holds no path separator, does not start with a
dot and is bounded. A bad name fails before any compute with a message naming its key."""

import re

import pytest

from basecap.config import ExperimentConfig, load_experiment, validate_run
from basecap.config_base import NAME, NAME_MAX, ConfigError, name_problem, run_name_problem
from basecap.data.recipe import recipe_from_dict

GOOD = ["a", "transformer_pp", "tpp_1.3b", "temp_4.0", "110m", "mamba2+mlp", "x-y", "_private", "A" * NAME_MAX]
BAD = ["", ".hidden", "..", "-rf", "+x", "a/b", "a\\b", "../runs", "a\n", "a b", "a\tb", "<img src=x onerror=alert(1)>",
       "a@lr=1", "a=b", "a,b", "A" * (NAME_MAX + 1), "é", "a\x00b"]


@pytest.mark.parametrize("name", GOOD)
def test_good_names(name):
    assert name_problem(name) is None and re.fullmatch(NAME, name)


@pytest.mark.parametrize("name", BAD)
def test_bad_names(name):
    assert name_problem(name) is not None


def test_a_trailing_newline_is_not_a_name():
    assert re.match(NAME + "$", "prose\n")  # why fullmatch: ``$`` matches before a final newline
    assert "contains '\\n'" in name_problem("prose\n")


def exp_file(tmp_path, runs: str, head: str = "", name: str = "exp.toml"):
    p = tmp_path / name
    p.write_text(f'{head}\n[data]\nseq_len = 32\n[model]\nd_model = 32\nn_layers = 2\nmax_seq_len = 64\n'
                 f'[train]\nsteps = 10\nwarmup_steps = 2\n{runs}')
    return p


def test_a_run_name_is_checked_with_its_key(tmp_path):
    runs = '[[runs]]\nname = "a"\n[[runs]]\nname = "b"\n[[runs]]\nname = "c/../../etc"\n'
    with pytest.raises(ConfigError, match=r"runs\[2\]\.name: 'c/\.\./\.\./etc' contains '/'; run names may use"):
        load_experiment(exp_file(tmp_path, runs))
    with pytest.raises(ConfigError, match=r"runs\[0\]\.name: 'a@lr=1' contains '@='"):
        load_experiment(exp_file(tmp_path, '[[runs]]\nname = "a@lr=1"\n'))  # @ = , are kept for sweep points
    with pytest.raises(ConfigError, match=r"duplicate run names \(ignoring case\) \['A', 'a'\]"):
        load_experiment(exp_file(tmp_path, '[[runs]]\nname = "a"\n[[runs]]\nname = "A"\n'))


def test_suite_size_and_experiment_names(tmp_path):
    markup = '[[runs]]\nname = "a"\n[[suites]]\nsuite = "mqar"\nname = "<img src=x onerror=alert(1)>"\n'
    with pytest.raises(ConfigError, match=r"suites\[0\]\.name: '<img src=x onerror=alert\(1\)>' contains '< =\(\)>'"):
        load_experiment(exp_file(tmp_path, markup))
    with pytest.raises(ConfigError, match=r"sizes\['\.\./x'\]: '\.\./x' contains '/'"):
        load_experiment(exp_file(tmp_path, '[[runs]]\nname = "a"\n[sizes."../x"]\ntrain = {steps = 5}\n'))
    with pytest.raises(ConfigError, match=r"\n  name: '\.secret' starts with '\.'; experiment names may use"):
        load_experiment(exp_file(tmp_path, "", head='name = ".secret"'))
    with pytest.raises(ConfigError, match=r"named after its file, and 'my study' contains ' '; experiment names may use"):
        load_experiment(exp_file(tmp_path, "", name="my study.toml"))
    with pytest.raises(ValueError, match=r"runs\[0\]\.name"):
        ExperimentConfig(name="x", runs=[{"name": "a\n"}])


def test_sweep_names_pass_the_run_folder_check(tmp_path):
    head = 'seeds = [0, 1]\n[sweep]\ntrain.lr = [1e-3, 0.03]\nmodel.head_impl = ["plain", "chunked"]\n'
    runs = load_experiment(exp_file(tmp_path, '[[runs]]\nname = "tpp"\n', head=head)).run_configs()
    assert runs[0].name == "tpp@lr=0.001,head_impl=plain" and runs[0].run_id == "tpp@lr=0.001,head_impl=plain-s0"
    assert len(runs) == 8 and run_name_problem("tpp@x=-0.5,y=1e-06") is None
    for rc in runs:
        assert run_name_problem(rc.name) is None and "/" not in rc.run_id and not rc.run_id.startswith(".")
    assert run_name_problem("tpp@lr=0.1/../x") is not None and run_name_problem("tpp@") is not None
    with pytest.raises(ConfigError, match="name: 'a/b' contains '/'"):
        validate_run({"name": "a/b"})


def recipe(domain: str, name: str = "mine") -> dict:
    return {"name": name, "domains": {domain: {}}, "sources": [{"kind": "jsonl", "domain": domain, "paths": ["x.jsonl"]}]}


def test_domain_and_recipe_names():
    assert recipe_from_dict(recipe("web.v2")).domains  # the same pattern as every other name
    with pytest.raises(ConfigError, match=r"domains\['prose\\n'\]: 'prose\\n' contains '\\n'; domain names may use"):
        recipe_from_dict(recipe("prose\n"))
    with pytest.raises(ConfigError, match=r"domains\['\.\./x'\]: '\.\./x' contains '/'"):
        recipe_from_dict(recipe("../x"))
    with pytest.raises(ConfigError, match=r"\n  name: 'a/b' contains '/'; recipe names may use"):
        recipe_from_dict(recipe("web", name="a/b"))
    two = recipe("web")
    two["domains"]["Web"] = {}
    two["sources"].append({"kind": "jsonl", "domain": "Web", "paths": ["y.jsonl"]})
    with pytest.raises(ConfigError, match="differ only in case"):
        recipe_from_dict(two)
