"""A measured dead end: NatureCNN's layers 2 and 3 channel-major, one 2-D matmul each, against models/cnn.py's
batch-major im2col path (the weight copied over the batch with ``ops.tile``, one ``ops.bmm`` per layer).

Channel-major keeps activations ``(C, B, H, W)``: the batch is then one tall image ``(C, B*H, W)`` (a free
reshape), unfolded once, and ``weight (out, C*k*k) @ patches (C*k*k, B*rows*ow)`` computes every window of it; the
windows that straddle two images are dropped (``conv2d_channel_major`` below). The first layer stays batch-major
(its output is transposed once), the last layer's output is transposed back for the flatten. Standalone the 2-D
matmul is ~2x faster than tile + bmm (``benchmarks/conv_weight_copy.py``); this script measures what it gives
where it counts:

* default: the whole NatureCNN at batch 256 on Atari frame stacks (4, 84, 84), forward and forward + weight
  gradients, median of 3 compiled calls, both paths in turn for ``--rounds`` rounds (after checking that their
  outputs agree);
* ``--ppo N``: N rounds of PPO on Breakout (``configs/ppo_atari.yaml --total-steps 5120``, no eval), batch-major then
  channel-major, each in a fresh process; ``update_time_s`` and ``rollout_time_s`` of iterations 2-5
  (``metrics.csv``). Needs the atari extra.

The library keeps the batch-major path: in PPO the channel-major update measured slower (docs/performance.md, CNN
section).

Usage:  python benchmarks/cnn_channel_major.py [--rounds 3] [--ppo 2] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time

import mindspore as ms  # (module level: graph code cannot import)
from mindspore import ops
from bench_args import at_least  # noqa: E402 (benchmarks/ is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def conv2d_channel_major(x, weight, bias, stride: int):
    """Valid convolution of channel-major ``x (C, B, H, W)`` with ``weight (out, C, k, k)`` -> ``(out, B, oh, ow)``.
    With H a multiple of the stride (each image padded to one otherwise) image b's windows start at tall rows
    ``b*H/s + j``: the first ``oh`` are its own, the rest straddle two images. The last image lacks its
    ``ceil(k/s) - 1`` straddling rows: zeros, so that the result reshapes to ``(out, B, H/s, ow)``."""
    C, B, H, W = x.shape
    out, k, s = weight.shape[0], weight.shape[2], stride
    oh, ow = (H - k) // s + 1, (W - k) // s + 1
    hs = -(-H // s)
    if hs * s != H:
        x = ops.pad(x, (0, 0, 0, hs * s - H))
    cols = ops.unfold(x.reshape(1, C, B * hs * s, W), k, 1, 0, s)
    missing = -(-k // s) - 1
    y = ops.matmul(weight.reshape(out, C * k * k), cols.reshape(C * k * k, (B * hs - missing) * ow))
    y = (y + bias.reshape(out, 1)).reshape(out, B * hs - missing, ow)
    if missing:
        y = ops.pad(y, (0, 0, 0, missing))
    return y.reshape(out, B, hs, ow)[:, :, :oh, :]


def channel_major_construct(self, obs):
    """NatureCNN.construct with layers 2 and 3 channel-major (patched in by ChannelMajor)."""
    x = ops.transpose(ops.relu(self.conv[0](obs.astype(ms.float32) * (1.0 / 255.0))), (1, 0, 2, 3))
    for i in (2, 4):
        conv = self.conv[i]
        x = ops.relu(conv2d_channel_major(x, conv.weight, conv.bias, conv.stride))
    x = ops.transpose(x, (1, 0, 2, 3))
    return ops.relu(self.linear(x.reshape(x.shape[0], -1)))


class ChannelMajor:
    """Within the block NatureCNN (new graphs) runs channel_major_construct."""

    def __enter__(self):
        from scalebox_ms.models.cnn import NatureCNN

        self.saved = NatureCNN.construct
        NatureCNN.construct = channel_major_construct

    def __exit__(self, *exc):
        from scalebox_ms.models.cnn import NatureCNN

        NatureCNN.construct = self.saved


def whole_cnn(rounds: int, batch: int):
    import numpy as np

    from cnn_conv import fwd_and_fwd_bwd
    from scalebox_ms.models.cnn import NatureCNN

    frames = ms.Tensor(np.random.default_rng(1).integers(0, 256, (batch, 4, 84, 84)).astype(np.uint8))
    cnn = NatureCNN((4, 84, 84), im2col=True)
    want = ms.jit(cnn.construct)(frames).asnumpy()
    with ChannelMajor():
        got = ms.jit(cnn.construct)(frames).asnumpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # the same convolution
    rows = []
    for r in range(rounds):
        for variant in ("batch_major", "channel_major"):
            net = NatureCNN((4, 84, 84), im2col=True)
            if variant == "channel_major":
                with ChannelMajor():
                    fwd, fwd_bwd = fwd_and_fwd_bwd(net, frames)
            else:
                fwd, fwd_bwd = fwd_and_fwd_bwd(net, frames)
            rows.append({"round": r, "variant": variant, "fwd_s": fwd, "fwd_bwd_s": fwd_bwd})
            print(rows[-1], flush=True)
    return rows


def ppo_run(variant: str, run_dir: str) -> int:
    """One PPO Breakout run (in this process) with NatureCNN on ``variant``."""
    from scalebox_ms.train import main

    argv = ["--config", os.path.join(REPO, "configs", "ppo_atari.yaml"), "--total-steps", "5120", "--no-progress",
            "--set", "run.eval_episodes=0", "--run-dir", run_dir,
            # the im2col path both variants patch (auto picks oneDNN, whose first layer scales the frames itself:
            # the channel-major patch would scale them twice)
            "--set", "policy.conv_backend=im2col"]
    if variant == "channel_major":
        with ChannelMajor():
            return main(argv)
    return main(argv)


def ppo_rounds(rounds: int):
    rows = []
    for r in range(rounds):
        for variant in ("batch_major", "channel_major"):
            with tempfile.TemporaryDirectory() as tmp:
                run_dir = os.path.join(tmp, "run")
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--ppo-run", variant, run_dir],
                                      cwd=tmp, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit(f"PPO run ({variant}) failed: {proc.stderr.strip().splitlines()[-1:]}")
                with open(os.path.join(run_dir, "metrics.csv")) as f:
                    its = list(csv.DictReader(f))[1:5]
            rows.append({"round": r, "variant": variant,
                         "update_time_s": [round(float(i["update_time_s"]), 3) for i in its],
                         "rollout_time_s": [round(float(i["rollout_time_s"]), 3) for i in its]})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=at_least(1), default=3)
    ap.add_argument("--batch", type=at_least(1), default=256)
    ap.add_argument("--ppo", type=at_least(0), default=0, help="rounds of the PPO Breakout comparison (0: none)")
    ap.add_argument("--ppo-run", nargs=2, metavar=("VARIANT", "RUN_DIR"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    if args.ppo_run:
        sys.exit(ppo_run(*args.ppo_run))

    from scalebox_ms import Sandbox
    from scalebox_ms.fileio import atomic_write_json

    Sandbox(device="cpu", seed=0)
    result = {"batch": args.batch, "cnn": whole_cnn(args.rounds, args.batch), "date": time.strftime("%Y-%m-%d %H:%M"),
              "mindspore": ms.__version__, "cpus": os.cpu_count()}
    if args.ppo:
        result["ppo_breakout"] = ppo_rounds(args.ppo)
    if args.out:
        atomic_write_json(args.out, result)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
