"""MindIR export: a fresh process without scalebox_ms reproduces PPOTrainer.predict; INT8 files and CLI."""
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest

from conftest import REPO, run_module, small_config
from scalebox_ms.errors import ConfigError
from scalebox_ms.export import export_mindir, sidecar_path
from scalebox_ms.trainers import PPOTrainer

# Drives gymnasium's env with the exported policy using only mindspore + gymnasium + numpy.
DRIVER = textwrap.dedent("""
    import json, sys
    import numpy as np, gymnasium as gym, mindspore as ms
    path, env_id, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    policy = ms.nn.GraphCell(ms.load(path))
    env = gym.make(env_id)
    obs, _ = env.reset(seed=7)
    all_obs, all_act = [], []
    for t in range(steps):
        a = policy(ms.Tensor(obs[None].astype(np.float32))).asnumpy()[0]
        all_obs.append(obs.tolist()); all_act.append(a.tolist())
        obs, r, term, trunc, _ = env.step(int(a) if np.ndim(a) == 0 else a)
        if term or trunc:
            obs, _ = env.reset()
    batch = policy(ms.Tensor(np.asarray(all_obs, np.float32))).asnumpy()  # dynamic batch dimension
    assert "scalebox_ms" not in sys.modules
    print(json.dumps({"obs": all_obs, "actions": all_act, "batch": batch.tolist()}))
""")


def drive(path, env_id, steps, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, str(script), str(path), env_id, str(steps)], capture_output=True, text=True,
                       timeout=300, cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    tr = PPOTrainer(small_config(run={"total_steps": 1024}, env={"normalize_obs": True}))
    tr.learn()
    yield tr
    tr.close()


@pytest.mark.integration
def test_fp32_export_matches_predict_in_a_process_without_scalebox(cartpole, tmp_path):
    path = str(tmp_path / "policy.mindir")
    sc = export_mindir(cartpole, path)
    assert sc["normalization"] is not None and sc["quantization"] is None and sc["env_id"] == "CartPole-v1"
    with open(sidecar_path(path)) as f:
        assert json.load(f)["param_sha256"] == cartpole.parameters_sha256()
    out = drive(path, "CartPole-v1", 300, tmp_path)
    want = cartpole.predict(np.asarray(out["obs"], np.float32))
    np.testing.assert_array_equal(np.asarray(out["actions"]), want)
    np.testing.assert_array_equal(np.asarray(out["batch"]), want)


@pytest.mark.integration
@pytest.mark.parametrize("int8", [False, True])
def test_export_to_a_path_with_spaces_and_non_ascii_letters(cartpole, tmp_path, monkeypatch, int8):
    """MindSpore's export takes only file names of [0-9a-zA-Z@_-.:/\\]: a run directory (or the cwd) with a space in
    its path ended export in a 22-line ValueError traceback, and left the new directory behind."""
    from scalebox_ms.export import MindIRPolicy

    out_dir = tmp_path / "my runs" / "pö licy"
    path = str(out_dir / "pol icy.mindir")
    monkeypatch.chdir(tmp_path)

    def chdir(_):  # it did, to write by a bare name: another thread's relative paths then went elsewhere
        raise AssertionError("export changed the working directory")
    monkeypatch.setattr(os, "chdir", chdir)
    export_mindir(cartpole, path, int8=int8, calibrate_steps=64)
    assert sorted(os.listdir(out_dir)) == ["pol icy.mindir", "pol icy.mindir.json"]  # (no temporary file left)
    obs = np.random.default_rng(0).uniform(-0.2, 0.2, (16, 4)).astype(np.float32)
    actions = MindIRPolicy(path)(obs)
    if not int8:
        np.testing.assert_array_equal(actions, cartpole.predict(obs))
    assert actions.shape == (16,) and not list(tmp_path.glob("kernel_meta"))


