"""A training run on disk: run directory, metrics.csv, checkpoints, learning curve, summary.json.

``train_run`` is what ``python -m scalebox_ms.train`` calls; library users can call it too. A run directory:

    config.yaml          resolved config
    metrics.csv          one row per iteration (see METRIC_COLUMNS)
    checkpoints/         ckpt_<step>.{ckpt,json,env.pkl}; discarded/: those a resume from an earlier one abandoned
    learning_curve.png   episode return vs env steps
    summary.json         final numbers (written when the run pauses, completes or is interrupted)
    train.lock           while a process trains the run: its pid (see scalebox_ms.runlock)

Everything that can fail on bad input (config, env id, spaces, checkpoint) is checked before the directory is
created, so a bad invocation leaves nothing behind.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import time
from typing import List, Optional

from ..config import Config
from ..errors import CheckpointError, ConfigError
from ..fileio import atomic_write_json, atomic_write_text
from .callbacks import EvalCallback, ProgressBeat, eval_seed
from .checkpoint import checkpoint_prefix, list_checkpoints, prune_checkpoints, read_sidecar
from .lifecycle import (StopOnSignal, check_config_unchanged, check_path_length, discard_newer, environment_record,
                        failed_summary, read_metrics, record_session, remove_stale_temporaries, select_checkpoint,
                        truncate_metrics)
from .core import Callback
from .progress import ProfileIterations, ProgressBar
from .metrics_file import (METRIC_COLUMNS, OFF_POLICY_COLUMNS, TIMING_COLUMNS, MetricsWriter,  # noqa: F401
                           plot_learning_curve)


def peak_rss_mb() -> float:
    from ..sandbox import peak_rss_bytes

    return peak_rss_bytes() / 2.0 ** 20


class CheckpointSaver(Callback):
    def __init__(self, directory: str, every: int, keep: int):
        self.directory, self.every, self.keep = directory, every, keep
        self._next = None

    def on_training_start(self, trainer):
        if self.every > 0:
            self._next = (trainer.global_step // self.every + 1) * self.every

    def on_iteration_end(self, trainer, metrics):
        if self._next is not None and trainer.global_step >= self._next:
            self.save(trainer)
            self._next = (trainer.global_step // self.every + 1) * self.every

    def save(self, trainer):
        run_dir = os.path.dirname(os.path.abspath(self.directory))
        if not os.path.isfile(os.path.join(run_dir, "config.yaml")):  # (the writes below would re-create it)
            raise CheckpointError(f"run directory {run_dir}: its config.yaml is gone (the directory was deleted or "
                                  "moved while training); stopping without writing")
        trainer.save(checkpoint_prefix(self.directory, trainer.global_step))
        prune_checkpoints(self.directory, self.keep)


def _mean_or_nan(values) -> float:
    import numpy as np

    return float(np.mean(values)) if len(values) else float("nan")  # (as the iteration metrics compute it)


def _check_world_size(prefix: str, world_size: int) -> None:
    saved = read_sidecar(prefix)["world_size"]
    if saved != world_size:
        raise CheckpointError(f"checkpoint {os.path.basename(prefix)} was written by a {saved}-rank run; this run has "
                              f"{world_size} rank(s): resume with the same parallel.workers")


def _gather_hex(trainer, digest_hex: str) -> List[str]:
    """Every rank's SHA-256 digest (rank order), gathered on every rank (a collective: all ranks call it)."""
    import numpy as np

    rows = trainer.dist.all_gather(np.frombuffer(bytes.fromhex(digest_hex), np.uint8).astype(np.float32))
    return [bytes(r.astype(np.uint8).tolist()).hex() for r in rows]


def _rank_hashes(trainer) -> dict:
    """param_sha256_per_rank, and statistics_sha256_per_rank with obs/reward normalisation: equal hashes = ranks
    in lockstep (identical parameters; identically merged running statistics)."""
    import hashlib
    import json

    out = {"param_sha256_per_rank": _gather_hex(trainer, trainer.parameters_sha256())}
    norms = [n.rms.state_dict() for n in (trainer.obs_normalizer, trainer.reward_scaler) if n is not None]
    if norms:
        digest = hashlib.sha256(json.dumps(norms, sort_keys=True).encode()).hexdigest()
        out["statistics_sha256_per_rank"] = _gather_hex(trainer, digest)
    return out


