"""Resident memory of one process that builds, trains briefly and closes trainers one after another.

Each trainer's compiled graphs stay in MindSpore's process-wide graph cache after ``close()`` and garbage
collection (docs/python_api.md, "Many trainers in one process"); this prints the process's RSS after each of
``--trainers`` trainers (300 env steps each) and the growth per trainer after the first.

Usage:  python benchmarks/trainers_in_one_process.py <preset> [section.key=value ...] [--trainers 8]
        e.g. python benchmarks/trainers_in_one_process.py sac_pendulum sac.learning_starts=100 sac.buffer_size=10000
"""
from __future__ import annotations

import argparse
import gc
import os

from bench_args import at_least  # noqa: E402 (benchmarks/ is on sys.path)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", help="a preset name in configs/ (without .yaml)")
    ap.add_argument("overrides", nargs="*", metavar="SECTION.KEY=VALUE")
    ap.add_argument("--trainers", type=at_least(2), default=8)
    args = ap.parse_args()
    path = os.path.join(REPO, "configs", f"{args.preset}.yaml")
    if not os.path.isfile(path):
        ap.error(f"preset: no {path}")
    from scalebox_ms import load_config
    from scalebox_ms.sandbox import current_rss_bytes
    from scalebox_ms.trainers import make_trainer

    cfg = load_config(path, ["run.progress=false", *args.overrides])
    rss = []
    for _ in range(args.trainers):
        trainer = make_trainer(cfg)
        trainer.learn(300)
        trainer.close()
        del trainer
        gc.collect()
        rss.append(current_rss_bytes() / 2**20)
    growth = (rss[-1] - rss[0]) / (len(rss) - 1)
    print(f"{args.preset}: RSS after each trainer {[round(r) for r in rss]} MB; {growth:.1f} MB per trainer after "
          "the first")


if __name__ == "__main__":
    main()