@pytest.mark.integration
def test_continuous_export_matches_predict(tmp_path):
    tr = PPOTrainer(small_config(env={"id": "Pendulum-v1", "num_envs": 2, "normalize_obs": True},
                                 ppo={"n_steps": 32, "batch_size": 16}, run={"total_steps": 128}))
    tr.learn()
    path = str(tmp_path / "pend.mindir")
    export_mindir(tr, path)
    out = drive(path, "Pendulum-v1", 100, tmp_path)
    want = tr.predict(np.asarray(out["obs"], np.float32))
    np.testing.assert_allclose(np.asarray(out["actions"]), want, rtol=1e-5, atol=1e-5)
    assert np.all(np.abs(want) <= 2.0)
    from scalebox_ms.export import MindIRPolicy

    policy = MindIRPolicy(path)
    obs = np.asarray(out["obs"][:5], np.float32)
    np.testing.assert_allclose(policy(obs[0]), policy(obs[:1]))  # one observation is a batch of one
    with pytest.raises(ValueError, match=r"MindIRPolicy: observations of shape \(5, 2\); .* batch \(N, 3\)"):
        policy(obs[:, :2])  # (used to fail inside the GraphCell)
    tr.close()


@pytest.mark.integration
@pytest.mark.parametrize("level", ["L1", "L2"])
def test_int8_export_stores_int8_weights_and_runs_standalone(cartpole, tmp_path, level):
    from mindspore.train import mind_ir_pb2

    path = str(tmp_path / f"q_{level}.mindir")
    sc = export_mindir(cartpole, path, int8=True, quant_level=level, calibrate_steps=200)
    assert sc["quantization"]["level"] == level and sc["quantization"]["calibrate_steps"] == 200
    model = mind_ir_pb2.ModelProto()
    with open(path, "rb") as f:
        model.ParseFromString(f.read())
    types = {p.name.split(".")[-1]: p.data_type for p in model.graph.parameter}
    int8 = mind_ir_pb2.TensorProto.DataType.Value("INT8")
    assert types["weight_int8"] == int8
    out = drive(path, "CartPole-v1", 200, tmp_path)
    want = cartpole.predict(np.asarray(out["obs"], np.float32))
    assert (np.asarray(out["actions"]) == want).mean() >= 0.95


def _mindir(path):
    from mindspore.train import mind_ir_pb2

    model = mind_ir_pb2.ModelProto()
    with open(path, "rb") as f:
        model.ParseFromString(f.read())
    return model


def test_l2_stores_the_same_tensors_as_l1_and_adds_only_the_input_quantization(cartpole, tmp_path):
    files = {level: str(tmp_path / f"{level}.mindir") for level in ("L1", "L2")}
    for level, path in files.items():
        export_mindir(cartpole, path, int8=True, quant_level=level, calibrate_steps=64)
    l1, l2 = _mindir(files["L1"]), _mindir(files["L2"])

    def tensors(model):
        return sorted((p.name.split(":")[-1], p.data_type, len(p.raw_data)) for p in model.graph.parameter)

    def ops(model):  # computation nodes (not constants): op type names
        return [n.op_type.split("::")[-1].split(":")[0] for n in model.graph.node if n.op_type != "Constant"]

    assert tensors(l2) == tensors(l1)  # int8 weights, one float scale per channel, biases: nothing stored twice
    layers = sum(name.endswith("weight_int8") for name, *_ in tensors(l1))
    # L2's extra graph is the input quantization, one divide/round/clamp per layer, and nothing else
    assert len(ops(l2)) - len(ops(l1)) == 3 * layers, (ops(l1), ops(l2))
    assert not Counter(ops(l1)) - Counter(ops(l2))
    # node names carry the graph's name in every node: it must not be the long nested-function qualname
    assert not any("locals" in n.name for n in l2.graph.node)


def test_int8_file_is_at_most_035x_for_a_256x256_policy(tmp_path):
    tr = PPOTrainer(small_config(env={"id": "Pendulum-v1", "num_envs": 2}, ppo={"n_steps": 16, "batch_size": 16},
                                 policy={"pi_layers": [256, 256], "vf_layers": [256, 256], "activation": "relu"},
                                 run={"total_steps": 32}))
    tr.learn()
    fp32 = export_mindir(tr, str(tmp_path / "f.mindir"))["file_bytes"]
    q = export_mindir(tr, str(tmp_path / "q.mindir"), int8=True, calibrate_steps=50)["file_bytes"]
    assert q <= 0.35 * fp32, (q, fp32)
    tr.close()