def _follow(trainer, until: Optional[int], stopper: StopOnSignal):
    """Ranks > 0: train in lockstep with rank 0 (same collectives: the ``run.eval_every`` evaluations, then the
    stopper's, in rank 0's order), write nothing, return no summary, once rank 0 has written its own. A resumed run
    that stopped solved trains on nowhere (rank 0 skips ``learn`` too: a lone rank's update AllReduce met rank 0's
    hash all-gather and failed)."""
    from ..parallel.ranks import wait_for_rank_zero

    cfg = trainer.config
    if _solved_at_checkpoint(trainer, cfg) is None:
        evals = [EvalCallback.from_config(cfg, trainer.log.info)] if cfg.run.eval_every > 0 else []
        trainer.learn(until=until, callbacks=evals + [stopper, ProgressBeat()])
    _rank_hashes(trainer)
    wait_for_rank_zero()  # (a crash in this rank's shutdown must not cut rank 0's summary short)
    return None


def default_run_dir(cfg: Config) -> str:
    """``runs/<env id>_seed<N>_<time>_<pid>``, the env id's path and module separators as dashes
    (``ALE/Breakout-v5``: ``runs/ALE-Breakout-v5_...``, not a nested ``runs/ALE/``; ``my_envs:Corridor-v0`` without a
    colon). The process id keeps a sweep's runs started in the same second apart (one of them was refused, the
    directory in use)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", cfg.env.id).strip(".-") or "env"
    return os.path.join("runs", f"{name}_seed{cfg.run.seed}_{time.strftime('%Y%m%d-%H%M%S')}_{os.getpid()}")


def train_run(cfg: Optional[Config] = None, run_dir: Optional[str] = None, resume: Optional[str] = None,
              until: Optional[int] = None, progress: Optional[bool] = None, log=print, profile: int = 0,
              checkpoint: Optional[str] = None, exiting: bool = False) -> dict:
    """Train a new run in ``run_dir`` or continue ``resume``; returns the summary dict.

    ``resume`` continues from the latest checkpoint, or from ``checkpoint`` (one of the run's own; later ones are
    moved to ``checkpoints/discarded/``); a run without any checkpoint starts again from step 0 with its own
    config. The run directory is locked (:mod:`scalebox_ms.runlock`) while this runs. SIGINT/SIGTERM stop at the
    next iteration boundary with a checkpoint and ``"status": "interrupted"``; a second one aborts at once.
    ``profile=N`` records N iterations (after the first) with MindSpore's profiler into ``<run_dir>/profile``.
    ``exiting``: the process exits when this returns (the CLI): SIGINT/SIGTERM/SIGHUP are then left ignored, not
    restored (a scheduler's SIGTERM after the summary must not make a completed run look killed).
    """
    from ..parallel.context import in_msrun
    from ..runlock import RunLock, held_by_launcher, in_use

    if profile < 0:
        raise ConfigError(f"--profile: must be >= 0, got {profile}")
    if checkpoint is not None and resume is None:
        raise ConfigError("--checkpoint: only with --resume (it names the checkpoint to continue from)")
    distributed = in_msrun()  # one of several msrun ranks: rank 0 alone writes the run directory
    # under msrun rank 0 checks and locks (the others may already see its files); outside msrun RANK_ID means nothing
    first_rank = not distributed or os.environ.get("RANK_ID", "0") == "0"
    lock = None
    prefix = None
    if resume is not None:
        run_dir = resume
        cfg_path = os.path.join(run_dir, "config.yaml")
        if not os.path.isdir(run_dir) or not os.path.exists(cfg_path):
            raise CheckpointError(f"--resume {run_dir}: not a run directory (no config.yaml)")
        check_path_length(run_dir, "--resume")
        if first_rank and not held_by_launcher(run_dir):
            lock = RunLock(run_dir).acquire()
    try:
        if resume is not None:
            from ..config import load_config

            cfg = load_config(cfg_path)
            prefix = select_checkpoint(run_dir, checkpoint, check_replay=bool(cfg.run.save_replay))
            if prefix is not None:
                check_config_unchanged(run_dir, prefix, read_sidecar(prefix)["config"], cfg.to_dict())
            elif first_rank:
                log(f"--resume {run_dir}: no checkpoint yet; starting the run from step 0 with its config.yaml")
        else:
            cfg = cfg if cfg is not None else Config()
            run_dir = run_dir or default_run_dir(cfg)
            if os.path.exists(run_dir) and not os.path.isdir(run_dir):  # (was "already exists and is not empty")
                raise ConfigError(f"--run-dir {run_dir}: is a file, not a directory")
            check_path_length(run_dir, "--run-dir")
            if first_rank and in_use(run_dir):
                raise ConfigError(f"--run-dir {run_dir}: already exists and is not empty (use --resume to continue it)")
        return _train(cfg, run_dir, prefix, resume is not None, until, progress, log, profile, distributed, lock,
                      exiting)
    finally:
        if lock is not None:
            lock.release()


def _train(cfg, run_dir, prefix, resuming, until, progress, log, profile, distributed, lock, exiting):
    from ..runlock import RunLock, held_by_launcher, in_use

    created = not os.path.exists(run_dir)
    from . import make_trainer

    trainer = make_trainer(cfg)  # validates env id and spaces before anything is written
    # (data parallel: the ranks stop together, at the launcher's signal sent on to each; its own line says so)
    stopper = StopOnSignal(log if not distributed else lambda line: None, after=" (checkpoint + summary)",
                           dist=trainer.dist)
    try:
        cfg = trainer.config  # (under a user's msrun line: parallel.workers = the detected world size)
        from .evaluation import check_evaluation_env

        check_evaluation_env(trainer)
        if distributed:
            from ..parallel.ranks import write_rank_pid
            from ..runlock import watch_launcher

            write_rank_pid(run_dir, trainer.dist.rank)
            watch_launcher(run_dir)  # (a launcher killed outright: stop, do not train on without the run's lock)
        if prefix is not None:
            _check_world_size(prefix, trainer.world_size)
            trainer.load(prefix)
            # refused before the resume changes anything (it was after discard_newer or a whole iteration)
            trainer.sandbox.check_memory()  # (a limit below what the process uses already)
            if trainer.dist.is_main:
                metrics = read_metrics(os.path.join(run_dir, "metrics.csv"))  # (a damaged file)
                remove_stale_temporaries(run_dir, log)
                discard_newer(run_dir, trainer.global_step, log)
                truncate_metrics(os.path.join(run_dir, "metrics.csv"), trainer.global_step, metrics)
                record_session(run_dir, cfg, trainer, log)
                log(f"resumed {run_dir} at step {trainer.global_step} from {os.path.basename(prefix)}")
                if trainer.global_step >= cfg.run.total_steps:
                    log(f"the run is complete (run.total_steps {cfg.run.total_steps}): nothing to train; to train "
                        f"on, raise run.total_steps in {os.path.join(run_dir, 'config.yaml')}")
                elif until is not None and until <= trainer.global_step:
                    log(f"--until {until}: the run is already at step {trainer.global_step}: nothing to train")
        else:
            # the envs' first (seeded) reset, without training: an env whose first observations do not fit its
            # spaces fails here, before the run directory is written
            trainer.learn(until=0)
            trainer.sandbox.check_memory()  # (a limit below what the process uses already: before anything is written)
            if trainer.dist.is_main:  # data parallel: the run directory is rank 0's to write
                try:
                    os.makedirs(run_dir, exist_ok=True)
                    if lock is None and not resuming and not held_by_launcher(run_dir):
                        lock = RunLock(run_dir).acquire()
                        if in_use(run_dir):  # another process filled it between our first look and the lock
                            raise ConfigError(f"--run-dir {run_dir}: already exists and is not empty (use --resume "
                                              "to continue it)")
                    remove_stale_temporaries(run_dir)  # (of a process killed before it wrote config.yaml)
                    # config.yaml first: from then on --resume can restart the run (from step 0 until ckpt_0)
                    atomic_write_text(os.path.join(run_dir, "config.yaml"), cfg.to_yaml())
                    truncate_metrics(os.path.join(run_dir, "metrics.csv"), 0)
                    atomic_write_json(os.path.join(run_dir, "environment.json"), environment_record(cfg, trainer))
                    os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
                except OSError as exc:
                    if created:
                        shutil.rmtree(run_dir, ignore_errors=True)
                    raise ConfigError(f"--run-dir {run_dir}: cannot write ({exc.strerror})") from None
            if trainer.dist.is_main:
                trainer.save(checkpoint_prefix(os.path.join(run_dir, "checkpoints"), 0))  # resumable from here on
                log(f"run directory: {run_dir} (device {trainer.sandbox.device}"
                    + (f", {trainer.world_size} data-parallel ranks over {trainer.dist.backend})"
                       if distributed else ")"))
        stopper.install()
        if distributed:
            from ..parallel.ranks import mark_stoppable

            mark_stoppable()  # (the launcher now sends its signals on to the ranks)
        if not trainer.dist.is_main:
            return _follow(trainer, until, stopper)
        return _learn_and_summarise(trainer, cfg, run_dir, until, progress, log, profile, stopper)
    finally:  # (a signal while the envs close is held by the stopper: the run's files are final already)
        with contextlib.ExitStack() as after_close:  # (run last to first, whatever raises)
            after_close.callback(stopper.restore, ignore=exiting)
            if lock is not None:  # (a resume's lock: train_run's, released here before the signals go)
                after_close.callback(lock.release)
            trainer.close()


def _solved_at_checkpoint(trainer, cfg) -> Optional[dict]:
    """The evaluation at the loaded checkpoint's step that reached ``run.stop_return`` (the run stopped there,
    solved), or None."""
    last = trainer.evaluations[-1] if trainer.evaluations else None
    if (cfg.run.stop_return is None or cfg.run.eval_every < 1 or last is None
            or last["step"] != trainer.global_step or last["mean"] < cfg.run.stop_return):
        return None
    return last


def _learn_and_summarise(trainer, cfg, run_dir, until, progress, log, profile, stopper) -> dict:
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    metrics_path = os.path.join(run_dir, "metrics.csv")
    writer = MetricsWriter(metrics_path, METRIC_COLUMNS if cfg.algo == "ppo" else OFF_POLICY_COLUMNS)
    saver = CheckpointSaver(ckpt_dir, cfg.run.checkpoint_every, cfg.run.keep_checkpoints)
    evals = [EvalCallback.from_config(cfg, log)] if cfg.run.eval_every > 0 else []
    # (evaluations before the saver: a checkpoint at an evaluation's step carries it, trainer.evaluations; with
    # collectives, evaluations before the stopper, as in _follow)
    callbacks: List[Callback] = [writer] + evals + [saver, stopper, ProgressBeat()]
    show = cfg.run.progress if progress is None else progress
    if show and trainer.global_step < min(cfg.run.total_steps, until or cfg.run.total_steps):  # (else nothing runs)
        callbacks.append(ProgressBar(cfg.run.total_steps, log))
    if profile > 0:
        callbacks.append(ProfileIterations(os.path.join(run_dir, "profile"), profile, log))
    solved_before = _solved_at_checkpoint(trainer, cfg)
    if solved_before is not None and evals:  # --resume of a solved run whose bar still stands: nothing to train
        evals[0].solved = solved_before
        log(f"the run was solved at step {trainer.global_step} (evaluation mean {solved_before['mean']:.2f} >= "
            f"run.stop_return {cfg.run.stop_return:g}); remove the bar from config.yaml to train on")
    try:
        # (a signal between iterations: stop right away; data parallel: the ranks decide together, in learn)
        if (stopper.signum is None or trainer.dist.distributed) and solved_before is None:
            trainer.learn(callbacks=callbacks, until=until)
    except Exception as exc:  # (a run stopped by an error: summary.json said the last session's 'paused', or
        failed_summary(cfg, run_dir, ckpt_dir, exc)  # nothing; signals are not Exceptions)
        raise
    finally:
        writer.close()
    own = list_checkpoints(ckpt_dir, own=True)
    if not own or not own[-1].endswith(f"{trainer.global_step:012d}"):
        saver.save(trainer)
    per_rank = _rank_hashes(trainer)
    plot_learning_curve(metrics_path, os.path.join(run_dir, "learning_curve.png"),
                        f"{cfg.algo.upper()} {cfg.env.id} (seed {cfg.run.seed})", log)
    completed = trainer.global_step >= cfg.run.total_steps
    solved = any(e.solved is not None for e in evals)
    m = trainer._last_metrics
    summary = {
        "status": ("interrupted" if stopper.signum is not None else "solved" if solved else "completed" if completed
                   else "paused"),
        "env_id": cfg.env.id,
        "seed": cfg.run.seed,
        "global_step": trainer.global_step,
        "total_steps": cfg.run.total_steps,
        "iterations": trainer.iteration,
        "wall_time_s": trainer.wall_time_s,
        "steps_per_second": trainer.global_step / trainer.wall_time_s if trainer.wall_time_s > 0 else float("nan"),
        # (no iteration in this session, e.g. --resume of a completed run: the checkpoint's last 100 episodes)
        "episode_return_mean": m.get("episode_return_mean", _mean_or_nan(trainer.collector.episode_returns)),
        "episodes": trainer.episodes,
        "peak_rss_mb": peak_rss_mb(),
        "param_sha256": trainer.parameters_sha256(),
        "world_size": trainer.world_size,
        **per_rank,
        "device": trainer.sandbox.device,
        "algo": cfg.algo,
        **trainer._summary_extra(),
    }
    if getattr(trainer.env, "events", None) is not None:
        summary["env_events"] = list(trainer.env.events)  # isolated workers restarted (crash/timeout/memory)
    if evals or trainer.evaluations:  # every session's, up to the step this one resumed from
        summary["evaluations"] = list(trainer.evaluations)
    if stopper.signum is not None:
        summary["interrupted_by"] = stopper.name
    elif (completed or solved) and cfg.run.eval_episodes > 0:
        import numpy as np

        from .evaluation import EvaluationError, EvaluationInterrupted, evaluate_policy

        if show:  # (Atari's 10 games took minutes without a word)
            log(f"evaluating {cfg.run.eval_episodes} episode(s) of {cfg.env.id} (seed {eval_seed(cfg)})")
        try:  # training and its checkpoint are complete: an evaluation that gives up is recorded, not fatal
            rets, eval_error = evaluate_policy(trainer, episodes=cfg.run.eval_episodes, seed=eval_seed(cfg),
                                               should_stop=lambda: stopper.signum is not None), None
        except EvaluationInterrupted:  # a signal during the evaluation: stop now, as during training
            rets = None
        except EvaluationError as exc:
            rets, eval_error = exc.returns, str(exc)
            log(f"warning: {eval_error}")
        except ConfigError as exc:  # its env cannot be built (checked at the start; the env may have changed)
            rets, eval_error = [], str(exc)
            log(f"warning: evaluation: {eval_error}")
    if stopper.signum is not None and "interrupted_by" not in summary:  # (it came during the evaluation)
        summary.update(status="interrupted", interrupted_by=stopper.name)
    elif stopper.signum is None and (completed or solved) and cfg.run.eval_episodes > 0:
        summary.update({"eval_mean_return": float(np.mean(rets)) if len(rets) else None,
                        "eval_std_return": float(np.std(rets)) if len(rets) else None,
                        "eval_episodes": len(rets), "eval_seed": eval_seed(cfg), "eval_replayed_episodes": getattr(rets, "replayed", 0),
                        "eval_env_events": list(getattr(rets, "env_events", [])), "eval_error": eval_error})
    summary = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}
    if getattr(trainer, "auto_batch", None) is not None:
        log("dynamic batching: " + ", ".join(f"{r['batch_size']}: {r['samples_per_s']:.0f} samples/s ({r['status']})"
                                             for r in trainer.auto_batch["table"]) + f" -> {trainer.batch_size}")
    atomic_write_json(os.path.join(run_dir, "summary.json"), summary)
    return {**summary, "run_dir": run_dir}
