import pytest

from basecap.config import ExperimentConfig, apply_overrides, load_experiment, validate_run
from basecap.config_base import ConfigError
from basecap.matching import resolve
from basecap.model import ModelConfig
from basecap.presets import PRESETS, preset_names

EXP = """
name = "t"
seeds = [0, 1]
[data]
train_weights = {prose = 1.0}
seq_len = 32
[model]
d_model = 32
n_layers = 2
max_seq_len = 64
[train]
steps = 10
warmup_steps = 2
[[runs]]
name = "a"
[[runs]]
name = "b"
model.mixer = {name = "attention", position = "alibi"}
"""


def write(tmp_path, text):
    p = tmp_path / "exp.toml"
    p.write_text(text)
    return p


def test_experiment_resolves_runs_and_seeds(tmp_path):
    exp = load_experiment(write(tmp_path, EXP))
    runs = exp.resolve()
    assert [r.run_id for r in runs] == ["a-s0", "b-s0", "a-s1", "b-s1"]  # seed-major
    assert runs[1].model.mixer.position == "alibi"
    assert runs[0].model.mixer.position == "rope"


def test_unknown_key_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.stepz: unknown key"):
        load_experiment(write(tmp_path, EXP.replace("steps = 10", "stepz = 10")))


def test_wrong_type_names_key_and_value(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.steps"):
        load_experiment(write(tmp_path, EXP.replace("steps = 10", 'steps = "ten"')))


def test_unknown_mixer_lists_allowed(tmp_path):
    bad = EXP.replace('position = "alibi"', 'position = "alibi"').replace('name = "attention"', 'name = "atention"')
    with pytest.raises(ConfigError, match=r"unknown mixer 'atention'; allowed: .*attention"):
        load_experiment(write(tmp_path, bad))


def test_bad_literal_lists_allowed_values(tmp_path):
    with pytest.raises(ConfigError, match=r"position.*'none', 'absolute', 'rope' or 'alibi'"):
        load_experiment(write(tmp_path, EXP.replace('"alibi"', '"sinusoid"')))


def test_mixer_knob_unknown_for_that_mixer(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.mixer\.d_state: unknown key"):
        load_experiment(write(tmp_path, EXP.replace('position = "alibi"', "d_state = 16")))


def test_impossible_values(tmp_path):
    with pytest.raises(ConfigError, match="seq_len=128 exceeds model.max_seq_len=64"):
        load_experiment(write(tmp_path, EXP.replace("seq_len = 32", "seq_len = 128")))
    with pytest.raises(ConfigError, match="warmup_steps"):
        load_experiment(write(tmp_path, EXP.replace("warmup_steps = 2", "warmup_steps = 20")))
    with pytest.raises(ConfigError, match="divisible"):
        load_experiment(write(tmp_path, EXP.replace("warmup_steps = 2", "warmup_steps = 2\nbatch_size = 6\ngrad_accum = 4")))


def test_overrides_go_through_validation(tmp_path):
    p = write(tmp_path, EXP)
    exp = load_experiment(p, ["train.steps=20", "model.mixer.temperature=0.5"])
    assert exp.resolve()[0].train.steps == 20
    assert exp.resolve()[0].model.mixer.temperature == 0.5
    with pytest.raises(ConfigError, match=r"train\.steps"):
        load_experiment(p, ["train.steps=-1"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_experiment(p, ["train.steps"])


def test_changing_mixer_name_does_not_leak_knobs():
    d = apply_overrides({"model": {"mixer": {"name": "attention", "window": 4}}}, [])
    exp = ExperimentConfig(name="x", model=d["model"], runs=[{"name": "r", "model": {"mixer": {"name": "attention"}}}])
    assert exp.resolve()[0].model.mixer.window == 4  # same name: merged
    run = validate_run({"name": "r", "model": {"mixer": {"name": "attention", "window": 3}}})
    assert run.model.mixer.window == 3


def test_duplicate_and_reference_checks():
    with pytest.raises(ValueError, match="duplicate"):
        ExperimentConfig(name="x", runs=[{"name": "a"}, {"name": "a"}])
    with pytest.raises(ValueError, match="reference"):
        ExperimentConfig(name="x", reference="zz", runs=[{"name": "a"}])
    with pytest.raises(ValueError, match=r"more_references: \['zz'\] not run names"):
        ExperimentConfig(name="x", reference="a", more_references=["zz"], runs=[{"name": "a"}, {"name": "b"}])
    with pytest.raises(ValueError, match="name the first reference"):
        ExperimentConfig(name="x", more_references=["b"], runs=[{"name": "a"}, {"name": "b"}])
    from basecap.experiment import report_reference

    exp = ExperimentConfig(name="x", reference="a", more_references=["b"], runs=[{"name": "a"}, {"name": "b"}])
    assert report_reference(exp, exp.resolve()) == ["a", "b"]


def test_model_config_defaults_mlp_from_mixer():
    cfg = ModelConfig(mixer={"name": "attention"})
    assert cfg.mlp.name == "swiglu"


def test_size_switch_applies_named_overrides(tmp_path):
    text = EXP.replace('name = "t"', 'name = "t"\nsize = "tiny"') + """
[sizes.tiny]
train = {steps = 5, warmup_steps = 1}
[sizes.big]
model = {preset = "110m"}
"""
    p = write(tmp_path, text)
    exp = load_experiment(p)
    assert exp.resolve()[0].train.steps == 5
    assert str(exp.output_dir()).endswith("t-tiny")
    big = load_experiment(p, ["size=big"]).resolve()[0]
    assert big.model.d_model == 32  # explicit base values win over the preset
    with pytest.raises(ConfigError, match="size: 'huge' is not defined; allowed: tiny, big"):
        load_experiment(p, ["size=huge"])


def test_size_can_override_one_run(tmp_path):
    text = EXP.replace('name = "t"', 'name = "t"\nsize = "tiny"') + """
[sizes.tiny.runs.b]
model = {mixer = {window = 8}}
"""
    exp = load_experiment(write(tmp_path, text))
    runs = {r.name: r for r in exp.resolve()}
    assert runs["b"].model.mixer.window == 8 and runs["b"].model.mixer.position == "alibi"
    assert runs["a"].model.mixer.window == 0
    with pytest.raises(ConfigError, match=r"sizes.tiny.runs: unknown run\(s\) \['zz'\]"):
        load_experiment(write(tmp_path, text.replace("runs.b]", "runs.zz]")))


def test_validating_builds_nothing_and_resolve_matches(monkeypatch):
    import basecap.model

    def no_models(*a, **k):
        raise AssertionError("validation built a model")

    monkeypatch.setattr(basecap.model.LM, "__init__", no_models)
    cfg = ModelConfig(preset="tiny", mixer={"name": "mamba2"})
    assert cfg.match_params and cfg.mixer.expand == 2  # as written
    monkeypatch.undo()
    got = resolve(cfg)
    assert got.mixer.expand != 2 and resolve(got) == got  # matched; resolving again changes nothing
    run = resolve(validate_run({"name": "r", "model": {"preset": "tiny", "mixer": {"name": "attention", "window": 8}}}))
    assert run.model.mlp.hidden_mult != ModelConfig(mixer={"name": "attention"}).mlp.hidden_mult


def test_preset_names_come_from_one_table():
    assert preset_names() == list(PRESETS)
    with pytest.raises(ValueError, match="'tiny', '110m' or '1.3b'"):
        ModelConfig(preset="huge")


def test_experiment_resolution_checks_suites_and_matches(tmp_path):
    from basecap.experiment import resolve_experiment

    text = EXP.replace("max_seq_len = 64", "max_seq_len = 64\nmatch_params = true").replace(
        'position = "alibi"}', 'position = "alibi", window = 4}')
    exp, runs = resolve_experiment(write(tmp_path, text))
    assert [r.model for r in runs] == [r.model for r in exp.resolve()]
    assert runs[1].model.mlp != exp.run_configs()[1].model.mlp  # b differs from Transformer++: its MLP is resized
    with pytest.raises(ConfigError, match=r"suites\[0\]: suite 'mqar': unknown option\(s\) \['stepz'\]"):
        resolve_experiment(write(tmp_path, text + '\n[[suites]]\nsuite = "mqar"\nstepz = 3\n'))
    with pytest.raises(ConfigError, match="unknown suite 'nope'"):
        resolve_experiment(write(tmp_path, text + '\n[[suites]]\nsuite = "nope"\n'))


@pytest.mark.parametrize("override, message", [
    ("train.steps=true", r"train\.steps: a boolean is not a number \(got True\)"),
    ("eval.every=false", r"eval\.every: a boolean is not a number \(got False\)"),
    ("model.mixer.window=true", r"model\.mixer\.window: a boolean is not a number"),
    ("data.train_weights={prose=true}", r"data\.train_weights: a boolean is not a number"),
    ("train.lr=inf", r"train\.lr: Input should be a finite number \(got inf\)"),
    ("train.lr=nan", r"train\.lr: Input should be a finite number \(got nan\)"),
    ("data.train_weights={prose=inf}", r"data\.train_weights\.prose: Input should be a finite number"),
    ("train.betas=[0.9, 1.5]", r"train\.betas\.1: Input should be less than 1 \(got 1\.5\)"),
    ("train.betas=[-0.1, 0.9]", r"train\.betas\.0: Input should be greater than or equal to 0"),
    ("train.weight_decay=-0.1", r"train\.weight_decay: Input should be greater than or equal to 0"),
    ("train.grad_clip=-1", r"train\.grad_clip: Input should be greater than or equal to 0"),
    ("train.steps=1000000000", r"train\.steps: Input should be less than or equal to 100000000"),
    ("train.batch_size=0", r"train\.batch_size: Input should be greater than 0"),
    ("data.seq_len=2000000", r"data\.seq_len: Input should be less than or equal to 1048576"),
    ("model.d_model=100000", r"model\.d_model=100000 is over 65536"),
    ("model.n_layers=5000", r"model\.n_layers=5000 is over 1024"),
    ("train.warmup_steps=10", r"warmup_steps=10 must be < steps=10"),
])
def test_loose_values_are_rejected_with_their_key(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment(write(tmp_path, EXP), [override])


def test_strict_values_hold_for_every_config():
    from basecap.config import DataConfig, TrainConfig

    with pytest.raises(ValueError, match="finite"):
        TrainConfig(peak_flops=float("inf"))
    with pytest.raises(ValueError, match="boolean"):
        TrainConfig(steps=True)
    t = TrainConfig()
    with pytest.raises(ValueError, match="boolean"):
        t.steps = True  # assignments are validated too
    with pytest.raises(ValueError, match="finite"):
        DataConfig(train_weights={"prose": float("nan")})
    assert TrainConfig(lr=1, betas=[0, 0.5]).betas == (0.0, 0.5)  # an integer is a number; a TOML list is a pair
    assert TrainConfig(compile=True).compile is True  # booleans where booleans belong


SIZED = EXP.replace('name = "t"', 'name = "t"\nsize = "tiny"').replace(
    'model.mixer = {name = "attention", position = "alibi"}', 'model.mixer = {name = "attention", position = "alibi"}\ntrain.steps = 12') + """
[sizes.tiny]
train = {steps = 5, warmup_steps = 1}
[sizes.tiny.runs.b]
train = {steps = 7}
"""


def test_precedence_base_runs_size_then_set(tmp_path):
    from basecap.experiment import resolve_experiment

    p = write(tmp_path, SIZED)
    assert {r.name: r.train.steps for r in load_experiment(p).resolve()} == {"a": 5, "b": 7}
    exp, runs = resolve_experiment(p, ["train.steps=50"])
    assert {r.train.steps for r in runs} == {50} and {r.train.steps for r in exp.resolve()} == {50}
    assert exp.model_dump()["overrides"] == {"train.steps": 50}  # recorded in experiment.json
    runs = load_experiment(p, ['model.mixer={name="mamba2"}', "seeds=[3]", "data.train_weights={code=1.0}"]).resolve()
    assert [(r.run_id, r.model.mixer.name) for r in runs] == [("a-s3", "mamba2"), ("b-s3", "mamba2")]  # a table given replaces
    assert runs[1].data.train_weights == {"code": 1.0}
    with pytest.raises(ConfigError, match=r"(?s)runs\[1\] \(b\): model\.mixer.*position: unknown key"):
        load_experiment(p, ["model.mixer.name=mamba2"])  # a key given sets that key: b's alibi stays, and mamba2 has no position
    swept = load_experiment(p, ["sweep.train.lr=[0.001, 0.002]"]).run_configs()
    assert [r.name for r in swept][:2] == ["a@lr=0.001", "a@lr=0.002"] and swept[1].train.lr == 0.002


@pytest.mark.parametrize("override, message", [
    ("train.stepz=5", r"--set train\.stepz: unknown key; train has: steps, batch_size"),
    ("train.x.y=5", r"--set train\.x\.y: unknown key 'train\.x'; train has: steps"),
    ("stepz=5", r"--set stepz: unknown key; a run's keys start with data\., model\."),
    ("train.steps.x=5", r"--set train\.steps\.x: train\.steps is a value, not a table"),
    ("train=5", r"--set train: not a run config key"),
    ("overrides={}", r"--set overrides: unknown key"),
    ("model.mixer.d_state=16", r"model\.mixer\.d_state: unknown key"),  # a knob of another mixer
])
def test_a_set_key_that_matches_nothing_is_named(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment(write(tmp_path, SIZED), [override])


def test_set_on_a_swept_key_points_to_the_sweep(tmp_path):
    p = write(tmp_path, SIZED + "[sweep]\ntrain.lr = [0.001, 0.002]\n")
    with pytest.raises(ConfigError, match=r"--set train\.lr: train\.lr is swept; set its values with --set sweep\.train\.lr="):
        load_experiment(p, ["train.lr=0.01"])
    with pytest.raises(ConfigError, match=r"overrides: set with --set"):
        load_experiment(write(tmp_path, SIZED.replace('name = "t"', 'name = "t"\noverrides = {}')))