@pytest.mark.integration
def test_export_and_evaluate_cli(tmp_path):
    run_dir = tmp_path / "run"
    r = run_module("train", "--total-steps", 512, "--run-dir", run_dir, "--no-progress", "--set", "env.num_envs=4",
                   "--set", "ppo.n_steps=16", "--set", "ppo.batch_size=32", "--set", "ppo.n_epochs=2",
                   "--set", "run.eval_episodes=0")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_module("export", "--run", run_dir, "--int8", "--quant-level", "L2", "--calibrate-steps", 64, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    sc = json.loads(r.stdout)
    assert sc["path"].endswith("policy_int8_L2.mindir") and os.path.exists(sc["path"])
    r = run_module("evaluate", "--mindir", sc["path"], "--episodes", 3, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["episodes"] == 3
    r = run_module("export", "--run", "run", cwd=tmp_path)  # (a relative --run: the sidecar names the checkpoint
    assert r.returncode == 0 and os.path.exists(run_dir / "policy.mindir")  # absolutely, not from export's cwd)
    with open(run_dir / "policy.mindir.json") as f:
        assert json.load(f)["source_checkpoint"] == str(run_dir / "checkpoints" / "ckpt_000000000512")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One trained run directory for the bad-input tests (each checks that it leaves the directory unchanged)."""
    run_dir = tmp_path_factory.mktemp("bad_input") / "run"
    r = run_module("train", "--total-steps", 64, "--run-dir", run_dir, "--no-progress", "--set", "env.num_envs=4",
                   "--set", "ppo.n_steps=16", "--set", "ppo.batch_size=32", "--set", "run.eval_episodes=0")
    assert r.returncode == 0, r.stderr[-2000:]
    return run_dir


@pytest.mark.parametrize("args, culprit", [
    (["--output", "x.onnx"], "must end with .mindir"),
    (["--quant-level", "L2"], "need --int8"),
    (["--calibrate-steps", "500"], "--calibrate-steps need --int8"),  # (was ignored: an fp32 export, exit 0)
    (["--int8", "--calibrate-steps", "0"], "--calibrate-steps"),
    (["--int8", "--calibrate-steps", "100000000000000000000"], "--calibrate-steps: must be in [1, 1,000,000]"),
    (["--int8", "--quant-level", "L9"], "--quant-level"),
    (["--percentile", "50"], "--percentile: only with --int8 --activation-calibration percentile"),
    (["--int8", "--percentile", "99"], "--percentile: only with"),  # (minmax calibration: it was ignored)
    (["--int8", "--activation-calibration", "percentile"],  # (L1: activations stay float; it was ignored)
     "--activation-calibration: only with --quant-level L2"),
])
@pytest.mark.integration
def test_export_bad_input(tiny_run, args, culprit):
    run_dir = tiny_run
    before = set(os.listdir(run_dir))
    r = run_module("export", "--run", run_dir, *args)
    assert r.returncode == 2 and culprit in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert set(os.listdir(run_dir)) == before


@pytest.mark.integration
def test_a_mindir_and_a_sidecar_of_different_exports_are_refused_in_one_line(cartpole, tmp_path):
    """A graph next to another export's sidecar (an export stopped between its two files, or files copied
    together by hand) used to run silently, or fail deep inside MindSpore with a long traceback."""
    import shutil

    from scalebox_ms.export import MindIRPolicy, export_mindir

    first = export_mindir(cartpole, str(tmp_path / "a.mindir"))
    export_mindir(cartpole, str(tmp_path / "b.mindir"), int8=True, calibrate_steps=16)
    MindIRPolicy(str(tmp_path / "a.mindir"))  # its own sidecar: fine
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(tmp_path / "a.mindir").st_mode & 0o777 == 0o666 & ~mask  # (MindSpore writes 0400)
    assert first["file_sha256"] and first["file_bytes"] == os.path.getsize(tmp_path / "a.mindir")
    shutil.copy(tmp_path / "b.mindir", tmp_path / "a.mindir")
    with pytest.raises(ConfigError, match=r"a.mindir: not the file its sidecar a.mindir.json describes"):
        MindIRPolicy(str(tmp_path / "a.mindir"))
    r = run_module("evaluate", "--mindir", tmp_path / "a.mindir", "--episodes", "1")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: --mindir")
    # exporting again removes the stale sidecar before it replaces the graph, then writes the new one
    export_mindir(cartpole, str(tmp_path / "a.mindir"))
    MindIRPolicy(str(tmp_path / "a.mindir"))


def test_ctrl_c_during_the_graph_compile_is_raised_after_it_and_writes_nothing(cartpole, tmp_path, monkeypatch):
    """A KeyboardInterrupt raised inside ms.export's compile became ~30 lines of ANALYZER errors and an
    analyze_fail.ir dump in the working directory, or was lost; it is now held until the compile is done, then
    raised, and the temporary graph file removed."""
    import signal

    import mindspore as ms

    from scalebox_ms.export import export_mindir

    compiled = []

    def export_with_ctrl_c(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # (Python runs its handler before the next line)
        compiled.append(real(*args, **kwargs))

    real = ms.export
    monkeypatch.setattr(ms, "export", export_with_ctrl_c)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # (as in a terminal; xdist may ignore it)
    try:
        with pytest.raises(KeyboardInterrupt):
            export_mindir(cartpole, str(tmp_path / "out" / "p.mindir"))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(compiled) == 1 and os.listdir(tmp_path / "out") == []


def test_sigint_held_raises_a_held_ctrl_c_over_an_error_in_the_block():
    import signal

    from scalebox_ms.cli_common import sigint_held

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            with sigint_held():
                os.kill(os.getpid(), signal.SIGINT)
                raise OSError("disk full")  # (after the Ctrl-C: the Ctrl-C is what the user asked for)
        assert isinstance(info.value.__cause__, OSError)
        with pytest.raises(OSError, match="disk full"):
            with sigint_held():
                raise OSError("disk full")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("edit", ["no input", "input null", "no env_id", "no action_space", "action_space []"])
def test_a_sidecar_without_its_keys_is_refused_in_one_line(cartpole, tmp_path, edit):
    """A sidecar that is JSON but lacks a key used to end evaluate --mindir in a KeyError traceback."""
    import json

    from scalebox_ms.export import MindIRPolicy, export_mindir

    path = str(tmp_path / "a.mindir")
    export_mindir(cartpole, path)
    with open(sidecar_path(path)) as f:
        sc = json.load(f)
    what, _, value = edit.partition(" ")
    if what == "no":
        del sc[value]
    else:
        sc[what] = json.loads(value)
    with open(sidecar_path(path), "w") as f:
        json.dump(sc, f)
    with pytest.raises(ConfigError, match=r"sidecar .*a.mindir.json is missing or corrupt"):
        MindIRPolicy(path)


@pytest.mark.parametrize("edit", [
    {"action_space": {"type": "Box"}}, {"action_space": {"type": "Foo"}}, {"input": {}}, {"env_kwargs": [1, 2]},
    {"file_bytes": None, "file_sha256": None}, {"action_space": {"type": "Box", "low": [0], "high": [0]}}])
def test_an_edited_sidecar_is_refused_in_one_line(cartpole, tmp_path, edit):
    """Every sidecar field is used as it stands: an edited one ended evaluate --mindir in a KeyError, a TypeError
    or ~50 lines of MindSpore traceback (exit 1), or ran silently (Box bounds set to 0 clipped every action to 0;
    file_bytes and file_sha256 removed switched the graph check off). The sidecar carries its own SHA-256."""
    from scalebox_ms.export import MindIRPolicy, export_mindir, sidecar_path

    path = str(tmp_path / "a.mindir")
    export_mindir(cartpole, path)
    with open(sidecar_path(path)) as f:
        sc = json.load(f)
    sc.update(edit)
    with open(sidecar_path(path), "w") as f:
        json.dump(sc, f)
    with pytest.raises(ConfigError, match=r"^--mindir .*a.mindir: sidecar .*a.mindir.json was edited since the "
                                          r"export \(its sidecar_sha256 does not match\); export again$"):
        MindIRPolicy(path)
    del sc["sidecar_sha256"]
    with open(sidecar_path(path), "w") as f:
        json.dump(sc, f)
    with pytest.raises(ConfigError, match=r"a.mindir.json was edited since the export"):
        MindIRPolicy(path)


def test_an_older_exports_sidecar_runs_with_a_warning_if_its_graph_checks_out(cartpole, tmp_path, caplog):
    """Sidecars before sidecar_sha256 (format v1) are still read when their file_sha256 matches the graph (a
    deployed file may have outlived its run): with a warning that edits to it cannot be detected. v1 sidecars
    written before file_sha256 (2026-12-05) were refused as 'not one of scalebox_ms.export': they are read when
    the graph's size matches."""
    from scalebox_ms.export import MindIRPolicy, export_mindir, sidecar_path

    path = str(tmp_path / "a.mindir")
    export_mindir(cartpole, path)
    with open(sidecar_path(path)) as f:
        sc = json.load(f)
    del sc["sidecar_sha256"]
    sc["format"] = "scalebox_ms.policy.mindir.v1"
    with open(sidecar_path(path), "w") as f:
        json.dump(sc, f)
    obs = np.zeros((2, 4), np.float32)
    with caplog.at_level("WARNING", logger="scalebox_ms.mindir"):
        assert MindIRPolicy(path)(obs).shape == (2,)
    assert "is of an older export (scalebox_ms.policy.mindir.v1, without its own SHA-256)" in caplog.text
    oldest = {k: v for k, v in sc.items() if k != "file_sha256"}
    with open(sidecar_path(path), "w") as f:
        json.dump(oldest, f)
    caplog.clear()
    with caplog.at_level("WARNING", logger="scalebox_ms.mindir"):
        assert MindIRPolicy(path)(obs).shape == (2,)
    assert "(scalebox_ms.policy.mindir.v1, without its own or its graph's SHA-256)" in caplog.text
    for edited, words in [({**sc, "file_sha256": "0" * 64}, "not the file its sidecar a.mindir.json describes"),
                          ({**oldest, "file_bytes": sc["file_bytes"] + 1}, "not the file its sidecar a.mindir.json"),
                          ({**sc, "format": "mine"},
                           r"\(format 'mine', not scalebox_ms.policy.mindir.v2\); export again$")]:
        with open(sidecar_path(path), "w") as f:
            json.dump(edited, f)
        with pytest.raises(ConfigError, match=words):
            MindIRPolicy(path)


@pytest.mark.integration
def test_a_sidecar_describing_another_graph_is_a_one_line_error(cartpole, tmp_path):
    """A sidecar whose input is not the graph's (its hashes made consistent again) used to end in ~50 lines of
    MindSpore's traceback inside the GraphCell call; an export whose sidecar path is a directory blamed --output,
    after compiling."""
    from scalebox_ms.export import MindIRPolicy, export_mindir, sidecar_path
    from scalebox_ms.fileio import sidecar_digest

    path = str(tmp_path / "a.mindir")
    export_mindir(cartpole, path)
    with open(sidecar_path(path)) as f:
        sc = json.load(f)
    sc["input"].update(shape=[None, 5], observation_shape=[5])
    sc["sidecar_sha256"] = sidecar_digest(sc)
    with open(sidecar_path(path), "w") as f:
        json.dump(sc, f)
    with pytest.raises(ConfigError, match=r"^MindIRPolicy: the graph refused the inputs its sidecar describes \("):
        MindIRPolicy(path)(np.zeros((3, 5), np.float32))
    r = run_module("evaluate", "--mindir", path, "--episodes", "1")  # (CartPole's observations: refused before)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: evaluation of 'CartPole-v1': MindIRPolicy: observations of shape (1, 4); the policy takes a batch "
        "(N, 5)"], r.stderr[-2000:]
    (tmp_path / "d.mindir.json").mkdir()
    with pytest.raises(ConfigError, match=r"^--output .*d.mindir: its sidecar's path .*d.mindir.json is a directory$"):
        export_mindir(cartpole, str(tmp_path / "d.mindir"))
    assert sorted(os.listdir(tmp_path)) == ["a.mindir", "a.mindir.json", "d.mindir.json"]


