"""``python -m scalebox_ms.train``: train PPO from a YAML config (CartPole-v1 by default).

Examples::

    python -m scalebox_ms.train                                   # CartPole-v1, rl-zoo3 settings
    python -m scalebox_ms.train --config configs/ppo_acrobot.yaml --seed 1
    python -m scalebox_ms.train --set ppo.n_epochs=10 --set env.num_envs=16 --run-dir runs/x
    python -m scalebox_ms.train --resume runs/x                   # continue a paused/interrupted run
    python -m scalebox_ms.train --resume runs/x --checkpoint runs/x/checkpoints/ckpt_000000010240.json

A run directory belongs to one train process at a time (``<run-dir>/train.lock`` holds its pid); a second one
exits 2 naming it. ``--resume`` continues from the latest checkpoint (a corrupt one is refused, naming the newest
intact one, which ``--checkpoint`` selects; later checkpoints are then moved to ``checkpoints/discarded/`` and
metrics.csv is cut back to that step). A run killed before its first checkpoint starts again from step 0.
The run's config.yaml must still match the config its checkpoint was trained with; only ``run.total_steps`` (to
extend or shorten the run: the linear schedules follow the new horizon) and the bookkeeping keys
``run.progress``, ``run.checkpoint_every``, ``run.keep_checkpoints``, ``run.eval_episodes``, ``run.eval_every``,
``run.stop_return``, ``run.save_replay``, ``parallel.timeout``, ``parallel.hang_timeout``, ``sandbox.memory_limit``
may be edited. With ``run.eval_every`` and ``run.stop_return`` a run stops once an evaluation while training
reaches the bar (``"status": "solved"``).

Ctrl-C (SIGINT), SIGTERM or SIGHUP stops at the end of the current iteration with a checkpoint and summary.json
(``"status": "interrupted"``), exit code 130, 143 or 129; a second one aborts at once. Before the run's handlers
are in place (while it starts up) each stops train at once, as Ctrl-C does: ``interrupted``, the same exit codes.
With ``--workers`` the launcher sends the signal on to the ranks, which stop together at the end of an iteration,
the same way; while they still start up (before their step-0 checkpoint), or on a second signal, it stops the whole
msrun job at once (no summary; ``--resume`` continues from the latest checkpoint; a fresh run that trained nothing
leaves no directory).
"""
from __future__ import annotations

import json
import os
import signal
import sys

from .cli_common import (OneLineArgumentParser, SayHandler, import_held, import_mindspore, refuse_empty_checkpoint,
                         route_sigint_around_mindspore, run_cli, say, say_out, stop_at_once_on_termination)

DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "configs", "ppo_cartpole.yaml")


def build_parser():
    p = OneLineArgumentParser("train", description="Train PPO, DQN, SAC or TD3 with MindSpore.")
    p.add_argument("--config", metavar="FILE", help="YAML config, or a preset's name (default: the packaged "
                   "ppo_cartpole.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (YAML syntax; a mapping's entry as SECTION.KEY.NAME=VALUE), "
                   "repeatable")
    p.add_argument("--seed", type=int, metavar="N", help="shortcut for --set run.seed=N")
    p.add_argument("--total-steps", type=int, metavar="N",
                   help="shortcut for --set run.total_steps=N (also the schedules' horizon)")
    p.add_argument("--run-dir", metavar="DIR", help="where to write the run (default runs/<env>_seed<N>_<time>_<pid>)")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its latest checkpoint; its "
                   "config.yaml may only change run.total_steps (to extend the run) and bookkeeping keys")
    p.add_argument("--checkpoint", metavar="FILE",
                   help="with --resume: continue from this checkpoint of the run instead of the latest "
                        "(later ones move to checkpoints/discarded/, metrics.csv is cut back to its step)")
    p.add_argument("--until", type=int, metavar="STEPS",
                   help="pause (checkpoint + summary) once this many env steps are done; schedules unchanged")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="record N iterations with MindSpore's profiler into <run-dir>/profile")
    p.add_argument("--workers", type=int, metavar="N",
                   help="data-parallel workers launched with msrun (shortcut for --set parallel.workers=N)")
    return p


