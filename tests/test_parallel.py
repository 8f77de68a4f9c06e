"""Data parallelism (msrun + MCCL on this CPU), gradient accumulation and the pipeline refusal."""
import contextlib
import json
import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import mindspore as ms
import numpy as np
import pytest
from conftest import REPO, as_from_a_terminal, run_module, small_config

from scalebox_ms import Config
from scalebox_ms.envs.normalize import RunningMeanStd, combine_moments
from scalebox_ms.envs.spaces import SpaceSpec
from scalebox_ms.errors import ConfigError
from scalebox_ms.models import build_model
from scalebox_ms.trainers.ppo_update import PPOUpdateStep, pack_features

# a short 2-worker CartPole run: 8 envs (4 per rank), minibatch 64 (32 per rank)
DP_ARGS = ["--set", "env.num_envs=8", "--set", "ppo.n_steps=16", "--set", "ppo.batch_size=64",
           "--set", "ppo.n_epochs=2", "--set", "run.eval_episodes=0", "--no-progress"]
NORM_ARGS = ["--set", "env.normalize_obs=true", "--set", "env.normalize_reward=true"]


def _rows(path):
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------- config
@pytest.mark.parametrize("section,msg", [
    ({"parallel": {"workers": 3}}, "env.num_envs"),
    ({"parallel": {"workers": 2}, "ppo": {"batch_size": 32, "n_steps": 16}, "env": {"num_envs": 2}}, None),
    ({"parallel": {"gradient_accumulation": 3}}, "parallel.gradient_accumulation"),
    ({"parallel": {"micro_batch_size": 48}}, "parallel.micro_batch_size"),
    ({"parallel": {"micro_batch_size": 8, "gradient_accumulation": 2}}, "parallel.gradient_accumulation"),
    ({"parallel": {"workers": 0}}, "parallel.workers"),
    ({"parallel": {"workers": 2}, "ppo": {"batch_size": "auto"}}, "ppo.batch_size"),
    ({"parallel": {"hang_timeout": -1}}, "parallel.hang_timeout"),
    ({"parallel": {"hang_timeout": 0}}, None),
    ({"parallel": {"micro_batch_size": 32}, "ppo": {"batch_size": "auto"}},
     "^parallel.micro_batch_size: needs a fixed ppo.batch_size"),  # (it named gradient_accumulation, not set)
    ({"parallel": {"gradient_accumulation": 2}, "ppo": {"batch_size": "auto"}},
     "^parallel.gradient_accumulation: needs a fixed ppo.batch_size"),
])
def test_parallel_config_validation(section, msg):
    data = {"env": {"num_envs": 8}, "ppo": {"n_steps": 32, "batch_size": 64}}
    for k, v in section.items():
        data.setdefault(k, {}).update(v)
    if msg is None:
        Config.from_dict(data)  # valid
        return
    with pytest.raises(ConfigError, match=msg.replace(".", r"\.")):
        Config.from_dict(data)


def test_micro_batches_from_size_or_count():
    from scalebox_ms.config import micro_batches

    assert micro_batches(Config.from_dict({"ppo": {"batch_size": 64, "n_steps": 32}, "env": {"num_envs": 8},
                                           "parallel": {"micro_batch_size": 16}})) == 4
    assert micro_batches(Config.from_dict({"ppo": {"batch_size": 64, "n_steps": 32}, "env": {"num_envs": 8},
                                           "parallel": {"workers": 2, "micro_batch_size": 8}})) == 4
    assert micro_batches(Config.from_dict({"parallel": {"gradient_accumulation": 2}, "ppo": {"batch_size": 64}})) == 2


# ---------------------------------------------------------------------- gradient accumulation
def _state(step):
    opt = step.optimizer
    return [p.asnumpy().copy() for p in list(opt.parameters) + list(opt.moment1) + list(opt.moment2)]


@pytest.mark.parametrize("discrete", [True, False])
def test_accumulated_micro_batches_equal_one_batch(discrete):
    """k micro-batches with gradients summed == one step on the whole minibatch (same init, same data)."""
    cfg = Config.from_dict({"ppo": {"ent_coef": 0.01, "clip_range_vf": 0.2}})
    spec = SpaceSpec(4, discrete, 2 if discrete else 1, None if discrete else [-2.0], None if discrete else [2.0])
    rng = np.random.default_rng(0)
    B = 64
    obs = rng.normal(size=(B, 4)).astype(np.float32)
    act = rng.integers(0, 2, B).astype(np.int32) if discrete else rng.normal(size=(B, 1)).astype(np.float32)
    cols = [rng.normal(size=B).astype(np.float32) - 0.7, rng.normal(size=B).astype(np.float32),
            rng.normal(size=B).astype(np.float32), rng.normal(size=B).astype(np.float32),
            (rng.random(B) > 0.2).astype(np.float32)]
    feats = ms.Tensor(pack_features(obs, *cols))
    idx = ms.Tensor(rng.permutation(B)[:48].astype(np.int32))
    scalars = [ms.Tensor(np.float32(x)) for x in (3e-3, 0.2, 0.2, np.inf)]
    results = []
    for k in (1, 4):
        ms.set_seed(11)
        model = build_model(spec, cfg.policy)
        step = PPOUpdateStep(model, cfg.ppo, micro_batches=k)
        start = _state(step)
        outs = [step(feats, ms.Tensor(act), idx, *scalars).asnumpy() for _ in range(3)]
        results.append((start, outs, _state(step)))
    (b1, o1, s1), (b4, o4, s4) = results
    for a, b in zip(b1, b4):  # same initial weights ...
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(b1[0], s1[0])  # ... which the three steps moved
    for a, b in zip(s1, s4):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.stack(o1)[:, :6], np.stack(o4)[:, :6], rtol=1e-4, atol=1e-6)


def test_accumulation_uses_the_minibatch_count_not_a_mean_of_micro_means():
    """The micro-batch losses share the minibatch's count and advantage statistics: with an uneven mask the
    accumulated loss equals the full-batch loss, and differs from the naive mean of per-micro-batch means."""
    from scalebox_ms.trainers.ppo_update import PPOLoss

    cfg = Config()
    model = build_model(SpaceSpec(4, True, 2), cfg.policy)
    rng = np.random.default_rng(5)
    B = 32
    obs = rng.normal(size=(B, 4)).astype(np.float32)
    mask = np.ones(B, np.float32)
    mask[:12] = 0.0  # first micro-batch mostly masked
    cols = [rng.normal(size=B) - 0.7, rng.normal(size=B), rng.normal(size=B) * 3 + 1, rng.normal(size=B), mask]
    feats = ms.Tensor(pack_features(obs, *cols))
    act_np = rng.integers(0, 2, B).astype(np.int32)
    act = ms.Tensor(act_np)
    idx = ms.Tensor(np.arange(B, dtype=np.int32))
    lr0 = [ms.Tensor(np.float32(x)) for x in (0.0, 0.2, np.inf, np.inf)]  # lr 0: only the statistics
    full = PPOUpdateStep(model, cfg.ppo, micro_batches=1)(feats, act, idx, *lr0).asnumpy()
    micro = PPOUpdateStep(model, cfg.ppo, micro_batches=2)(feats, act, idx, *lr0).asnumpy()
    np.testing.assert_allclose(full[:6], micro[:6], rtol=1e-5, atol=1e-6)
    loss = PPOLoss(model, cfg.ppo.ent_coef, cfg.ppo.vf_coef, False, True)
    halves = [loss(*[ms.Tensor(np.asarray(x[s], np.float32)) for x in (obs, act_np, *cols[:2], cols[2], cols[3], mask)],
                   ms.Tensor(np.float32(0.2)), ms.Tensor(np.float32(np.inf)))[0] for s in (slice(0, 16), slice(16, 32))]
    naive = float(np.mean([h.asnumpy() for h in halves]))
    assert abs(naive - float(full[0])) > 1e-3