def test_a_graph_replaced_before_its_sidecar_is_written_is_not_vouched_for(cartpole, tmp_path, monkeypatch):
    """Two exports to one output: the second's graph replaced the first's between the first's graph and sidecar,
    and the first's sidecar, hashing whatever was at the output, vouched for the other graph (both exited 0)."""
    import hashlib

    import scalebox_ms.export as export
    from scalebox_ms.export import MindIRPolicy

    out = tmp_path / "p.mindir"
    real_replace = os.replace

    def replaced_by_another_export(src, dst):
        real_replace(src, dst)
        if str(dst) == str(out):
            out.write_bytes(b"another export's graph")

    monkeypatch.setattr(export.os, "replace", replaced_by_another_export)
    sidecar = export.export_mindir(cartpole, str(out))
    assert sidecar["file_sha256"] != hashlib.sha256(out.read_bytes()).hexdigest()  # (this export's own graph)
    with pytest.raises(ConfigError, match=r"p.mindir: not the file its sidecar p.mindir.json describes"):
        MindIRPolicy(str(out))


@pytest.mark.integration
def test_an_export_whose_sidecar_cannot_be_written_leaves_nothing(cartpole, tmp_path, monkeypatch):
    """A full disk at the sidecar used to leave the .mindir alone, which evaluate --mindir then refused."""
    import errno

    import scalebox_ms.export as export

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(export, "atomic_write_json", full)
    out = tmp_path / "out" / "x.mindir"
    with pytest.raises(ConfigError, match=r"^--output .*x.mindir: cannot write its sidecar .*x.mindir.json "
                                          r"\(No space left on device\)$"):
        export.export_mindir(cartpole, str(out))
    assert os.listdir(tmp_path / "out") == []
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match=r"afile/x.mindir: cannot write \(Not a directory\)$"):
        export.export_mindir(cartpole, str(tmp_path / "afile" / "x.mindir"))


