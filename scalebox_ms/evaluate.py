"""``python -m scalebox_ms.evaluate``: deterministic evaluation of a trained run on fresh envs.

    python -m scalebox_ms.evaluate --run runs/x [--checkpoint FILE] [--episodes 20] [--seed N] [--json]
    python -m scalebox_ms.evaluate --mindir runs/x/policy_int8_L1.mindir [--episodes 20] [--json]
"""
from __future__ import annotations

import json
import sys

from .cli_common import (OneLineArgumentParser, emit, import_mindspore, refuse_empty_checkpoint,
                         route_sigint_around_mindspore, run_cli, sigint_held, stop_at_once_on_termination)


def build_parser():
    p = OneLineArgumentParser("evaluate",
                              description="Evaluate a trained run (PPO, DQN, SAC, TD3) or an exported MindIR policy.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", metavar="DIR", help="run directory written by scalebox_ms.train")
    src.add_argument("--mindir", metavar="FILE", help="a policy exported by scalebox_ms.export (fp32 or INT8)")
    p.add_argument("--checkpoint", metavar="FILE", help="checkpoint (.json/.ckpt or prefix); default: the run's latest")
    p.add_argument("--episodes", type=int, default=20, metavar="N", help="episodes to play (default 20)")
    p.add_argument("--seed", type=int, metavar="N", help="seed of the evaluation envs (default: the run's run.seed + "
                   "10000, as "
                   "its own evaluations; 10000 with --mindir)")
    p.add_argument("--stochastic", action="store_true", help="sample actions instead of the deterministic policy")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def main(argv=None) -> int:
    if argv is None:  # a process of its own: Ctrl-C must not become MindSpore's SIGTERM (see cli_common)
        route_sigint_around_mindspore()
        stop_at_once_on_termination()  # SIGTERM/SIGHUP: "interrupted" as for Ctrl-C, nothing half-written
    args = build_parser().parse_args(argv)

    def go():
        import os

        from .errors import CheckpointError, ConfigError

        if args.episodes < 1:
            raise ConfigError(f"--episodes: must be >= 1, got {args.episodes}")
        if args.seed is not None and not 0 <= args.seed < 2**32:
            raise ConfigError(f"--seed: must be in [0, 2**32), got {args.seed}")
        refuse_empty_checkpoint(args.checkpoint)
        if args.mindir:
            return _evaluate_mindir(args)
        if not os.path.isdir(args.run) or not os.path.exists(os.path.join(args.run, "config.yaml")):
            raise CheckpointError(f"--run {args.run}: not a run directory (no config.yaml)")

        import_mindspore()
        from .config import load_config
        from .trainers import acting_trainer
        from .trainers.evaluation import check_evaluation_env, evaluate_policy

        cfg = load_config(os.path.join(args.run, "config.yaml"))
        # Ctrl-C: held while graphs compile (MindSpore turned one into a screen of errors and an analyze_fail.ir),
        # and the evaluation stops at its next env step
        with sigint_held():  # (the latest checkpoint, also while a train still writes the run)
            trainer, ckpt = acting_trainer(cfg, args.run, args.checkpoint)
        try:  # (a run that trained on EnvPool without evaluating: spaces of another kind than gymnasium's)
            check_evaluation_env(trainer, evaluating=True)
        except BaseException:
            trainer.close()
            raise
        from .trainers.callbacks import eval_seed

        seed = eval_seed(cfg) if args.seed is None else args.seed  # (as the run's own evaluations)
        with sigint_held() as asked:
            rets = evaluate_policy(trainer, episodes=args.episodes, seed=seed, deterministic=not args.stochastic,
                                   should_stop=asked)
        trainer.close()
        result = {**return_stats(rets), "checkpoint": ckpt, "global_step": trainer.global_step,
                  "env_id": cfg.env.id, "deterministic": not args.stochastic, "seed": seed}
        if args.json:
            emit(json.dumps(result))
        else:
            emit(f"{cfg.env.id} @ step {trainer.global_step}: mean return {result['mean_return']:.2f} "
                  f"+/- {result['std_return']:.2f} over {_episodes(len(rets))} ({os.path.basename(ckpt)})")

    return run_cli(go)


def _episodes(n: int) -> str:
    return f"{n} episode" if n == 1 else f"{n} episodes"


def return_stats(rets) -> dict:
    import numpy as np

    return {"mean_return": float(np.mean(rets)), "std_return": float(np.std(rets)), "episodes": len(rets),
            "min_return": float(np.min(rets)), "max_return": float(np.max(rets))}


def _evaluate_mindir(args) -> None:

    from .errors import ConfigError
    from .export import evaluate_mindir

    if args.checkpoint or args.stochastic:
        raise ConfigError("--checkpoint/--stochastic do not apply to --mindir (an exported policy is deterministic)")
    import_mindspore()
    with sigint_held() as asked:  # (as in main: no Ctrl-C inside MindSpore's graph compile)
        rets = evaluate_mindir(args.mindir, episodes=args.episodes, seed=10_000 if args.seed is None else args.seed,
                               should_stop=asked)
    result = {**return_stats(rets), "mindir": args.mindir, "deterministic": True}
    if args.json:
        emit(json.dumps(result))
    else:
        emit(f"{args.mindir}: mean return {result['mean_return']:.2f} +/- {result['std_return']:.2f} "
              f"over {_episodes(len(rets))}")


if __name__ == "__main__":
    sys.exit(main())