def test_data_parallel_update_equals_the_single_process_update_on_the_union():
    """world_size=2 with the all-reduce replaced by 'x * 2' (two ranks holding the same shard) must equal a
    single process on that shard twice: sums, advantage statistics and gradients are global, not per rank."""
    from mindspore import nn

    class TwoEqualRanks(nn.Cell):
        def construct(self, x):
            return x * 2.0

    cfg = Config.from_dict({"ppo": {"ent_coef": 0.01}})
    spec = SpaceSpec(4, True, 2)
    rng = np.random.default_rng(9)
    B = 32
    obs = rng.normal(size=(B, 4)).astype(np.float32)
    cols = [rng.normal(size=B) - 0.7, rng.normal(size=B), rng.normal(size=B) * 2 + 0.5, rng.normal(size=B),
            (rng.random(B) > 0.25).astype(np.float32)]
    act = rng.integers(0, 2, B).astype(np.int32)
    shard = [ms.Tensor(pack_features(obs, *cols)), ms.Tensor(act), ms.Tensor(np.arange(B, dtype=np.int32))]
    union = [ms.Tensor(pack_features(np.concatenate([obs, obs]), *[np.concatenate([c, c]) for c in cols])),
             ms.Tensor(np.concatenate([act, act])), ms.Tensor(np.arange(2 * B, dtype=np.int32))]
    scalars = [ms.Tensor(np.float32(x)) for x in (3e-3, 0.2, np.inf, np.inf)]
    states, outs = [], []
    for world, inputs in ((2, shard), (1, union)):
        ms.set_seed(4)
        model = build_model(spec, cfg.policy)
        step = PPOUpdateStep(model, cfg.ppo, world_size=world)
        if world == 2:
            step.all_reduce = TwoEqualRanks()
        outs.append(np.stack([step(*inputs, *scalars).asnumpy() for _ in range(2)]))
        states.append(_state(step))
    np.testing.assert_allclose(outs[0][:, :6], outs[1][:, :6], rtol=1e-5, atol=1e-6)
    for a, b in zip(*states):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_reward_scaler_joins_the_collective_on_all_autoreset_steps():
    """Data parallel: a rank whose envs are all in their autoreset step must still call the reducer (a collective),
    or ranks pair up the wrong collectives and hang."""
    from scalebox_ms.envs.normalize import RewardScaler

    calls = []

    def reduce(batch):
        calls.append(len(batch))
        return (batch.mean(0), batch.var(0), len(batch)) if len(batch) else (np.zeros(()), np.ones(()), 0.0)

    scaler = RewardScaler(2, 0.99)
    scaler.rms.reduce = reduce
    scaler(np.ones(2), np.zeros(2, bool), np.array([False, False]))
    scaler(np.ones(2), np.zeros(2, bool), np.array([True, False]))
    assert calls == [0, 1]
    assert scaler.rms.count == pytest.approx(1.0 + 1e-4)


# ---------------------------------------------------------------------- statistics merge
def test_combined_moments_equal_the_concatenated_batch():
    rng = np.random.default_rng(2)
    parts = [rng.normal(loc=i, scale=i + 1, size=(n, 3)) for i, n in enumerate((5, 17, 0, 9))]
    mean, var, count = combine_moments([(p.mean(0) if len(p) else 0, p.var(0) if len(p) else 0, len(p))
                                        for p in parts])
    full = np.concatenate(parts)
    np.testing.assert_allclose(mean, full.mean(0), rtol=1e-12)
    np.testing.assert_allclose(var, full.var(0), rtol=1e-12)
    assert count == len(full)
    # a RunningMeanStd fed through a reducer equals one fed the concatenation
    a, b = RunningMeanStd((3,)), RunningMeanStd((3,), reduce=lambda batch: (full.mean(0), full.var(0), len(full)))
    a.update(full)
    b.update(parts[0])
    np.testing.assert_allclose(a.mean, b.mean)
    np.testing.assert_allclose(a.var, b.var)