@pytest.mark.integration
def test_an_output_name_near_the_file_system_limit_exports(cartpole, tmp_path):
    """A 247-character name (its sidecar 252, both legal) was refused "File name too long": the temporary files'
    names carried the output's name plus a suffix."""
    name = "a" * 240 + ".mindir"
    export_mindir(cartpole, str(tmp_path / name))
    assert sorted(os.listdir(tmp_path)) == [name, name + ".json"]


def test_a_policy_over_mindspores_single_file_limit_is_refused_before_anything_is_written(cartpole, tmp_path,
                                                                                             monkeypatch):
    """Over 1 GiB of parameters MindSpore writes a graph file and a folder of variables instead of one .mindir: the
    export failed with "cannot write (No such file or directory)" and left both behind (1.1 GB for a 268M-parameter
    policy). Here MindSpore's limit is lowered to 1 KiB."""
    from mindspore.train import serialization

    monkeypatch.setattr(serialization, "TOTAL_SAVE", 1)
    with pytest.raises(ConfigError, match=r"^--output .*p\.mindir: the policy's parameters take 0\.00 GiB; MindSpore "
                                          r"writes a MindIR over 9\.5367\d*e-07 GiB as a graph file and a folder of "
                                          "variables, which scalebox_ms's export .* does not support"):
        export_mindir(cartpole, str(tmp_path / "out" / "p.mindir"))
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_ctrl_c_after_the_command_is_done_prints_no_traceback(tmp_path):
    """Ctrl-C while Python exits (MindSpore's clean-up in atexit takes up to a second after "wrote ..."): the routing
    thread raised it into an atexit callback, which printed a KeyboardInterrupt traceback."""
    script = tmp_path / "late.py"
    script.write_text(textwrap.dedent("""
        import atexit, os, signal, time
        import scalebox_ms
        scalebox_ms.route_sigint_around_mindspore()

        def cleanup():  # (as MindSpore's: runs after the main thread is done)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
            print("clean-up done", flush=True)
        atexit.register(cleanup)
        print("wrote it", flush=True)
    """))
    from conftest import as_from_a_terminal

    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                       preexec_fn=as_from_a_terminal, env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0 and r.stdout.split() == ["wrote", "it", "clean-up", "done"], r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr[-2000:]


