"""``python -m scalebox_ms.train``: train PPO from a YAML config (CartPole-v1 by default).

Examples::

    python -m scalebox_ms.train                                   # CartPole-v1, rl-zoo3 settings
    python -m scalebox_ms.train --config configs/ppo_acrobot.yaml --seed 1
    python -m scalebox_ms.train --set ppo.n_epochs=10 --set env.num_envs=16 --run-dir runs/x
    python -m scalebox_ms.train --resume runs/x                   # continue a paused/interrupted run
"""
from __future__ import annotations

import json
import os
import sys

from .cli_common import OneLineArgumentParser, run_cli

DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "configs", "ppo_cartpole.yaml")


def build_parser():
    p = OneLineArgumentParser(prog="python -m scalebox_ms.train", description="Train PPO with MindSpore.")
    p.add_argument("--config", help="YAML config (default: the packaged ppo_cartpole.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (YAML syntax), repeatable")
    p.add_argument("--seed", type=int, help="shortcut for --set run.seed=N")
    p.add_argument("--total-steps", type=int, help="shortcut for --set run.total_steps=N (also the schedules' horizon)")
    p.add_argument("--run-dir", help="where to write the run (default runs/<env>_seed<N>_<time>)")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its latest checkpoint")
    p.add_argument("--until", type=int, metavar="STEPS",
                   help="pause (checkpoint + summary) once this many env steps are done; schedules unchanged")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="record N iterations with MindSpore's profiler into <run-dir>/profile")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    def go():
        import logging

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger = logging.getLogger("scalebox_ms")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        from .config import load_config
        from .errors import ConfigError

        if args.resume and (args.config or args.overrides or args.seed is not None or args.total_steps is not None
                            or args.run_dir):
            raise ConfigError("--resume continues a run with its own config; "
                              "--config/--set/--seed/--total-steps/--run-dir cannot be combined with it")
        if args.until is not None and args.until < 1:
            raise ConfigError(f"--until: must be >= 1, got {args.until}")
        cfg = None
        if not args.resume:
            overrides = list(args.overrides)
            if args.seed is not None:
                overrides.append(f"run.seed={args.seed}")
            if args.total_steps is not None:
                overrides.append(f"run.total_steps={args.total_steps}")
            cfg = load_config(args.config or DEFAULT_CONFIG, overrides)
        from .trainers.run import train_run

        summary = train_run(cfg, run_dir=args.run_dir, resume=args.resume, until=args.until,
                            progress=False if args.no_progress else None, profile=args.profile,
                            log=lambda s: print(s, file=sys.stderr))
        print(json.dumps(summary, indent=2))

    return run_cli(go)


if __name__ == "__main__":
    sys.exit(main())