# ---------------------------------------------------------------------- refusals
@pytest.mark.integration
def test_pipeline_stages_refused_on_cpu():
    from scalebox_ms.trainers import PPOTrainer

    with pytest.raises(ConfigError, match=r"^parallel\.pipeline_stages: 2: scalebox_ms has no pipeline parallelism on "
                                          r"any device \(MindSpore has none on CPU"):
        PPOTrainer(small_config(parallel={"pipeline_stages": 2}))
    r = run_module("train", "--set", "parallel.pipeline_stages=2", "--total-steps", "64",
                   "--run-dir", os.path.join(REPO, "runs", "_never_made"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("error: parallel.pipeline_stages")
    assert not os.path.exists(os.path.join(REPO, "runs", "_never_made"))


@pytest.mark.integration
def test_a_worker_refusing_its_config_before_the_cluster_forms_ends_the_job_at_once(tmp_path):
    """A check in the trainer's constructor (here the pipeline refusal) fails every rank before msrun's cluster has
    formed: msrun used to wait out parallel.timeout (300 s) for them, then print tracebacks."""
    run_dir = tmp_path / "run"
    r = run_module("train", "--workers", "2", "--set", "parallel.pipeline_stages=2", "--total-steps", "64",
                   "--run-dir", run_dir, "--no-progress", timeout=120)  # (TimeoutExpired if it waits for the cluster)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()  # (rank 0's own error line and msrun's report of it: in the logs)
    assert len(lines) == 2 and lines[0].startswith("launching 2 msrun workers"), lines
    assert lines[1].startswith("error: rank ") and \
        "parallel.pipeline_stages: 2: scalebox_ms has no pipeline parallelism" in lines[1], lines
    assert "Traceback" not in r.stderr and r.stdout.strip() == ""
    assert not run_dir.exists()  # nothing worth keeping


def test_workers_outside_msrun_refused_by_the_library():
    from scalebox_ms.trainers import PPOTrainer

    cfg = small_config(parallel={"workers": 2})
    tr = PPOTrainer(cfg)  # building (e.g. to evaluate a data-parallel checkpoint) is fine ...
    with pytest.raises(ConfigError, match=r"parallel\.workers: 2 workers .* not one of 2 msrun ranks"):
        tr.learn()  # ... training is not
    tr.close()


# ---------------------------------------------------------------------- real 2-worker runs
@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    """A 2-worker run paused at 512 steps, then resumed to 1024 (two msrun jobs)."""
    run_dir = str(tmp_path_factory.mktemp("dp") / "run")
    first = run_module("train", "--workers", "2", "--total-steps", "1024", "--until", "512", "--run-dir", run_dir,
                       *DP_ARGS, *NORM_ARGS, timeout=400)
    second = run_module("train", "--resume", run_dir, "--no-progress", timeout=400)
    return run_dir, first, second


@pytest.mark.integration
def test_two_worker_run_keeps_ranks_identical_and_resumes(dp_run):
    run_dir, first, second = dp_run
    assert first.returncode == 0, first.stderr[-2000:]
    assert second.returncode == 0, second.stderr[-2000:]
    summary = json.loads(second.stdout)
    assert summary["world_size"] == 2 and summary["status"] == "completed" and summary["global_step"] == 1024
    hashes = summary["param_sha256_per_rank"]
    assert len(hashes) == 2 and hashes[0] == hashes[1] == summary["param_sha256"]
    # running obs/return statistics merged across ranks: both ranks hold the same statistics
    stats = summary["statistics_sha256_per_rank"]
    assert len(stats) == 2 and stats[0] == stats[1]
    rows = _rows(os.path.join(run_dir, "metrics.csv"))
    # rank 0 alone writes: one row per iteration (8 envs x 16 steps = 128 global steps each), none duplicated
    assert [int(r["global_step"]) for r in rows] == list(range(128, 1025, 128))
    assert all(r["world_size"] == "2" for r in rows)
    comm = [float(r["share_comm"]) for r in rows]
    assert all(0.0 < c < 1.0 for c in comm)
    assert {"rank_0.pid", "rank_1.pid", "worker_0.log", "worker_1.log"} <= set(os.listdir(os.path.join(run_dir, "msrun")))
    with open(os.path.join(run_dir, "config.yaml")) as f:
        assert "workers: 2" in f.read()


@pytest.mark.integration
def test_two_workers_stop_together_once_solved(tmp_path):
    """run.stop_return with 2 ranks: each evaluates, rank 0's decision is shared, both stop at the same step."""
    run_dir = str(tmp_path / "run")
    r = run_module("train", "--workers", "2", "--total-steps", "2048", "--run-dir", run_dir, *DP_ARGS,
                   "--set", "run.eval_every=256", "--set", "run.eval_episodes=2", "--set", "run.stop_return=1",
                   timeout=400)  # any CartPole return is >= 1: the first evaluation (step 256) stops the job
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary["status"] == "solved" and summary["global_step"] == 256
    assert [e["step"] for e in summary["evaluations"]] == [256]
    hashes = summary["param_sha256_per_rank"]
    assert len(hashes) == 2 and hashes[0] == hashes[1] == summary["param_sha256"]
    assert [int(row["global_step"]) for row in _rows(os.path.join(run_dir, "metrics.csv"))] == [128, 256]
    # --resume while the bar stands trains on nowhere: rank 1 used to train alone and fail on rank 0's collectives
    r = run_module("train", "--resume", run_dir, "--no-progress", timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.loads(r.stdout)
    assert again["status"] == "solved" and again["global_step"] == 256
    assert again["param_sha256_per_rank"] == hashes


@pytest.mark.integration
def test_resume_with_another_world_size_is_refused(dp_run, tmp_path):
    r = run_module("train", "--resume", tmp_path / "none", "--workers", "2")  # (it named a world size of 1)
    assert r.returncode == 2 and r.stderr.strip() == f"error: --resume {tmp_path / 'none'}: not a run directory (no config.yaml)"
    run_dir = dp_run[0]
    r = run_module("train", "--resume", run_dir, "--workers", "1")
    assert r.returncode == 2
    assert "trained with 2 worker(s)" in r.stderr.strip().splitlines()[-1]
    # the library path refuses too (a 1-process trainer on a 2-rank checkpoint)
    from scalebox_ms.errors import CheckpointError
    from scalebox_ms.trainers.checkpoint import list_checkpoints
    from scalebox_ms.trainers.run import _check_world_size

    with pytest.raises(CheckpointError, match="2-rank run; this run has 1"):
        _check_world_size(list_checkpoints(os.path.join(run_dir, "checkpoints"))[-1], 1)


@pytest.mark.integration
def test_a_data_parallel_checkpoint_loads_into_one_process_with_all_its_envs(dp_run):
    """load_trainer of a 2-rank checkpoint in one process (evaluate, export, predict) built all num_envs envs but
    restored rank 0's in-flight state (half of them) over them; now every env starts afresh, with the statistics."""
    from scalebox_ms.trainers import load_trainer

    tr = load_trainer(os.path.join(dp_run[0], "checkpoints"))
    try:
        assert tr.global_step == 1024 and tr.num_envs == 8
        assert np.shape(tr.collector.obs) == (8, 4) and tr.collector.obs_normalizer.rms.count > 1
        assert tr.predict(np.zeros((8, 4), np.float32)).shape == (8,)
    finally:
        tr.close()


def _start_job(tmp_path, *args, rows=2):
    """A 2-worker run started as from a terminal, once it has written ``rows`` metrics rows: (process, run_dir)."""
    run_dir = str(tmp_path / "run")
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-m", "scalebox_ms.train", "--workers", "2", "--total-steps", "10000000",
                             "--run-dir", run_dir, *DP_ARGS, *args], cwd=str(tmp_path), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_from_a_terminal)
    metrics = os.path.join(run_dir, "metrics.csv")
    deadline = time.time() + 240
    while time.time() < deadline and not (os.path.exists(metrics) and len(_rows(metrics)) >= rows):
        if proc.poll() is not None:
            pytest.fail(proc.communicate()[1][-2000:])
        time.sleep(0.5)
    return proc, run_dir


def _processes_of(run_dir, wait=10.0):
    """The processes whose command line names ``run_dir``, once none is left or after ``wait`` seconds (processes
    just killed take a moment to go)."""
    deadline = time.time() + wait
    while True:
        found = []
        for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                with open(cmdline, "rb") as f:
                    if run_dir.encode() in f.read():
                        found.append(cmdline)
            except OSError:
                continue
        if not found or time.time() > deadline:
            return found
        time.sleep(0.2)


@pytest.mark.integration
def test_a_killed_worker_ends_the_job_with_its_rank(tmp_path):
    proc, run_dir = _start_job(tmp_path)
    try:
        with open(os.path.join(run_dir, "msrun", "rank_1.pid")) as f:
            pid = int(f.read())
        os.kill(pid, signal.SIGKILL)
        t0 = time.time()
        out, err = proc.communicate(timeout=120)
        waited = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"rank 1 (pid {pid})" in last, last
    assert "the launcher stopped the other workers" in last, last  # seen by its pid watch, not msrun's heartbeat
    assert waited < 120
    assert out == ""  # no summary
    assert _processes_of(run_dir) == []  # msrun's scheduler and rank 0 (each in its own session) are gone too


def test_a_job_is_stalled_only_when_every_live_rank_is_past_the_hang_timeout(tmp_path):
    """The launcher's hang rule on marker files: ranks that exited (rank_<r>.exit) or are gone do not count; one
    rank that ended an iteration recently, or one still in its first iteration (no beat yet), means the job still
    moves."""
    from scalebox_ms.parallel.ranks import stalled_workers

    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    try:
        d, now = str(tmp_path), time.time()
        for rank, (proc, age) in enumerate(zip(sleepers, (50.0, 40.0, 1.0))):
            (tmp_path / f"rank_{rank}.pid").write_text(str(proc.pid))
            (tmp_path / f"rank_{rank}.alive").write_text("")
            (tmp_path / f"rank_{rank}.beat").write_text("")
            os.utime(tmp_path / f"rank_{rank}.beat", (now - age, now - age))
        assert stalled_workers(d, 30.0, now) == []  # rank 2 ended an iteration a second ago
        (tmp_path / "rank_2.beat").unlink()
        assert stalled_workers(d, 30.0, now) == []  # rank 2 is in its first iteration
        (tmp_path / "rank_2.alive").rename(tmp_path / "rank_2.exit")  # rank 2 left through Python's exit
        assert [(r, p) for r, p, _ in stalled_workers(d, 30.0, now)] == [(0, sleepers[0].pid), (1, sleepers[1].pid)]
        assert [round(age) for _, _, age in stalled_workers(d, 30.0, now)] == [50, 40]
        assert stalled_workers(d, 45.0, now) == []  # rank 1: 40 s
        sleepers[0].kill()
        sleepers[0].wait()  # gone: the dead-worker watch's case, not a hang
        assert [r for r, _, _ in stalled_workers(d, 30.0, now)] == [1]
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()


@pytest.mark.integration
def test_a_hung_worker_stops_the_job_with_every_ranks_stack(tmp_path):
    """One rank's env hangs in step (the other rank then waits in the update's all-reduce): after
    parallel.hang_timeout seconds without an iteration ending on any rank, the launcher has each rank print its
    Python stacks into its log, stops the job (no process left) and names the ranks; the run stays resumable."""
    from scalebox_ms.trainers.checkpoint import list_checkpoints

    run_dir = str(tmp_path / "run")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, os.path.join(REPO, "tests"), env.get("PYTHONPATH", "")])
    # each env's step 40 is in the third iteration (16 steps per env and iteration); one env of one rank hangs
    kwargs = f"env.kwargs={{at: 40, once: '{tmp_path / 'hung'}'}}"
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "scalebox_ms.train", "--workers", "2", "--total-steps", "10000000",
                           "--run-dir", run_dir, *DP_ARGS, "--set", "env.id=faulty_envs:HangingCartPole-v0",
                           "--set", kwargs, "--set", "parallel.hang_timeout=12"],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: data-parallel job stopped after "), last
    assert "no rank ended an iteration for more than 12 s (parallel.hang_timeout; rank 0 (pid " in last, last
    pids = {r: int(open(os.path.join(run_dir, "msrun", f"rank_{r}.pid")).read()) for r in (0, 1)}
    assert all(f"rank {r} (pid {pid}): " in last for r, pid in pids.items()), last
    logs = {r: open(os.path.join(run_dir, "msrun", f"worker_{r}.log"), errors="replace").read() for r in (0, 1)}
    # faulthandler's dump: the hung rank is in the env's step, under the rollout
    stuck = [r for r, log in logs.items() if 'faulty_envs.py", line' in log and "in step" in log]
    assert len(stuck) == 1 and "in collect" in logs[stuck[0]], {r: log[-1500:] for r, log in logs.items()}
    assert all("Current thread" in log or "Thread 0x" in log for log in logs.values())  # both ranks dumped
    assert proc.stdout == "" and time.time() - t0 < 240
    assert "most recent call first" not in proc.stderr and 'File "' not in proc.stderr  # (stacks: in the logs)
    with open(os.path.join(run_dir, "msrun", "launcher.log")) as f:  # (all of what msrun printed, rank 0's log too)
        assert "most recent call first" in f.read()
    assert _processes_of(run_dir) == []
    assert list_checkpoints(os.path.join(run_dir, "checkpoints"))  # --resume has a checkpoint to continue from


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM,
                                    pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])  # (the same path)