def test_export_refuses_missing_run_and_evaluate_missing_file(tmp_path):
    r = run_module("export", "--run", tmp_path / "none")
    assert r.returncode == 2 and "not a run directory" in r.stderr
    r = run_module("evaluate", "--mindir", tmp_path / "none.mindir")
    assert r.returncode == 2 and "file not found" in r.stderr


def test_mindir_policy_takes_the_envs_shapes_and_names_a_wrong_one():
    """MindIRPolicy's input handling on a stand-in graph (the identity): a (2, 3) Box is fed flat as the export
    takes it, as one observation, a batch, or a batch already flattened; other shapes are refused in one line."""
    from scalebox_ms.export import MindIRPolicy

    policy = MindIRPolicy.__new__(MindIRPolicy)
    policy.sidecar = {"input": {"dtype": "float32", "shape": [None, 6], "observation_shape": [2, 3]}}
    policy.cell = lambda x: x
    one = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(policy(one), one.reshape(1, 6))
    np.testing.assert_array_equal(policy(np.stack([one, one])), np.stack([one, one]).reshape(2, 6))
    np.testing.assert_array_equal(policy(one.reshape(1, 6)), one.reshape(1, 6))
    with pytest.raises(ValueError, match=r"observations of shape \(4, 3\); .* batch \(N, 2, 3\) or \(N, 6\)"):
        policy(np.zeros((4, 3), np.float32))
    for bad, message in [(np.array([[1.0, np.nan, 2.0, 3.0, 4.0, 5.0]], np.float32), r"observation at index 0 is not finite"),
                         (np.zeros((0, 6), np.float32), r"an empty batch"),
                         ([["a"] * 6], r"must hold numbers, got <U1")]:
        with pytest.raises(ValueError, match=r"^MindIRPolicy: .*" + message):
            policy(bad)


