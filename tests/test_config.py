import pytest
import yaml

from scalebox_ms.config import Config, load_config
from scalebox_ms.errors import ConfigError


def test_defaults_roundtrip_through_yaml(tmp_path):
    cfg = Config()
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(str(path)) == cfg


def test_yaml_maps_onto_dataclasses(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env: {id: Acrobot-v1, num_envs: 2}\nppo: {n_steps: 8, batch_size: 16, learning_rate: 3e-4}\n")
    cfg = load_config(str(path))
    assert cfg.env.id == "Acrobot-v1" and cfg.env.num_envs == 2
    assert cfg.ppo.n_steps == 8 and cfg.ppo.learning_rate == pytest.approx(3e-4)
    assert isinstance(cfg.ppo.learning_rate, float)


def test_integer_written_as_float_is_accepted():
    assert Config.from_dict({"run": {"total_steps": 1e5}}).run.total_steps == 100000


@pytest.mark.parametrize("data, culprit", [
    ({"ppo": {"n_step": 5}}, "unknown key 'n_step' (did you mean 'n_steps'?)"),
    ({"pppo": {}}, "unknown key 'pppo'"),
    ({"ppo": {"n_steps": "many"}}, "ppo.n_steps: expected an integer"),
    ({"ppo": {"n_steps": True}}, "ppo.n_steps: expected an integer"),
    ({"ppo": {"gamma": 1.5}}, "ppo.gamma: must be in [0, 1]"),
    ({"ppo": {"learning_rate": -1}}, "ppo.learning_rate: must be > 0"),
    ({"ppo": {"lr_schedule": "cosine"}}, "ppo.lr_schedule: 'cosine' is not one of constant, linear"),
    ({"ppo": {"batch_size": 100}}, "ppo.batch_size: (100) must divide"),
    ({"env": {"normalize_obs": "yes"}}, "env.normalize_obs: expected true/false"),
    ({"policy": {"pi_layers": [64, 0]}}, "policy.pi_layers: layer sizes must be >= 1"),
    ({"policy": {"pi_layers": 64}}, "policy.pi_layers: expected a list"),
    ({"sandbox": {"device": "tpu"}}, "sandbox.device: 'tpu' is not one of"),
    ({"env": 3}, "section 'env' must be a mapping"),
])
def test_bad_values_name_the_key(data, culprit):
    with pytest.raises(ConfigError) as exc:
        Config.from_dict(data)
    assert culprit in str(exc.value)
    assert "\n" not in str(exc.value)


def test_overrides_parse_yaml_values():
    cfg = Config().with_overrides(["ppo.n_epochs=3", "ppo.target_kl=0.02", "policy.pi_layers=[32, 32]",
                                   "ppo.clip_range_vf=null", "env.normalize_obs=true"])
    assert cfg.ppo.n_epochs == 3 and cfg.ppo.target_kl == 0.02 and cfg.policy.pi_layers == [32, 32]
    assert cfg.ppo.clip_range_vf is None and cfg.env.normalize_obs is True


@pytest.mark.parametrize("override, culprit", [
    ("ppo.n_epochs", "expected section.key=value"),
    ("n_epochs=3", "key must be section.key"),
    ("ppo.bogus=1", "ppo: unknown key 'bogus'"),
    ("ppo.n_epochs=[1", "ppo.n_epochs: value '[1' is not valid YAML"),
])
def test_bad_overrides(override, culprit):
    with pytest.raises(ConfigError) as exc:
        Config().with_overrides([override])
    assert culprit in str(exc.value)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(str(bad))
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(ConfigError, match="not UTF-8|invalid YAML"):
        load_config(str(binary))


def test_packaged_presets_load():
    import os

    import scalebox_ms

    cfg_dir = os.path.join(os.path.dirname(scalebox_ms.__file__), "configs")
    names = sorted(os.listdir(cfg_dir))
    assert {"ppo_cartpole.yaml", "ppo_acrobot.yaml", "ppo_pendulum.yaml", "ppo_halfcheetah.yaml"} <= set(names)
    for name in names:
        cfg = load_config(os.path.join(cfg_dir, name))
        assert cfg.env.id
    cart = load_config(os.path.join(cfg_dir, "ppo_cartpole.yaml"))
    # rl-zoo3's tuned CartPole-v1 PPO
    assert (cart.env.num_envs, cart.ppo.n_steps, cart.ppo.batch_size, cart.ppo.n_epochs) == (8, 32, 256, 20)
    assert (cart.ppo.gamma, cart.ppo.gae_lambda, cart.ppo.learning_rate) == (0.98, 0.8, 1e-3)
    assert cart.ppo.lr_schedule == cart.ppo.clip_schedule == "linear"
    with open(os.path.join(cfg_dir, "ppo_cartpole.yaml")) as f:
        assert yaml.safe_load(f)["run"]["total_steps"] == 100000