def test_a_signal_to_the_launcher_stops_the_ranks_together_with_a_checkpoint(tmp_path, signum):
    """Ctrl-C, SIGTERM (a job scheduler, `kill`) or SIGHUP (the terminal closed) is sent on to the ranks, which stop
    together at an iteration's end, as a run in one process does: a checkpoint at that step, summary.json
    ("interrupted"), exit 128 + signum, nothing left running. It used to stop the job at once, losing the work since
    the last checkpoint. Evaluations while training (one all-gather of their own) come before the ranks' shared stop
    decision on every rank."""
    from scalebox_ms.trainers.checkpoint import list_checkpoints

    proc, run_dir = _start_job(tmp_path, "--set", "run.eval_every=256", "--set", "run.eval_episodes=1", rows=3)
    try:
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signum, err[-2000:]
    summary = json.loads(out)
    name = signal.Signals(signum).name
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == name, summary
    step = summary["global_step"]
    assert len(set(summary["param_sha256_per_rank"])) == 1
    assert f"{name}: the 2 ranks stop together at the end of this iteration" in err
    assert err.strip().splitlines()[-1] == (f"interrupted by {name} at step {step} (checkpoint written); continue "
                                            f"with --resume {run_dir}")
    assert list_checkpoints(os.path.join(run_dir, "checkpoints"))[-1].endswith(f"{step:012d}")
    assert int(_rows(os.path.join(run_dir, "metrics.csv"))[-1]["global_step"]) == step
    assert _processes_of(run_dir) == []