def test_mindir_policy_refuses_observations_outside_a_dict_space_in_one_line():
    """A Dict policy's inputs are checked as predict checks them (the graph would take an out-of-range Discrete
    value as a row of zeros, a fractional one truncated, a float frame in [0, 1] as black): one-line ValueErrors."""
    from scalebox_ms.export import MindIRPolicy

    policy = MindIRPolicy.__new__(MindIRPolicy)  # (a stand-in graph that returns its inputs)
    policy.sidecar = {"env_id": "test", "input": {"leaves": [
        {"path": ["flag"], "kind": "discrete", "dtype": "int32", "shape": [], "nvec": [3], "start": [1]},
        {"path": ["pos"], "kind": "box", "dtype": "float32", "shape": [2]},
        {"path": ["frame"], "kind": "image", "dtype": "uint8", "shape": [36, 36, 3]}]}}

    class Inputs:  # (what the GraphCell's output Tensor gives: here the inputs as numpy)
        def __init__(self, *xs):
            self.xs = xs

        def asnumpy(self):
            return tuple(x.asnumpy() for x in self.xs)

    policy.cell = Inputs
    frame = np.full((36, 36, 3), 7, np.uint8)
    flag, pos, frames = policy({"flag": 3, "pos": [0.5, -1.0], "frame": frame})
    assert flag.dtype == np.int32 and flag.tolist() == [3] and pos.shape == (1, 2) and frames.dtype == np.uint8
    batch = {"flag": np.array([1, 2, 3, 1]), "pos": np.zeros((4, 2)), "frame": np.zeros((4, 36, 36, 3))}
    assert policy(batch)[2].shape == (4, 36, 36, 3)
    for change, message in [({"flag": np.array([1, 2, 4, 1])}, r"observation flag = 4 at index 2 is outside"),
                            ({"flag": np.array([1, 1.5, 2, 1])}, r"observation flag = 1.5 at index 1 .*whole numbers"),
                            ({"pos": np.array([[0, 0], [0, 0], [np.inf, 0], [0, 0]])},
                             r"the observation part pos at index 2 is not finite"),
                            ({"frame": np.full((4, 36, 36, 3), 0.5)}, r"observation frame = 0.5 .*uint8 pixels"),
                            ({"frame": np.full((4, 36, 36, 3), 300)}, r"observation frame = 300 .*uint8 pixels"),
                            ({"pos": np.zeros((3, 2))}, r"the observation parts are batches of different sizes \(flag: 4, pos: 3, frame: 4\)"),
                            ({"frame": np.zeros((4, 3, 36, 36))},  # CHW frames for an HWC policy
                             r"observation part frame has shape \(4, 3, 36, 36\); .* \(N, 36, 36, 3\)")]:
        with pytest.raises(ValueError, match=r"^MindIRPolicy: " + message):
            policy({**batch, **change})
    with pytest.raises(ValueError, match=r"^MindIRPolicy: observation part pos is missing"):
        policy({"flag": 1, "frame": frame})
    # a part the space has not (it was dropped without a word; gymnasium's contains refuses it)
    with pytest.raises(ValueError, match=r"^MindIRPolicy: observation part speed is not in the env's observation "
                                         r"space \(Dict\("):
        policy({**batch, "speed": np.zeros(4)})
    with pytest.raises(ValueError, match=r"^MindIRPolicy: an empty batch"):
        policy({k: v[:0] for k, v in batch.items()})