def main(argv=None) -> int:
    # (python -m; a --workers rank too: the launcher may send it Ctrl-C; msrun's scheduler is stopped by msrun)
    # route Ctrl-C before numpy/MindSpore start their threads
    if argv is None and os.environ.get("MS_ROLE") != "MS_SCHED":
        route_sigint_around_mindspore()
    if argv is None and "MS_ROLE" not in os.environ:  # (msrun's ranks: SIGTERM from msrun ends them as it did)
        stop_at_once_on_termination()  # until the run's own handlers: "interrupted", not a silent exit 143
    try:
        import_held("numpy")  # (parallel.context's first import below)
        from .parallel.context import is_msrun_scheduler, serve_as_scheduler
    except KeyboardInterrupt as exc:  # (SIGTERM/SIGHUP held as Ctrl-C is: 143/129)
        say("interrupted")
        return 128 + getattr(exc, "signum", signal.SIGINT)

    if is_msrun_scheduler():  # msrun runs this command line once more as its scheduler process
        serve_as_scheduler()
        return 0
    args = build_parser().parse_args(argv)

    def go():
        import logging

        handler = SayHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger = logging.getLogger("scalebox_ms")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        from .config import load_config
        from .errors import CheckpointError, ConfigError

        if args.resume and (args.config or args.overrides or args.seed is not None or args.total_steps is not None
                            or args.run_dir):
            raise ConfigError("--resume continues a run with its own config; "
                              "--config/--set/--seed/--total-steps/--run-dir cannot be combined with it (to train "
                              "longer or shorter, edit run.total_steps in the run's config.yaml)")
        refuse_empty_checkpoint(args.checkpoint)
        if args.checkpoint and not args.resume:
            raise ConfigError("--checkpoint: only with --resume DIR (it names the checkpoint to continue from)")
        if args.until is not None and args.until < 1:
            raise ConfigError(f"--until: must be >= 1, got {args.until}")
        if args.until is not None and args.until >= 2**63:  # (before the run directory is written)
            raise ConfigError(f"--until: expected a 64-bit integer, got {args.until}")
        if args.run_dir is not None and not args.run_dir.strip():
            raise ConfigError("--run-dir: empty (leave the flag out for the default runs/<env>_seed<N>_<time>_<pid>)")
        if args.workers is not None and args.workers < 1:
            raise ConfigError(f"--workers: must be >= 1, got {args.workers}")
        cfg = None
        if not args.resume:
            overrides = list(args.overrides)
            _refuse_shortcut_and_set(args)
            if args.seed is not None:
                overrides.append(f"run.seed={args.seed}")
            if args.total_steps is not None:
                overrides.append(f"run.total_steps={args.total_steps}")
            if args.workers is not None:
                overrides.append(f"parallel.workers={args.workers}")
            cfg = load_config(args.config or DEFAULT_CONFIG, overrides)
            workers = cfg.parallel.workers
        else:
            cfg_path = os.path.join(args.resume, "config.yaml")
            if not os.path.exists(cfg_path):
                raise CheckpointError(f"--resume {args.resume}: not a run directory (no config.yaml)")
            workers = load_config(cfg_path).parallel.workers
            if args.workers is not None and args.workers != workers:
                raise ConfigError(f"--workers {args.workers}: {args.resume} was trained with {workers} "
                                  f"worker(s); resume needs the same world size")
        from .parallel.context import in_msrun

        if workers > 1 and not in_msrun():  # this process launches msrun and waits for it
            exit_code[0] = _launch_workers(args, argv, cfg, workers)
            return
        import_mindspore()
        from .trainers.run import train_run

        summary = train_run(cfg, run_dir=args.run_dir, resume=args.resume, until=args.until,
                            progress=False if args.no_progress else None, profile=args.profile,
                            log=say, checkpoint=args.checkpoint, exiting=argv is None)
        if summary is not None and not in_msrun():  # (under msrun the launcher prints rank 0's summary, and a rank
            say_out(json.dumps(summary, indent=2),  # a signal stopped exits 0: msrun would call the job failed)
                    os.path.join(summary["run_dir"], "summary.json"))
            exit_code[0] = _exit_code(summary)

    exit_code = [0]
    code = run_cli(go)
    return code or exit_code[0]


def _exit_code(summary: dict) -> int:
    """0, or 128 + signum for a run a signal stopped (with a line saying how to continue it; a paused run too)."""
    if summary.get("status") == "paused":
        say(f"paused at step {summary['global_step']} (--until; checkpoint written); continue with --resume "
            f"{summary['run_dir']}")
    if summary.get("status") != "interrupted":
        return 0
    say(f"interrupted by {summary['interrupted_by']} at step {summary['global_step']} (checkpoint written); "
        f"continue with --resume {summary['run_dir']}")
    return 128 + signal.Signals[summary["interrupted_by"]].value