def test_the_launcher_stops_on_sighup_unless_nohup_ignores_it():
    """(The SIGHUP variant of the msrun test above runs with -m slow: its path is SIGINT's and SIGTERM's but for
    this choice.)"""
    from scalebox_ms.parallel.launcher import _stopping_signals

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert _stopping_signals() == [signal.SIGINT, signal.SIGTERM]
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        assert _stopping_signals() == [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    finally:
        signal.signal(signal.SIGHUP, previous)


@pytest.mark.integration
def test_a_signal_while_the_ranks_start_up_stops_the_job_at_once_and_leaves_no_run(tmp_path):
    """Before the ranks can stop by themselves (their step-0 checkpoint), SIGTERM stops the job at once: exit 143,
    and the fresh run directory, with nothing trained in it, is removed (it held only msrun/: `--resume` called it
    "not a run directory", and the same command refused it as not empty)."""
    run_dir = str(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "scalebox_ms.train", "--workers", "2", "--run-dir", run_dir,
                             *DP_ARGS], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stderr.readline().startswith("launching 2 msrun workers")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert err.strip().splitlines()[-1] == "interrupted" and out == ""
    assert not os.path.exists(run_dir)
    assert _processes_of(run_dir) == []


@pytest.mark.integration
def test_msrun_killed_ends_the_job_and_its_ranks(tmp_path):
    """msrun itself killed (kill -9, the OOM killer): its ranks trained on unsupervised and its log tail kept the
    launcher reading for ever (holding the run's lock). Now the launcher kills what msrun started and names it."""
    proc, run_dir = _start_job(tmp_path)
    try:
        msrun = next(int(p.split("/")[2]) for p in glob.glob("/proc/[0-9]*/stat")
                     if _ppid_and_name(p) == (proc.pid, "msrun"))
        os.kill(msrun, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for cmdline in _processes_of(run_dir, wait=0):  # (without the fix: the ranks and msrun's scheduler)
            with contextlib.suppress(OSError):
                os.kill(int(cmdline.split("/")[2]), signal.SIGKILL)
    assert proc.returncode == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: data-parallel job failed after ") and (
        f"msrun (pid {msrun}) was killed by SIGKILL; the launcher stopped its workers and scheduler" in last), last
    assert out == "" and _processes_of(run_dir) == []


def _ppid_and_name(stat_path):
    try:
        with open(stat_path) as f:
            text = f.read()
        with open(stat_path.replace("/stat", "/cmdline"), "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    ppid = int(text.rsplit(")", 1)[1].split()[1])
    return ppid, ("msrun" if any(a.endswith(b"/msrun") for a in argv[:2]) else "")


@pytest.mark.integration
def test_a_launcher_killed_outright_takes_its_job_down_and_frees_the_run(tmp_path):
    """SIGKILL (or the OOM killer) gives the launcher no chance to stop msrun, whose ranks run in sessions of their
    own: they used to train on with the run's lock released, so a second --resume was accepted beside them. Each
    rank watches the launcher's lock and stops the job once it is free; the run is left resumable."""
    from scalebox_ms.runlock import RunLock
    from scalebox_ms.trainers.checkpoint import list_checkpoints

    proc, run_dir = _start_job(tmp_path)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        assert _processes_of(run_dir, wait=30) == []
    finally:
        for cmdline in _processes_of(run_dir, wait=0):  # (without the fix: the ranks, msrun and its scheduler)
            try:
                os.kill(int(cmdline.split("/")[2]), signal.SIGKILL)
            except OSError:
                pass
    logs = "".join(open(p).read() for p in glob.glob(os.path.join(run_dir, "msrun", "worker_*.log")))
    assert f"the data-parallel launcher (pid {proc.pid}) is gone" in logs
    RunLock(run_dir).acquire().release()  # free for the --resume that continues the run
    assert list_checkpoints(os.path.join(run_dir, "checkpoints"))


@pytest.mark.parametrize("launcher", ["alive", "dead"])
def test_a_rank_stops_once_its_launcher_is_dead_even_if_the_lock_is_taken_again(tmp_path, launcher):
    """The watch must not rely on the lock being free: a `train --resume` restarted at once (a supervisor after an
    OOM kill) may hold it before the next poll. Here the lock is held (by this process), but the pid the launcher
    wrote into it is a dead one: the stand-in rank stops; with a live pid it keeps running."""
    from scalebox_ms.runlock import HELD_ENV, RunLock

    run_dir = str(tmp_path)
    lock = RunLock(run_dir).acquire()
    try:
        if launcher == "dead":
            gone = subprocess.Popen([sys.executable, "-c", "pass"])
            gone.wait()
            with open(lock.path, "w") as f:  # (the file's content only: the flock stays this process's)
                f.write(f"{gone.pid}\n")
        rank = subprocess.run([sys.executable, "-c", "import time; from scalebox_ms.runlock import watch_launcher; "
                               f"assert watch_launcher({run_dir!r}, interval=0.05); time.sleep(3); print('trained on')"],
                              env=dict(os.environ, **{HELD_ENV: run_dir, "PYTHONPATH": REPO}), capture_output=True,
                              text=True, timeout=60)
    finally:
        lock.release()
    if launcher == "dead":
        assert rank.returncode == -signal.SIGKILL and rank.stdout == "", rank.stderr[-2000:]
        assert f"the data-parallel launcher (pid {gone.pid}) is gone" in rank.stderr
    else:
        assert rank.returncode == 0 and rank.stdout.strip() == "trained on", rank.stderr[-2000:]


def test_stopping_the_job_leaves_no_process_of_its_own_sessions_behind(tmp_path):
    """Ctrl-C of ``--workers`` and a dead worker both go through ``_stop_job``: msrun gets its SIGINT, and children
    that outlive it (msrun starts each worker and its scheduler in a session of its own, where a signal to msrun's
    group does not reach) are killed; here a stand-in msrun that dies on SIGINT without stopping its children."""
    from scalebox_ms.parallel.launcher import _stop_job
    from scalebox_ms.parallel.ranks import alive

    fake_msrun = tmp_path / "fake_msrun.py"
    fake_msrun.write_text(textwrap.dedent("""
        import subprocess, sys, time
        kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
                for _ in range(2)]
        print(" ".join(str(k.pid) for k in kids), flush=True)
        time.sleep(120)
    """))
    proc = subprocess.Popen([sys.executable, str(fake_msrun)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    kids = [int(p) for p in proc.stdout.readline().split()]
    assert len(kids) == 2 and all(alive(k) for k in kids)
    _stop_job(proc, grace=5.0)
    assert proc.poll() is not None
    deadline = time.time() + 10
    while any(alive(k) for k in kids) and time.time() < deadline:
        time.sleep(0.1)  # (orphans are reaped by init)
    assert not any(alive(k) for k in kids)


def test_a_second_stop_waits_until_the_first_has_stopped_the_job(tmp_path):
    """Ctrl-C while the watcher thread is already stopping the job (a dead or hung worker): the main thread's
    ``_stop_job`` must not return (and let the launcher exit) while msrun still runs; here a stand-in msrun that
    ignores SIGINT, so only the first stop's SIGKILL after its grace ends it."""
    from scalebox_ms.parallel.launcher import _stop_job
    from scalebox_ms.parallel.ranks import alive

    proc = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGINT, "
                             "signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    first = threading.Thread(target=_stop_job, args=(proc,), kwargs={"grace": 3.0})
    first.start()
    time.sleep(0.5)  # the first stop is inside its grace period
    _stop_job(proc, grace=3.0)
    assert not alive(proc.pid) and proc.poll() is not None
    first.join(10)
    assert not first.is_alive()


def test_dead_workers_are_gone_pids_without_their_exit_marker(tmp_path):
    from scalebox_ms.parallel.ranks import dead_workers

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # (reaped: the pid no longer exists)
    (tmp_path / "rank_0.pid").write_text(str(os.getpid()))  # alive
    assert dead_workers(str(tmp_path)) == []
    (tmp_path / "rank_11.pid").write_text(str(gone.pid))
    assert dead_workers(str(tmp_path)) == [gone.pid]
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while os.path.exists(f"/proc/{zombie.pid}/stat") and time.time() < deadline:
        with open(f"/proc/{zombie.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break  # exited, not reaped yet: a zombie counts as gone
        time.sleep(0.05)
    (tmp_path / "rank_2.pid").write_text(str(zombie.pid))
    assert dead_workers(str(tmp_path)) == [zombie.pid, gone.pid]  # rank order (2 before 11)
    (tmp_path / "rank_11.exit").write_text("")  # it exited through Python: msrun reports it as before
    assert dead_workers(str(tmp_path)) == [zombie.pid]
    zombie.wait()


def test_a_new_launch_clears_the_previous_ones_markers(tmp_path):
    """A resumed run's previous job left ``rank_<r>.stoppable``: the new ranks looked stoppable (signals forwarded)
    as soon as they wrote their pids, before their stoppers were installed."""
    from scalebox_ms.parallel.launcher import _clear_previous_launch
    from scalebox_ms.parallel.ranks import stoppable_ranks

    for rank in (0, 1):
        for marker in ("pid", "exit", "beat", "stoppable"):
            (tmp_path / f"rank_{rank}.{marker}").write_text(str(os.getpid()))
    (tmp_path / "scheduler.port_taken").write_text("")
    _clear_previous_launch(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == []
    for rank in (0, 1):  # the new job's ranks, running, not yet stoppable
        (tmp_path / f"rank_{rank}.pid").write_text(str(os.getpid()))
        (tmp_path / f"rank_{rank}.alive").write_text("")
    assert stoppable_ranks(str(tmp_path), 2) is None


def test_the_scheduler_reports_its_port_taken_only_when_it_is_held(tmp_path):
    """(checked before MindSpore's init binds it: held then, it is another process's)"""
    import socket

    from scalebox_ms.parallel.ranks import LOG_DIR_ENV, report_port_taken

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = {LOG_DIR_ENV: str(tmp_path), "MS_SCHED_HOST": "127.0.0.1", "MS_SCHED_PORT": str(port)}
        assert report_port_taken({**env, LOG_DIR_ENV: ""}) is False  # (not under the launcher: nothing to tell)
        assert report_port_taken(env) is True and (tmp_path / "scheduler.port_taken").exists()
    (tmp_path / "scheduler.port_taken").unlink()
    assert report_port_taken(env) is False and not (tmp_path / "scheduler.port_taken").exists()  # (free now)


@pytest.mark.integration
def test_a_scheduler_failing_for_another_reason_does_not_report_its_port_taken(tmp_path):
    """Checked after a failed init, the port was held by MindSpore's own server: a cluster that timed out (no worker
    joined) was relaunched 3 times as 'port taken', and the workers' own errors were lost."""
    from scalebox_ms.parallel.launcher import free_port
    from scalebox_ms.parallel.ranks import LOG_DIR_ENV

    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), "MS_ROLE": "MS_SCHED",
           "MS_SCHED_HOST": "127.0.0.1", "MS_SCHED_PORT": str(free_port()), "MS_WORKER_NUM": "1",
           "MS_TOPO_TIMEOUT": "5", LOG_DIR_ENV: str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "scalebox_ms.train"], cwd=str(tmp_path), env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "Failed to initialize" in r.stderr, r.stderr[-2000:]  # (MindSpore's own error)
    assert not (tmp_path / "scheduler.port_taken").exists()


@pytest.mark.integration
def test_a_scheduler_port_taken_before_msrun_binds_it_launches_again_on_another(tmp_path):
    """Another process took the port between free_port() and msrun's scheduler: the workers waited out
    parallel.timeout (300 s) for the scheduler, then the job failed with ~70 lines of tracebacks."""
    script = textwrap.dedent(f"""
        import socket, sys
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        held.listen()
        import scalebox_ms.parallel.launcher as launcher
        free_port, first = launcher.free_port, [held.getsockname()[1]]
        launcher.free_port = lambda: first.pop() if first else free_port()
        from scalebox_ms import train
        sys.exit(train.main(["--workers", "2", "--total-steps", "128", "--run-dir", {str(tmp_path / "run")!r},
                             "--set", "parallel.timeout=90", *{DP_ARGS!r}]))
    """)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stderr.splitlines()
    assert lines[0].startswith("launching 2 msrun workers") and "was taken by another process" in lines[1], lines
    assert lines[2].startswith("launching 2 msrun workers") and "Traceback" not in r.stderr, lines
    assert json.loads(r.stdout)["status"] == "completed"  # (without the relaunch: rc 1 after parallel.timeout)


@pytest.mark.integration
def test_a_users_own_msrun_line_is_detected(tmp_path):
    """msrun started by the user (no --workers): every process detects its role, the world size is taken from msrun
    and recorded in the run's config, rank 0 writes the run."""
    from scalebox_ms.parallel.launcher import free_port, msrun_env, msrun_executable

    run_dir = tmp_path / "run"
    env = msrun_env(os.environ)  # (1 s heartbeats, as the docs suggest for a user's own local msrun line)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([msrun_executable(), "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
                        f"--master_port={free_port()}", "--join=True", f"--log_dir={tmp_path / 'logs'}",
                        "python", "-m", "scalebox_ms.train", "--total-steps", "256", "--run-dir", str(run_dir),
                        *DP_ARGS], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-2000:]
    with open(run_dir / "summary.json") as f:
        summary = json.load(f)
    assert summary["world_size"] == 2 and len(set(summary["param_sha256_per_rank"])) == 1
    assert "workers: 2" in (run_dir / "config.yaml").read_text()


def test_each_rank_gets_its_own_device_id():
    from scalebox_ms.parallel.context import local_rank

    assert local_rank({"RANK_ID": "3"}) == 3
    assert local_rank({"RANK_ID": "5", "LOCAL_RANK": "1"}) == 1
    assert local_rank({}) == 0
    assert local_rank({"RANK_ID": "9", "DEVICE_ID": "1"}) == 1  # msrun's local rank on a multi-node job
    assert local_rank({"LOCAL_RANK": "x", "RANK_ID": "2"}) == 2  # garbage is skipped, not a crash


def test_rank_id_outside_msrun_does_not_skip_the_run_dir_check(tmp_path, monkeypatch):
    """RANK_ID is often exported by Ascend setup scripts; outside msrun it must not let a run write into an
    existing run directory."""
    from scalebox_ms.trainers.run import train_run

    monkeypatch.setenv("RANK_ID", "1")
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        train_run(small_config(), run_dir=str(tmp_path), progress=False, log=lambda s: None)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_msrun_env_shortens_the_heartbeat_unless_the_user_sets_it():
    """Each rank's exit waited out MindSpore's heartbeat sleep (3-5 s by default); the launcher asks for 1 s
    heartbeats, puts this interpreter first on PATH, and leaves values the user set alone."""
    from scalebox_ms.parallel.launcher import msrun_env

    env = msrun_env({"PATH": "/usr/bin"})
    assert env["MS_RETRY_INTERVAL_LOWER"] == env["MS_RETRY_INTERVAL_UPPER"] == "1" and env["GLOG_v"] == "3"
    assert env["PATH"].split(os.pathsep) == [os.path.dirname(sys.executable), "/usr/bin"]
    mine = msrun_env({"PATH": "/usr/bin", "MS_RETRY_INTERVAL_LOWER": "5", "GLOG_v": "1"})
    assert mine["MS_RETRY_INTERVAL_LOWER"] == "5" and "MS_RETRY_INTERVAL_UPPER" not in mine and mine["GLOG_v"] == "1"
    assert msrun_env({"PATH": "/usr/bin", "MS_RETRY_INTERVAL_LOWER": ""})["MS_RETRY_INTERVAL_LOWER"] == "1"


MSRUN_GAVE_UP = """\
[ERROR] ME(12227:139989717973888,MainProcess):2026-12-07-00:15:35.811.000 [mindspore/parallel/cluster/process_entity/_api.py:365] Worker process 12234 exit with exception. Error code: -11.
Traceback (most recent call last):
  File "/venv/bin/msrun", line 6, in <module>
    sys.exit(main())
             ^^^^^^
  File "/venv/lib/python3.11/site-packages/mindspore/parallel/cluster/process_entity/_api.py", line 389, in join_processes
    raise RuntimeError("Distributed job exited with exception. Please check logs in "
RuntimeError: Distributed job exited with exception. Please check logs in directory: /tmp/run/msrun.
"""


def test_the_console_hides_msruns_own_traceback_but_shows_a_workers(tmp_path):
    """msrun's traceback when it gives up on a job reached the console ahead of the launcher's one-line error (seen
    when a rank crashed under load); a worker's own traceback (a bug in user code) must still be shown whole."""
    from scalebox_ms.parallel.msrun_output import Console as _Console

    def shown(text):
        console = _Console(str(tmp_path / "launcher.log"))
        out = [s for line in text.splitlines(keepends=True) for s in console.shown(line)] + console.shown(None)
        console.close()
        return out

    assert shown("resumed run at step 1024\n" + MSRUN_GAVE_UP) == ["resumed run at step 1024\n"]
    assert "RuntimeError: Distributed job" in (tmp_path / "launcher.log").read_text()  # kept in the log
    worker = 'Traceback (most recent call last):\n  File "my_env.py", line 3, in step\n    1 / 0\n' \
             'ZeroDivisionError: division by zero\n'
    assert shown(worker + "next line\n") == worker.splitlines(keepends=True) + ["next line\n"]
    assert shown(worker[:-36]) == worker[:-36].splitlines(keepends=True)  # output ended inside a traceback
    crash = ('Fatal Python error: Segmentation fault\n\nThread 0x00007f124b7fe6c0 (most recent call first):\n'
             '  File "/x/runlock.py", line 161 in _running\n\nCurrent thread 0x00007f128fa72b80 (most recent call '
             'first):\n  File "/x/site.py", line 3 in <lambda>\n\nThread 0x00007f1 (most recent call first):\n'
             '  <no Python frame>\n\nExtension modules: yaml._yaml, numpy.core (total: 2)\n')
    assert shown("step 256\n" + crash + "after\n") == ["step 256\n", "after\n"]  # (faulthandler's: in the log)


@pytest.mark.parametrize("code, words", [(-11, "was killed by SIGSEGV"), (-9, "was killed by SIGKILL"),
                                         (1, "exited with code 1"), (None, "exited abnormally")])
def test_a_dead_workers_error_code_is_named(code, words):
    from scalebox_ms.parallel.msrun_output import how_it_ended as _how_it_ended

    assert _how_it_ended(code) == words


def test_a_crash_counts_as_after_the_run_only_past_python_exit_and_with_this_jobs_final_summary(tmp_path):
    from scalebox_ms.parallel.launcher import _crash_after_the_run

    log_dir = tmp_path / "msrun"
    log_dir.mkdir()
    (log_dir / "rank_0.pid").write_text("4242")
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"status": "completed"}))
    launched = time.time() - 5
    assert _crash_after_the_run(str(tmp_path), launched, 4242) is None  # died before its Python exit
    (log_dir / "rank_0.exit").write_text("")
    assert _crash_after_the_run(str(tmp_path), launched, 4242) == "completed"
    assert _crash_after_the_run(str(tmp_path), launched, 4343) is None  # not a rank's pid
    assert _crash_after_the_run(str(tmp_path), time.time() + 5, 4242) is None  # a previous launch's summary
    for status, expected in (("paused", "paused"), ("solved", "solved"), ("interrupted", None)):
        summary.write_text(json.dumps({"status": status}))
        assert _crash_after_the_run(str(tmp_path), launched, 4242) == expected
    summary.write_text("{")
    assert _crash_after_the_run(str(tmp_path), launched, 4242) is None


