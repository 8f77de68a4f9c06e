import datetime
import os
import re

import numpy as np
import pytest
import yaml

from conftest import REPO, run_module
from scalebox_ms.config import Config, load_config
from scalebox_ms.errors import ConfigError


def test_defaults_roundtrip_through_yaml(tmp_path):
    cfg = Config()
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(str(path)) == cfg


def test_strings_that_read_as_numbers_roundtrip_through_config_yaml(tmp_path):
    """env.kwargs {'label': '1e5'} was written to config.yaml unquoted and read back as 100000.0: --resume refused
    the run as edited, evaluate gave the env a float."""
    kwargs = {"label": "1e5", "small": "1e-3", "dotted": "1.0e3", "number": 1e5, "nested": {"1e5": "2E+1"}}
    cfg = Config.from_dict({"env": {"kwargs": kwargs}})
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(str(path)).env.kwargs == kwargs


def test_yaml_maps_onto_dataclasses(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env: {id: Acrobot-v1, num_envs: 2}\nppo: {n_steps: 8, batch_size: 16, learning_rate: 3e-4}\n")
    cfg = load_config(str(path))
    assert cfg.env.id == "Acrobot-v1" and cfg.env.num_envs == 2
    assert cfg.ppo.n_steps == 8 and cfg.ppo.learning_rate == pytest.approx(3e-4)
    assert isinstance(cfg.ppo.learning_rate, float)


def test_integer_written_as_float_is_accepted():
    assert Config.from_dict({"run": {"total_steps": 1e5}}).run.total_steps == 100000
    # YAML 1.1 reads 1e5 (no dot) as the string "1e5": read as YAML 1.2's number
    assert Config().with_overrides(["run.total_steps=1e5"]).run.total_steps == 100000
    with pytest.raises(ConfigError, match=r"run\.total_steps: expected an integer"):
        Config().with_overrides(["run.total_steps=1.5e0"])
    with pytest.raises(ConfigError, match=r"run\.total_steps: 1e\+18 is a float beyond 2\*\*53.*in digits"):
        Config().with_overrides(["run.total_steps=1e18"])
    with pytest.raises(ConfigError, match=r"run\.total_steps: expected a 64-bit integer, got 1e\+20"):
        Config().with_overrides(["run.total_steps=1e20"])


def test_exponent_numbers_reach_env_kwargs_as_numbers(tmp_path):
    """YAML 1.1 reads 1e-3, 1e5 and 1.0e5 as strings; typed keys converted them, env.kwargs passed the string on:
    `--set env.kwargs.g=1e1` gave Pendulum the string '1e1' (a TypeError at its first step)."""
    cfg = Config().with_overrides(["env.kwargs.g=1e1", "env.kwargs.tol=-2.5E-3", "env.kwargs.name='1e5'",
                                   "env.kwargs.width=1.0e2"])
    assert cfg.env.kwargs == {"g": 10.0, "tol": -0.0025, "name": "1e5", "width": 100.0}
    path = tmp_path / "c.yaml"
    path.write_text("env:\n  kwargs: {g: 1e1, label: \"1e1\"}\nppo:\n  learning_rate: 1e-3\n")
    cfg = load_config(str(path))
    assert cfg.env.kwargs == {"g": 10.0, "label": "1e1"} and cfg.ppo.learning_rate == 1e-3


@pytest.mark.parametrize("data, culprit", [
    ({"ppo": {"n_step": 5}}, "unknown key 'n_step' (did you mean 'n_steps'?)"),
    ({"pppo": {}}, "unknown key 'pppo'"),
    ({"ppo": {"n_steps": "many"}}, "ppo.n_steps: expected an integer"),
    ({"ppo": {"n_steps": True}}, "ppo.n_steps: expected an integer"),
    ({"ppo": {"gamma": 1.5}}, "ppo.gamma: must be in [0, 1]"),
    ({"ppo": {"learning_rate": -1}}, "ppo.learning_rate: must be > 0"),
    ({"ppo": {"lr_schedule": "cosine"}}, "ppo.lr_schedule: 'cosine' is not one of constant, linear"),
    ({"ppo": {"batch_size": 100}}, "ppo.batch_size: (100) must divide"),
    ({"ppo": {"min_batch": -5}}, "ppo.min_batch: must be >= 1, got -5"),  # (with a fixed batch_size too)
    ({"env": {"num_envs": 10**9}}, "env.num_envs: must be in [1, 1,048,576], got 1000000000"),  # (was OOM-killed)
    ({"env": {"num_envs": 0}}, "env.num_envs: must be in [1, 1,048,576], got 0"),
    ({"ppo": {"max_batch": 8}}, "ppo.max_batch: (8) must be >= ppo.min_batch (64)"),
    ({"env": {"normalize_obs": "yes"}}, "env.normalize_obs: expected true/false"),
    # keys of a number or some strings name those strings, and a number's own reason (it read "or a string")
    ({"ppo": {"batch_size": 1.5}}, "ppo.batch_size: expected an integer or 'auto', got 1.5"),
    ({"ppo": {"batch_size": 10**20}}, "ppo.batch_size: expected a 64-bit integer, got 100000000000000000000"),
    ({"sandbox": {"memory_limit": [2]}}, "sandbox.memory_limit: expected an integer or a size like '16GB', got [2]"),
    ({"policy": {"pi_layers": [64, 0]}}, "policy.pi_layers: layer sizes must be >= 1"),
    ({"policy": {"pi_layers": 64}}, "policy.pi_layers: expected a list"),
    ({"sandbox": {"device": "tpu"}}, "sandbox.device: 'tpu' is not one of"),
    ({"env": 3}, "section 'env' must be a mapping"),
    # positive settings that are 0 in float32 (the graphs'): adam_eps 1e-50 made every update non-finite
    ({"ppo": {"adam_eps": 1e-50}}, "ppo.adam_eps: must be > 0 (at least 1.175e-38, the smallest normal float32"),
    ({"algo": "dqn", "dqn": {"learning_rate": 1e-44}}, "dqn.learning_rate: must be > 0 (at least 1.175e-38"),
    ({"algo": "sac", "sac": {"tau": 1e-50}}, "sac.tau: must be in (0, 1] (at least the smallest normal float32)"),
    ({"ppo": {"target_kl": 1e-40}}, "ppo.target_kl: must be > 0 or null (at least"),
    ({"ppo": {"max_grad_norm": 0}}, "ppo.max_grad_norm: must be > 0, got 0"),
    # env.kwargs that config.yaml and the checkpoints' JSON cannot hold (a traceback after config.yaml was written)
    ({"env": {"kwargs": {"when": datetime.date(2026, 1, 1)}}}, "env.kwargs.when: datetime.date(2026, 1, 1) (a date)"),
    ({"env": {"kwargs": {"m": {"s": {1, 2}}}}}, "env.kwargs.m.s: {1, 2} (a set) cannot be saved with the run"),
    ({"env": {"kwargs": {"b": [1, b"x"]}}}, "env.kwargs.b[1]: b'x' (a bytes)"),
    ({"env": {"kwargs": {"g": np.float32(9.8)}}}, "env.kwargs.g: 9.8 (a float32)"),
    ({"env": {"kwargs": {"m": {1: 2}}}}, "env.kwargs.m: keys must be strings, got 1"),
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


def test_overrides_set_one_entry_of_a_mapping():
    cfg = Config.from_dict({"env": {"id": "FrozenLake-v1", "kwargs": {"map_name": "8x8"}}}).with_overrides(
        ["env.kwargs.is_slippery=false", "env.kwargs.map_name=4x4"])
    assert cfg.env.kwargs == {"map_name": "4x4", "is_slippery": False}
    assert Config().with_overrides(["env.kwargs={a: 1}", "env.kwargs.b=2"]).env.kwargs == {"a": 1, "b": 2}


@pytest.mark.parametrize("override, culprit", [
    ("ppo.n_epochs", "expected section.key=value"),
    ("n_epochs=3", "key must be section.key"),
    ("env.kwargs.a.b=1", "key must be section.key"),
    ("ppo.n_epochs.x=1", "ppo.n_epochs is not a mapping"),
    ("ppo.bogus.x=1", "ppo: unknown key 'bogus'"),
    ("ppo.bogus=1", "ppo: unknown key 'bogus'"),
    ("ppo.n_epochs=[1", "ppo.n_epochs: value '[1' is not valid YAML"),
    ("foo.bar=1", "unknown key 'foo' (known: env, policy, ppo, run, sandbox, amp, parallel, dqn, sac, td3)"),
    ("algo.name=sac", "algo is a key of its own, e.g. --set algo=sac"),
])
def test_bad_overrides(override, culprit):
    with pytest.raises(ConfigError) as exc:
        Config().with_overrides([override])
    assert culprit in str(exc.value)


def test_a_preset_is_found_by_its_name_outside_a_source_checkout(tmp_path, monkeypatch):
    """The docs' `--config configs/ppo_pendulum.yaml` failed anywhere but in the repository's root (the presets ship
    inside the package), and the error did not say where they are."""
    monkeypatch.chdir(tmp_path)
    packaged = load_config(os.path.join(REPO, "scalebox_ms", "configs", "ppo_pendulum.yaml"))
    for name in ("configs/ppo_pendulum.yaml", "ppo_pendulum.yaml", "ppo_pendulum", "./configs/ppo_pendulum.yaml"):
        assert load_config(name) == packaged, name
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "ppo_pendulum.yaml").write_text("run: {seed: 7}\n")  # a file of one's own comes first
    assert load_config("configs/ppo_pendulum.yaml").run.seed == 7
    with pytest.raises(ConfigError, match=r"^config file not found: elsewhere/ppo_pendulum.yaml \(a packaged preset "
                                          r"is named by its file name alone, e.g. --config ppo_cartpole.yaml; the "
                                          r"presets: .*scalebox_ms/configs\)$"):
        load_config("elsewhere/ppo_pendulum.yaml")  # (another directory: not silently the preset)
    with pytest.raises(ConfigError, match="config file not found: ppo_pendulm.yaml"):
        load_config("ppo_pendulm.yaml")


def test_a_bad_key_in_a_file_names_the_file_and_an_empty_runs_config_says_where_its_config_is(tmp_path):
    """'run: unknown key' did not say which file; an empty run config.yaml (--resume) was told to leave out --config."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("run:\n  bogus: 1\n")
    with pytest.raises(ConfigError, match=rf"^config file {re.escape(str(bad))}: run: unknown key 'bogus'"):
        load_config(str(bad))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.yaml").write_text("")
    with pytest.raises(ConfigError, match=r"config\.yaml: empty \(no settings\); the config each checkpoint was "
                                          r"trained with is in its checkpoints/ckpt_<step>\.json \('config'\)$"):
        load_config(str(tmp_path / "config.yaml"))


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(str(bad))
    bad.write_text("env:\n  id: CartPole-v1\nppo:\n\tn_steps: 64\n")  # (the problem and where, not PyYAML's context)
    tab = r"invalid YAML \(found character '\\t' that cannot start any token at line 4, column 1\)$"
    with pytest.raises(ConfigError, match=tab):
        load_config(str(bad))
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(ConfigError, match="not UTF-8|invalid YAML"):
        load_config(str(binary))
    for text in ("", "# only a comment\n"):  # (used to train the defaults without a word)
        empty = tmp_path / "empty.yaml"
        empty.write_text(text)
        with pytest.raises(ConfigError, match=r"empty.yaml: empty \(no settings\); leave out --config"):
            load_config(str(empty))
    for text, kind in (("root:x:0:0:root:/root:/bin/bash\n", "str"), ("- env\n- ppo\n", "list")):
        other = tmp_path / "passwd"  # (--config /etc/passwd: the file is named, not just 'config')
        other.write_text(text)
        with pytest.raises(ConfigError, match=rf"^config file .*passwd: expected a mapping of sections \(env:, ppo:, "
                                              rf"run:, ...\), got {kind}$"):
            load_config(str(other))


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


# ---------------------------------------------------------------------- hostile YAML: alias bombs, duplicate keys
def _laughs(levels=9, width=9):
    """A 'billion laughs' config: a few hundred bytes that expand to width**levels strings in env.kwargs."""
    lines = ["env:", "  kwargs:", "    l0: &l0 [" + ",".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"    l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_file_is_refused_before_expanding(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(_laughs())
    assert path.stat().st_size < 500
    with pytest.raises(ConfigError) as exc:
        load_config(str(path))
    msg = str(exc.value)
    assert msg.startswith(f"config file {path}: env.kwargs.") and "expands to more than" in msg
    assert "\n" not in msg and len(msg) < 300


@pytest.mark.parametrize("value, culprit", [
    ("&a {x: *a}", "recursive alias"),
    ("&a [1, *a]", "recursive alias"),
    ("{a: " * 40 + "1" + "}" * 40, "nested deeper than"),
    ("{n: " + "9" * 5000 + "}", "--set env.kwargs: Exceeds the limit"),
])
def test_set_values_refuse_recursive_and_huge_yaml(value, culprit):
    with pytest.raises(ConfigError) as exc:
        Config().with_overrides([f"env.kwargs={value}"])
    assert culprit in str(exc.value) and len(str(exc.value)) <= 500


def test_aliases_and_merge_keys_within_the_bound_still_work(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env:\n  kwargs:\n    base: &b {a: 1, b: [1, 2]}\n    copy: *b\n    over: {<<: *b, a: 2}\n")
    kwargs = load_config(str(path)).env.kwargs
    assert kwargs["copy"] == {"a": 1, "b": [1, 2]} and kwargs["over"] == {"a": 2, "b": [1, 2]}


@pytest.mark.parametrize("text, culprit", [
    ("env:\n  id: Acrobot-v1\n  num_envs: 2\n  id: CartPole-v1\n", "duplicate key 'env.id' (lines 2 and 4)"),
    ("ppo: {n_steps: 8}\nrun: {seed: 1}\nppo: {n_epochs: 2}\n", "duplicate key 'ppo' (lines 1 and 3)"),
    ("env:\n  kwargs: {a: 1, b: 2, a: 3}\n", "duplicate key 'env.kwargs.a' (lines 2 and 2)"),
])
def test_duplicate_keys_in_a_file_are_errors(tmp_path, text, culprit):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_config(str(path))
    assert str(exc.value).startswith(f"config file {path}: ") and culprit in str(exc.value)
    assert "\n" not in str(exc.value)


def test_duplicate_keys_in_set_values_are_errors():
    with pytest.raises(ConfigError, match=r"^--set env\.kwargs: duplicate key 'render_mode'"):
        Config().with_overrides(["env.kwargs={render_mode: rgb_array, render_mode: human}"])
    with pytest.raises(ConfigError, match=r"^--set policy\.pi_layers: duplicate key '\[0\]\.a'"):
        Config().with_overrides(["policy.pi_layers=[{a: 1, a: 2}]"])


# ---------------------------------------------------------------------- error lines stay short
def test_short_repr_and_the_message_cap():
    from scalebox_ms.errors import MAX_MESSAGE, ScaleboxError, short_repr

    assert short_repr("abc") == "'abc'" and short_repr(0.5) == "0.5" and short_repr([1, 2]) == "[1, 2]"
    cut = short_repr("x" * 10**6, limit=20)
    assert cut.endswith("... (1000000 chars)") and len(cut) < 50
    assert short_repr(list(range(1000))).endswith("... (list of 1000 items)")
    assert short_repr(-10**200).endswith("... (202 chars)") and "print" in short_repr(10**9000)
    nested = ["lol"]
    for _ in range(30):  # 2**30 leaves if expanded: short_repr must not expand it
        nested = [nested, nested]
    assert len(short_repr(nested)) < 100
    msg = str(ScaleboxError("k: " + "y" * 10**6 + "; do this"))
    assert len(msg) == MAX_MESSAGE and msg.startswith("k: yyy") and " ... (1000012 chars) ... " in msg
    assert msg.endswith("y; do this")  # (the end says what to do: kept)


@pytest.mark.parametrize("data", [
    {"env": {"num_envs": "9" * 10**6}},
    {"ppo": {"lr_schedule": "c" * 10**6}},
    {"ppo": {"batch_size": "a" * 10**6}},
    {"policy": {"pi_layers": [64, "w" * 10**6]}},
    {"sandbox": {"memory_limit": "9" * 10**6 + "XB"}},
    {"env": {"kwargs": ["x" * 10**6]}},
    {"ppo": {"n" * 10**6: 1}},
    {"env": {"num_envs": -10**4000}},
    {"ppo": {"batch_size": 10**5000}},  # more digits than Python will print
])
def test_a_huge_value_gives_a_short_message(data):
    with pytest.raises(ConfigError) as exc:
        Config.from_dict(data)
    msg = str(exc.value)
    assert len(msg) <= 400 and "\n" not in msg  # under the 500-char cap: the value itself is shortened


def test_huge_set_item_gives_a_short_message():
    with pytest.raises(ConfigError) as exc:
        Config().with_overrides(["ppo.n_epochs=[" + "1, " * 10**5])
    assert str(exc.value).startswith("--set ppo.n_epochs: value '[1, 1,") and len(str(exc.value)) <= 300


@pytest.mark.integration
def test_cli_refuses_a_billion_laughs_file_with_one_short_line(tmp_path):
    from conftest import run_module

    path = tmp_path / "laughs.yaml"
    path.write_text(_laughs(levels=5))  # 9**5 strings: enough to be refused, small enough for any older code path
    r = run_module("train", "--config", str(path), "--no-progress", timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().startswith(f"error: config file {path}: env.kwargs.") and len(r.stderr) < 600


# ---------------------------------------------------------------------- one set of checks for configs and classes
def test_custom_act_kernel_with_amp_is_refused_at_config_time():
    with pytest.raises(ConfigError, match=r"^policy\.act_kernel: the custom kernel computes in float32"):
        Config.from_dict({"policy": {"act_kernel": "custom"}, "amp": {"level": "O2"}})


@pytest.mark.parametrize("kwargs, culprit", [
    ({"threads": -1}, "sandbox.threads: must be >= 0"), ({"threads": 2**32}, "sandbox.threads: must be <= 4096"),
    ({"step_timeout": 0}, "sandbox.step_timeout: must be > 0"),
    ({"isolation_level": "strict", "worker_memory_limit": "10MB"}, "sandbox.worker_memory_limit: must be at least"),
    ({"device": "tpu"}, "sandbox.device: 'tpu' is not one of"),
    ({"deterministic": "yes"}, "sandbox.deterministic: expected true/false"),
    ({"seed": -1}, "run.seed: must be in [0, 2**32)"),
])
def test_sandbox_arguments_get_the_config_checks(kwargs, culprit):
    from scalebox_ms.sandbox import Sandbox

    with pytest.raises(ConfigError) as exc:
        Sandbox(**kwargs)
    assert str(exc.value).startswith(culprit)


@pytest.mark.parametrize("kwargs, culprit", [
    ({"activation": "gelu"}, "policy.activation: 'gelu' is not one of tanh, relu"),
    ({"pi_layers": (64, 0)}, "policy.pi_layers: layer sizes must be >= 1"),
    ({"vf_layers": (64, "wide")}, "policy.vf_layers[1]: expected an integer"),
    ({"layer": "sparse"}, "policy.layer: 'sparse' is not one of dense, fused"),
    ({"layer": "fused", "align": 0}, "policy.align: must be in [1, 1024]"),
])
def test_actor_critic_arguments_get_the_config_checks(kwargs, culprit):
    from scalebox_ms.envs.spaces import SpaceSpec
    from scalebox_ms.models import ActorCritic

    with pytest.raises(ConfigError) as exc:
        ActorCritic(SpaceSpec(4, True, 2), **kwargs)
    assert str(exc.value).startswith(culprit)


@pytest.mark.parametrize("kwargs, culprit", [
    ({"growth_interval": "often"}, "amp.growth_interval: expected an integer"),
    # (an int32 counter in the graphs: 2**31 wrapped, and the loss scale grew on every clean step to fp16's limit)
    ({"growth_interval": 2**31}, "amp.growth_interval: must be in [1, 2**31 - 1], got 2147483648"),
    ({"init_scale": float("nan")}, "amp.init_scale: expected a finite number"),
    ({"dtype": "float8"}, "amp.dtype: 'float8' is not one of float16, bfloat16"),
])
def test_amp_arguments_get_the_config_checks(kwargs, culprit):
    from scalebox_ms.amp import AutoMixedPrecision

    with pytest.raises(ConfigError) as exc:
        AutoMixedPrecision("O2", **kwargs)
    assert str(exc.value).startswith(culprit)


@pytest.mark.integration
def test_the_cpp_update_kernel_with_workers_is_refused_before_msrun_starts(tmp_path):
    """The trainer refused ppo.update_kernel custom with data parallelism, but only ~12 s after msrun had started
    both ranks; the config alone says so."""
    with pytest.raises(ConfigError, match=r"^ppo.update_kernel: custom cannot run with data parallelism"):
        Config.from_dict({"env": {"num_envs": 8}, "parallel": {"workers": 2}, "ppo": {"update_kernel": "custom"}})
    Config.from_dict({"env": {"num_envs": 8}, "parallel": {"workers": 2}, "ppo": {"update_kernel": "auto"}})
    r = run_module("train", "--workers", "2", "--set", "ppo.update_kernel=custom", "--run-dir", tmp_path / "run",
                   "--no-progress", timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == ("error: ppo.update_kernel: custom cannot run with data "
                                                      "parallelism (the kernel has no all-reduce); use builtin or auto")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------- image observations known from the env id (ale-py)
@pytest.mark.parametrize("data, culprit", [
    ({"env": {"id": "ALE/Breakout-v5", "num_envs": 8}, "parallel": {"workers": 2}}, "parallel.workers"),
    ({"env": {"id": "BreakoutNoFrameskip-v4", "num_envs": 8}, "parallel": {"workers": 2}}, "parallel.workers"),
    ({"env": {"id": "ALE/Breakout-v5"}, "amp": {"level": "O2"}}, "amp.level"),
    ({"algo": "dqn", "env": {"id": "ALE/Pong-v5"}, "amp": {"level": "O1"}}, "amp.level"),
    ({"env": {"id": "ALE/Pong-v5", "preprocess": "none"}, "amp": {"level": "O1"}}, "amp.level"),  # raw RGB
])
def test_atari_frames_with_workers_or_amp_are_refused_at_config_time(data, culprit):
    """Image observations train in float32 in one process; for ale-py ids that is known from the config, so the
    launcher refuses before msrun starts (it used to start the job and fail in rank 1's trainer ~8 s later)."""
    with pytest.raises(ConfigError, match=rf"^{culprit}: image observations \(NatureCNN, the frames of '"):
        Config.from_dict(data)


@pytest.mark.parametrize("env, policy", [
    ({"kwargs": {"obs_type": "ram"}}, {}),  # 128 bytes for an MLP
    ({"preprocess": "none", "kwargs": {"obs_type": "grayscale"}}, {}),  # raw 2-D screens: an MLP's too
    ({}, {"features": "mlp"}),  # frames flattened for an MLP
])
def test_atari_observations_for_an_mlp_may_use_workers_and_amp(env, policy):
    Config.from_dict({"env": {"id": "ALE/Breakout-v5", "num_envs": 8, **env}, "policy": policy,
                      "parallel": {"workers": 2}, "amp": {"level": "O2"}})


@pytest.mark.integration
def test_cli_refuses_workers_on_atari_frames_before_launching(tmp_path):
    run_dir = tmp_path / "run"
    r = run_module("train", "--config", os.path.join(REPO, "configs", "ppo_atari.yaml"), "--workers", "2",
                   "--run-dir", run_dir, "--no-progress", timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: parallel.workers: image observations")
    assert len(r.stderr.strip().splitlines()) == 1 and not run_dir.exists()
    assert "msrun" not in r.stdout + r.stderr


@pytest.mark.integration
def test_cli_refuses_workers_on_an_image_env_of_ones_own_before_launching(tmp_path, monkeypatch):
    """An image env that is not an ale-py id shows its images only in its spaces: the ranks refused it ~10 s after
    msrun started (and CarRacing's likewise)."""
    monkeypatch.setenv("PYTHONPATH", os.path.join(REPO, "tests"))
    run_dir = tmp_path / "run"
    r = run_module("train", "--set", "env.id=image_envs:BrightSide-v0", "--workers", "2", "--run-dir", run_dir,
                   "--no-progress", timeout=120)
    assert (r.returncode, r.stderr) == (2, "error: parallel.workers: image observations (NatureCNN, the observations "
                                           "of 'image_envs:BrightSide-v0') train in float32 in one process only for "
                                           "now\n")
    assert not run_dir.exists()


@pytest.mark.parametrize("section, key, value, culprit", [
    ("ppo", "batch_size", 7, r"ppo\.batch_size: \(7\) must divide"),
    ("ppo", "n_epochs", 1.5, r"ppo\.n_epochs: expected an integer"),
    ("ppo", "gamma", 2.0, r"ppo\.gamma: must be in \[0, 1\]"),
    ("run", "total_steps", 0, r"run\.total_steps: must be >= 1"),
])
def test_a_config_edited_through_its_attributes_is_checked_by_the_trainer(section, key, value, culprit):
    """Trainers took a deep copy without the checks: numpy's reshape error from deep in the update (batch_size 7),
    a TypeError (n_epochs 1.5), or silent training with gamma 2 and total_steps 0."""
    import numpy as np

    from scalebox_ms.trainers import PPOTrainer

    cfg = load_config(None, ["env.num_envs=2", "ppo.n_steps=16", "ppo.batch_size=16"])
    setattr(getattr(cfg, section), key, value)
    with pytest.raises(ConfigError, match=culprit):
        PPOTrainer(cfg)
    # what Python code naturally writes still works: tuples for lists, numpy integers for ints
    ok = load_config(None, ["env.num_envs=2", "ppo.n_steps=16", "ppo.batch_size=16"])
    ok.policy.pi_layers, ok.policy.vf_layers, ok.env.num_envs = (32, 32), np.array([16]), np.int64(2)
    ok.env.kwargs = {"frameskip": (2, 5)}  # (env.kwargs go to the env as they are: ALE takes a tuple, not a list)
    copy = ok.checked_copy()
    assert copy.policy.pi_layers == [32, 32] and copy.policy.vf_layers == [16]
    assert copy.env.num_envs == 2 and type(copy.env.num_envs) is int and copy.env.kwargs == {"frameskip": (2, 5)}


@pytest.mark.parametrize("statement, culprit", [
    ("cfg.ppo.nsteps = 8", "ppo: unknown key 'nsteps' (did you mean 'n_steps'?)"),
    ("cfg.run.totalsteps = 8", "run: unknown key 'totalsteps' (did you mean 'total_steps'?)"),
    ("cfg.sac.entcoef = 0.1", "sac: unknown key 'entcoef' (did you mean 'ent_coef'?)"),
    ("cfg.enviroment = {}", "config: unknown key 'enviroment' (known: algo, env, policy, ppo, "),
])
def test_a_misspelt_attribute_of_a_config_is_refused_as_the_key_in_a_file_is(statement, culprit):
    """``cfg.ppo.nsteps = 8`` set an attribute nothing reads: the run trained with n_steps 32 without a word."""
    cfg = load_config(None)
    with pytest.raises(ConfigError, match="^" + re.escape(culprit)):
        exec(statement, {"cfg": cfg})
    cfg.ppo.n_steps, cfg.algo, cfg.sac.ent_coef = 8, "sac", 0.1  # (the keys themselves)
    assert (cfg.ppo.n_steps, cfg.sac.ent_coef) == (8, 0.1)