def _remove_if_untrained(run_dir: str, step_zero_too: bool) -> None:
    """Remove a run directory this launch created when the job failed or was stopped before it trained: no
    checkpoint, or with ``step_zero_too`` only step 0's and no iteration in metrics.csv (a rank refusing its config
    after rank 0 wrote ckpt_0; a signal while the ranks started up); the same command then starts afresh (the
    directory would refuse it). A job that trained keeps its directory: an env that raised in the first iteration
    after ckpt_0 removed it, metrics and logs included, where the error said the latest checkpoint resumes it."""
    import glob
    import re
    import shutil

    steps = [re.search(r"ckpt_(\d+)\.json$", p) for p in glob.glob(os.path.join(run_dir, "checkpoints", "ckpt_*.json"))]
    if not steps or (step_zero_too and all(m is not None and int(m.group(1)) == 0 for m in steps)
                     and not _metrics_rows(os.path.join(run_dir, "metrics.csv"))):
        shutil.rmtree(run_dir, ignore_errors=True)


def _metrics_rows(path: str) -> int:
    """Iterations logged in metrics.csv (its lines after the header; 0 without the file)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return max(0, sum(1 for line in f if line.strip()) - 1)
    except OSError:
        return 0


def _refuse_images_before_msrun(cfg) -> None:
    """PPO's data parallelism cannot train image observations (NatureCNN) yet: an env's spaces say whether it has
    them (ale-py ids are refused by the config checks already; CarRacing or a user's image env show only here), so
    build one env in this process, which never imports MindSpore: its errors, and this refusal, come at once and
    not from the ranks ~10 s after msrun started."""
    from .envs import make_vec_env, space_spec
    from .envs.factory import close_env
    from .errors import images_in_one_process

    e = cfg.env
    if e.backend == "native" or cfg.policy.features == "mlp" or cfg.sandbox.isolation_level != "none":
        return  # (isolated envs run only in workers of their own: the ranks refuse them as before)
    env = make_vec_env(e.id, 1, e.kwargs, backend=e.backend, preprocess=e.preprocess)
    try:
        spec = space_spec(env.single_observation_space, env.single_action_space, e.id, cfg.policy.features)
    finally:
        close_env(env, e.id)
    if spec.cnn:
        raise images_in_one_process("parallel.workers", e.id)


def _refuse_shortcut_and_set(args) -> None:
    """``--seed 1 --set run.seed=2``: one of the two was silently ignored (the shortcut won)."""
    from .errors import ConfigError

    shortcuts = (("--seed", args.seed, "run.seed"), ("--total-steps", args.total_steps, "run.total_steps"),
                 ("--workers", args.workers, "parallel.workers"))
    for flag, value, key in shortcuts:
        if value is None:
            continue
        for item in args.overrides:
            if item.split("=", 1)[0].strip() == key:
                raise ConfigError(f"{flag} {value} and --set {item}: both set {key}; give one of them")


def _launch_workers(args, argv, cfg, workers: int):
    from .errors import ConfigError
    from .parallel.launcher import launch
    from .runlock import HELD_ENV, RunLock, in_use
    from .trainers.run import default_run_dir

    # this process never imports MindSpore: take Ctrl-C directly again (KeyboardInterrupt stops msrun's workers)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if cfg is not None:
        _refuse_images_before_msrun(cfg)
    worker_args = list(sys.argv[1:] if argv is None else argv)
    if args.resume:
        from .config import load_config

        run_dir, fresh = args.resume, False

        saved = load_config(os.path.join(run_dir, "config.yaml")).parallel
        timeout, hang_timeout = saved.timeout, saved.hang_timeout
    else:
        run_dir = args.run_dir or default_run_dir(cfg)
        if not args.run_dir:
            worker_args += ["--run-dir", run_dir]
        fresh, timeout, hang_timeout = True, cfg.parallel.timeout, cfg.parallel.hang_timeout
    created = not os.path.exists(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    try:
        with RunLock(run_dir):  # this process holds the run directory for its msrun ranks
            if fresh and in_use(run_dir):
                raise ConfigError(f"--run-dir {run_dir}: already exists and is not empty (use --resume to continue "
                                  "it)")
            os.environ[HELD_ENV] = run_dir
            try:
                # (prints its own one-line error)
                code = launch(worker_args, workers, run_dir, timeout, hang_timeout=hang_timeout)
            finally:
                del os.environ[HELD_ENV]
    except BaseException:  # (a signal while the ranks started up: the job was stopped at once)
        if created:
            _remove_if_untrained(run_dir, step_zero_too=True)
        raise
    if code != 0:
        if created:  # (2: a rank's own one-line error, repeated by the launcher; 1: a crash, a hang)
            _remove_if_untrained(run_dir, step_zero_too=code == 2)
        return code
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as f:
        summary = {**json.load(f), "run_dir": run_dir}
    say_out(json.dumps(summary, indent=2), os.path.join(run_dir, "summary.json"))
    return _exit_code(summary)


if __name__ == "__main__":
    sys.exit(main())