@pytest.mark.integration
@pytest.mark.parametrize("rank", [pytest.param(0, marks=pytest.mark.slow), 1])  # (rank 1: it waits for rank 0)
def test_a_rank_dying_in_mindspores_shutdown_after_the_run_ended_is_no_failure(tmp_path, monkeypatch, rank):
    """Seen in CI on a busy machine: a rank died of SIGSEGV in MindSpore's shutdown (after Python's exit handlers)
    at the end of a completed run; msrun reported the job failed and the launcher exited 1, though rank 0 had written
    the summary and nothing was missing. A SIGSEGV in the rank's last exit handler (after MindSpore's, which end the
    cluster, but not reliably after rank 0's summary: rank 1 waits for it, else msrun stopped rank 0 first, as once
    in CI) stands in for MindSpore's crash; rank 0 evaluates 3 episodes after training (and here takes 3 s more for
    its learning curve), rank 1 does not."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        import atexit, builtins, os, signal, time
        rank = os.environ.get("RANK_ID") if os.environ.get("MS_ROLE") == "MS_WORKER" else None
        if rank == "{rank}":
            atexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV))  # (registered first: runs last)
        if rank == "0":  # slow between training and its summary (the learning curve): rank 1 must wait for it
            _open = builtins.open
            def slow_open(file, *args, **kwargs):
                if "learning_curve" in str(file):
                    time.sleep(3)
                return _open(file, *args, **kwargs)
            builtins.open = slow_open
        """))
    monkeypatch.setenv("PYTHONPATH", str(site))
    run_dir = tmp_path / "run"
    r = run_module("train", "--workers", "2", "--total-steps", "256", "--run-dir", run_dir, *DP_ARGS,
                   "--set", "run.eval_episodes=3", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary["status"] == "completed" and summary["eval_episodes"] == 3
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith(f"warning: rank {rank} (pid ") and \
        "was killed by SIGSEGV in MindSpore's shutdown, after the run had ended (completed;" in lines[-1], lines
    assert "Traceback" not in r.stderr and "error" not in r.stderr
    # the rank's Python stack at the crash is in its log (faulthandler)
    assert "Fatal Python error: Segmentation fault" in (run_dir / "msrun" / f"worker_{rank}.log").read_text()
    assert _processes_of(str(run_dir)) == []  # msrun's scheduler and the other rank are gone too


def test_the_launchers_last_line_does_not_join_a_ranks_progress_bar(tmp_path, monkeypatch):
    """A rank's progress bar ends in a carriage return, not a newline: the launcher's error line was printed on
    the bar's line ("... 16.8]error: data-parallel job failed ...")."""
    import io

    from scalebox_ms.parallel import launcher

    fake = tmp_path / "msrun"
    fake.write_text("#!/bin/sh\nprintf '100%%|##########| 512/512 [00:03<00:00, 16.8]'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(launcher, "msrun_executable", lambda: str(fake))
    stream = io.StringIO()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    launcher.launch(["--no-progress"], 2, str(run_dir), 30.0, stream=stream)
    assert stream.getvalue().endswith("16.8]\n"), repr(stream.getvalue()[-80:])


def test_the_launcher_sends_a_signal_on_only_once_every_rank_can_stop_by_itself(tmp_path):
    """The first signal goes to the ranks when each of them runs and has its stopper installed; with a rank still
    starting up (no ``rank_<r>.stoppable``), gone through its exit, or missing, and on a second signal, the launcher
    stops the job at once (Interrupted)."""
    import io

    from scalebox_ms.errors import Interrupted
    from scalebox_ms.parallel.launcher import _Signals

    ranks = [subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, "
                               "lambda s, f: (print('got', s, flush=True), sys.exit(0))); print('ready', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        assert all(r.stdout.readline().strip() == "ready" for r in ranks)
        for rank, r in enumerate(ranks):
            (tmp_path / f"rank_{rank}.pid").write_text(str(r.pid))
        (tmp_path / "rank_0.stoppable").write_text("")
        stream = io.StringIO()
        with pytest.raises(Interrupted):  # rank 1 still starts up
            _Signals(str(tmp_path), 2, stream)(signal.SIGTERM, None)
        (tmp_path / "rank_1.stoppable").write_text("")
        with pytest.raises(Interrupted):  # a job of 3 ranks: rank 2 has not written its pid yet
            _Signals(str(tmp_path), 3, stream)(signal.SIGTERM, None)
        (tmp_path / "rank_1.exit").write_text("")
        with pytest.raises(Interrupted):  # rank 1 is leaving
            _Signals(str(tmp_path), 2, stream)(signal.SIGTERM, None)
        (tmp_path / "rank_1.exit").unlink()
        assert all(r.poll() is None for r in ranks) and stream.getvalue() == ""
        signals = _Signals(str(tmp_path), 2, stream)
        signals(signal.SIGTERM, None)  # sent on, no exception
        assert [r.stdout.readline().split() for r in ranks] == [["got", str(int(signal.SIGTERM))]] * 2
        assert "SIGTERM: the 2 ranks stop together at the end of this iteration" in stream.getvalue()
        with pytest.raises(Interrupted):  # a second signal: at once
            signals(signal.SIGINT, None)
    finally:
        for r in ranks:
            r.kill()
            r.wait()


class _Ranks:
    """A stand-in DistContext of 2 ranks whose all-gather returns the rows given (this rank's own row replaced)."""
    distributed, world_size, rank = True, 2, 0

    def __init__(self, other):
        self.other, self.sent = other, []

    def all_gather(self, vec):
        self.sent.append(float(vec[0]))
        return np.array([[vec[0]], [self.other]], np.float32)


def test_ranks_stop_together_on_the_signal_any_of_them_got():
    """StopOnSignal with several ranks: all stop at the iteration end where any rank had a signal, signum set to
    it, decided from the gathered values only; a rank's own (forwarded) signal that comes after another rank's is not
    a second signal (it used to abort the run at once)."""
    from scalebox_ms.errors import Interrupted
    from scalebox_ms.trainers import StopOnSignal

    stop = StopOnSignal(log=lambda line: None, dist=_Ranks(other=0))
    assert stop.on_iteration_end(None, {}) is None and stop.signum is None
    stop.dist.other = float(signal.SIGTERM)  # rank 1 got SIGTERM
    assert stop.on_iteration_end(None, {}) is False and stop.signum == signal.SIGTERM
    stop._handle(signal.SIGTERM, None)  # this rank's own copy arrives later: no abort
    with pytest.raises(Interrupted):
        stop._handle(signal.SIGTERM, None)  # a second one to this rank: abort
    late = StopOnSignal(log=lambda line: None, dist=_Ranks(other=0))

    class SignalDuringTheGather(_Ranks):
        def all_gather(self, vec):
            rows = super().all_gather(vec)
            if len(self.sent) == 1:
                late._handle(signal.SIGINT, None)  # (this rank contributed 0: the others go on this iteration)
            return rows

    late.dist = SignalDuringTheGather(other=0)
    assert late.on_iteration_end(None, {}) is None  # not alone, one iteration early
    assert late.on_iteration_end(None, {}) is False and late.dist.sent == [0.0, float(signal.SIGINT)]


def test_a_failed_fresh_launch_removes_its_run_directory_only_if_nothing_was_trained(tmp_path):
    from scalebox_ms.train import _remove_if_untrained

    run = tmp_path / "run"
    for step_zero_too in (False, True):
        (run / "msrun").mkdir(parents=True)
        _remove_if_untrained(str(run), step_zero_too)
        assert not run.exists()  # only msrun's logs
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "ckpt_000000000000.json").write_text("{}")
    _remove_if_untrained(str(run), step_zero_too=False)
    assert run.exists()  # a crash or hang: its error names the logs in it, --resume starts from step 0
    _remove_if_untrained(str(run), step_zero_too=True)
    assert not run.exists()  # a rank refused its config after rank 0's step-0 checkpoint
    (run / "checkpoints").mkdir(parents=True)
    for step in (0, 512):
        (run / "checkpoints" / f"ckpt_{step:012d}.json").write_text("{}")
    _remove_if_untrained(str(run), step_zero_too=True)
    assert (run / "checkpoints" / "ckpt_000000000512.json").exists()  # trained: kept for --resume
    (run / "checkpoints" / "ckpt_000000000512.json").unlink()
    (run / "metrics.csv").write_text("iteration,global_step\n1,256\n")
    _remove_if_untrained(str(run), step_zero_too=True)  # an env raised on a rank after an iteration: 2, as a refusal
    assert (run / "metrics.csv").exists()  # trained (it was removed, metrics and logs with it): kept for --resume
    (run / "metrics.csv").write_text("iteration,global_step\n")
    _remove_if_untrained(str(run), step_zero_too=True)
    assert not run.exists()  # the header only: nothing trained
