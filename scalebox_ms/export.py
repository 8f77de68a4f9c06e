"""MindIR export of trained policies, optionally INT8-quantized.

The exported graph maps a raw observation batch ``float32 (batch, obs_dim)`` (dynamic batch dimension; Box
observations of any shape are flattened) to an action batch: observation normalisation inside the graph,
then the deterministic action (argmax ``int32`` for Discrete, the Gaussian mean clipped to the bounds
``float32 (batch, act_dim)`` for Box, per-component argmax ``int32 (batch, k)`` for MultiDiscrete, ``l > 0``
``int32 (batch, n)`` for MultiBinary). Only the policy network is exported, not the value network.

Observation spaces other than a plain Box (Discrete, MultiDiscrete, MultiBinary, Dict, Tuple) take one input
per leaf of the space, in the order of the sidecar's ``input.leaves`` (Dict keys in the space's order, Tuple
parts by index, nested paths joined with dots): ``int32 (batch,)`` for Discrete, ``int32 (batch, *shape)`` for
MultiDiscrete, ``float32 (batch, *shape)`` for Box and MultiBinary. The graph one-hots and joins them as
training did (:mod:`scalebox_ms.envs.obs_encoding`) and normalises the Box columns only.

Next to ``policy.mindir`` a sidecar ``policy.mindir.json`` records the env id, spaces, normalisation,
quantization details, versions and the source checkpoint. The file runs without scalebox_ms::

    import mindspore as ms
    policy = ms.nn.GraphCell(ms.load("policy.mindir"))
    actions = policy(ms.Tensor(obs_batch.astype("float32"))).asnumpy()
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
from typing import Optional

from .errors import ConfigError
from .fileio import atomic_write_json, sha256_file, sidecar_digest, umask
from .mindir_policy import FORMAT, MindIRPolicy, evaluate_mindir, sidecar_path  # noqa: F401 (also public here)

# numpy and MindSpore are imported on use: `python -m scalebox_ms.export` routes Ctrl-C before they start threads



def _normalizer_constants(obs_normalizer):
    """(mean, 1 / std, clip) of the run's observation statistics, as the deploy graph's float32 constants."""
    import numpy as np
    from mindspore import Tensor

    rms = obs_normalizer.rms
    return (Tensor(np.asarray(rms.mean, np.float32)),
            Tensor((1.0 / np.sqrt(rms.var + obs_normalizer.epsilon)).astype(np.float32)), float(obs_normalizer.clip))


def _deploy_cell(policy_cell, obs_normalizer, encoder=None):
    from mindspore import Tensor, nn, ops

    class DeployPolicy(nn.Cell):
        """raw obs (one Tensor, or one per leaf of a composite space) -> encoded -> normalised -> deterministic
        action."""

        def __init__(self):
            super().__init__()
            self.policy = policy_cell
            self.channels_last = encoder is not None and encoder.image and encoder.channels_last
            self.encode = encoder is not None and not encoder.plain and not encoder.image
            if self.encode:
                from .models.obs_encoder import ObsEncoderCell

                self.encoder = ObsEncoderCell(encoder)
            self.normalize = obs_normalizer is not None
            self.masked = self.normalize and obs_normalizer.mask is not None
            if self.masked:  # per-column constants: the non-Box columns pass through
                self.mean, self.inv_std, low, high = (Tensor(a) for a in obs_normalizer.constants())
                self.low, self.high = low, high
            elif self.normalize:
                self.mean, self.inv_std, self.clip = _normalizer_constants(obs_normalizer)

        def construct(self, *obs):
            x = self.encoder(*obs) if self.encode else obs[0]
            if self.channels_last:  # the env's HWC frames -> the CNN's CHW
                x = ops.transpose(x, (0, 3, 1, 2))
            if self.masked:
                x = ops.minimum(ops.maximum((x - self.mean) * self.inv_std, self.low), self.high)
            elif self.normalize:
                x = ops.clip_by_value((x - self.mean) * self.inv_std, -self.clip, self.clip)
            return self.policy(x)

    # MindIR repeats the graph's name (from the class's qualified name) in every node name: keep it short
    DeployPolicy.__qualname__ = "DeployPolicy"
    return DeployPolicy()


def _action_space_json(spec, space) -> dict:
    kind = spec.action_kind
    if kind == "discrete":
        return {"type": "Discrete", "n": spec.action_dim}
    if kind == "multidiscrete":
        return {"type": "MultiDiscrete", "nvec": list(spec.nvec), "start": list(spec.action_start)}
    if kind == "multibinary":
        return {"type": "MultiBinary", "n": spec.action_dim}
    return {"type": "Box", "shape": [spec.action_dim], "low": list(spec.low), "high": list(spec.high),
            "dtype": str(space.dtype)}  # (the graph's float32 actions are cast to it and clipped in it)


def export_mindir(trainer, output: str, int8: bool = False, quant_level: str = "L1", calibrate_steps: int = 200,
                  activation_calibration: str = "minmax", percentile: float = 99.99,
                  source: Optional[str] = None) -> dict:
    """Export ``trainer``'s deterministic policy to ``output`` (.mindir) plus its JSON sidecar; returns the sidecar.

    With ``int8=True`` the policy is first quantized by :class:`~scalebox_ms.quant.DynamicQuantizer` using
    ``calibrate_steps`` env steps of the policy's own observations.
    """
    import mindspore as ms

    from .cli_common import sigint_held
    from .models.cnn import builtin_patches

    if not output.endswith(".mindir"):
        raise ConfigError(f"--output {output}: must end with .mindir")
    _check_keys(trainer.collector.encoder.space)
    quant_info = None
    if int8:
        from .quant import DynamicQuantizer, collect_calibration_data

        quantizer = DynamicQuantizer(calibrate_steps, quant_level, activation_calibration, percentile)
        if trainer.global_step == 0:
            raise ConfigError("quantize: the policy is untrained (global_step 0); INT8 calibration needs a trained "
                              "one: train first, or load a later checkpoint (export --checkpoint)")
        quantizer.check(getattr(trainer.model, "features", None) is not None, trainer.spec)  # (before calibrating)
        from .trainers.evaluation import check_evaluation_env

        check_evaluation_env(trainer, evaluating=True)  # (calibration plays gymnasium's env)
        # (Ctrl-C held while graphs compile, which MindSpore turns into a screen of errors; calibration stops at its
        # next env step)
        with sigint_held() as asked:
            data = collect_calibration_data(trainer, calibrate_steps, should_stop=asked)
            policy = quantizer(trainer, data)
        quant_info = policy.info
    else:  # the deterministic policy: PPO's ActorCritic, or the off-policy trainers' DeployActor
        policy = trainer.deploy_policy() if hasattr(trainer, "deploy_policy") else trainer.model
    encoder = trainer.collector.encoder
    cell = _deploy_cell(policy, trainer.obs_normalizer, encoder)
    spec = trainer.spec
    if encoder.image:  # uint8 frames as the env gives them (HWC or CHW)
        inputs = [ms.Tensor(shape=[None] + list(encoder.space.shape), dtype=ms.uint8)]
    elif encoder.plain:
        inputs = [ms.Tensor(shape=[None, spec.obs_dim], dtype=ms.float32)]
    else:
        inputs = [ms.Tensor(shape=[None] + list(leaf.shape), dtype=getattr(ms, leaf.input_dtype))
                  for leaf in encoder.leaves]
    directory = os.path.dirname(os.path.abspath(output))
    if os.path.isdir(output):
        raise ConfigError(f"--output {output}: is a directory")
    if os.path.isdir(sidecar_path(output)):  # (before compiling; its removal below was blamed on --output)
        raise ConfigError(f"--output {output}: its sidecar's path {sidecar_path(output)} is a directory")
    _refuse_split_mindir(cell, output)
    # (not the output's name: one near the file system's 255-byte limit is legal, its temporary name would not be)
    tmp_name = f".tmp-export-{os.getpid()}-{secrets.token_hex(4)}"
    tmp_prefix = os.path.join(directory, tmp_name)
    try:
        os.makedirs(directory, exist_ok=True)
        # (Ctrl-C: held until the compile is done, then raised here, and the temporary file removed)
        with sigint_held(), builtin_patches(cell), _nameable(directory, tmp_name) as file_name:
            # (MindSpore ops only: an aot kernel's library does not travel with the file)
            ms.export(cell, *inputs, file_name=file_name, file_format="MINDIR")
        with contextlib.suppress(FileNotFoundError):  # an export stopped between the two files leaves no stale pair
            os.unlink(sidecar_path(output))
        os.chmod(tmp_prefix + ".mindir", 0o666 & ~umask())  # (MindSpore writes 0400: unreadable to a service user)
        # (the graph's size and hash before it is moved: another export to the same output may replace it before the
        # sidecar is written, and a sidecar hashing whatever is at output then vouched for the other graph)
        graph = {"file_bytes": os.path.getsize(tmp_prefix + ".mindir"),
                 "file_sha256": sha256_file(tmp_prefix + ".mindir")}
        os.replace(tmp_prefix + ".mindir", output)
    except OSError as exc:  # (makedirs under a file raises "File exists": say what is wrong)
        reason = "Not a directory" if isinstance(exc, FileExistsError) and not os.path.isdir(directory) else \
            exc.strerror or exc
        raise ConfigError(f"--output {output}: cannot write ({reason})") from None
    finally:
        for leftover in (tmp_prefix + ".mindir", tmp_prefix + "_graph.mindir"):  # (the second: a split export's)
            if os.path.exists(leftover):
                os.unlink(leftover)
        shutil.rmtree(tmp_prefix + "_variables", ignore_errors=True)
    try:  # the sidecar, or no file at all: a .mindir without it cannot be run (MindIRPolicy needs the sidecar)
        sidecar = _sidecar(trainer, graph, encoder, spec, quant_info, source)
        atomic_write_json(sidecar_path(output), sidecar)
    except BaseException as exc:
        if os.path.exists(output):
            os.unlink(output)
        if isinstance(exc, OSError):
            raise ConfigError(f"--output {output}: cannot write its sidecar {sidecar_path(output)} "
                              f"({exc.strerror or exc})") from None
        raise
    return sidecar


def _check_keys(space) -> None:
    """ConfigError for a Dict observation space with a key that is not a string: the sidecar names the MindIR
    inputs by their paths, where a number is a Tuple index (the file was written, then ``MindIRPolicy`` refused
    it)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            if not isinstance(key, str):
                raise ConfigError(f"export: the observation space's Dict key {key!r} is not a string; the exported "
                                  "inputs are named by string keys (rename it in the env)")
            _check_keys(sub)
    elif isinstance(space, spaces.Tuple):
        for sub in space.spaces:
            _check_keys(sub)


def _refuse_split_mindir(cell, output: str) -> None:
    """MindSpore writes a model whose parameters exceed ``TOTAL_SAVE`` KiB (1 GiB in 2.10) as a graph file and a
    folder of variables instead of one ``.mindir``; the export here (one file, hashed in its sidecar, renamed into
    place) and :class:`MindIRPolicy` handle one file only: refuse before compiling, in one line."""
    from mindspore.train import serialization

    limit = getattr(serialization, "TOTAL_SAVE", 1024 * 1024) * 1024
    size = sum(p.data.nbytes for p in cell.get_parameters())
    if size > limit:
        raise ConfigError(f"--output {output}: the policy's parameters take {size / 2**30:.2f} GiB; MindSpore writes "
                          f"a MindIR over {limit / 2**30:g} GiB as a graph file and a folder of variables, which "
                          "scalebox_ms's export (one file and its sidecar) does not support: export a smaller policy")


@contextlib.contextmanager
def _nameable(directory: str, name: str):
    """A path to ``directory/name`` that ``ms.export`` takes: MindSpore accepts only file names of
    [0-9a-zA-Z@_-.:/\\] (a space or a non-ASCII letter is a ValueError). In a directory named otherwise: the
    directory through an open descriptor (``/proc/self/fd/N/name``, Linux), else the bare name from within the
    directory as the working directory (which changes it for every thread of the process)."""
    path = os.path.join(directory, name)
    if re.fullmatch(r"[0-9a-zA-Z@_\-.:/\\]+", path):
        yield path
    elif os.path.isdir("/proc/self/fd"):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            yield f"/proc/self/fd/{fd}/{name}"
        finally:
            os.close(fd)
    else:  # pragma: no cover - not Linux
        before = os.getcwd()
        os.chdir(directory)
        try:
            yield name
        finally:
            os.chdir(before)


def _sidecar(trainer, graph: dict, encoder, spec, quant_info, source) -> dict:
    """What an exported file's sidecar records (``graph``: the written .mindir's ``file_bytes`` and ``file_sha256``)."""
    import mindspore as ms

    from . import __version__

    obs_space = trainer.env.single_observation_space
    cfg = trainer.config
    sidecar = {
        "format": FORMAT,
        "env_id": cfg.env.id,
        "env_kwargs": cfg.env.kwargs,
        "env_preprocess": cfg.env.preprocess,
        "input": ({"dtype": "uint8", "shape": [None] + list(obs_space.shape), "image": {
                      "channels_last": encoder.channels_last, "scaled_in_graph": "1/255"}} if encoder.image else
                  {"dtype": "float32", "shape": [None, spec.obs_dim], "observation_shape": list(obs_space.shape)}
                  if encoder.plain else {"leaves": encoder.describe(), "encoded_dim": spec.obs_dim}),
        "output": {"dtype": "int32", "shape": [None]} if spec.discrete else
        {"dtype": "int32" if spec.integer_actions else "float32", "shape": [None, spec.action_dim]},
        "action_space": _action_space_json(spec, trainer.env.single_action_space),
        "normalization": None if trainer.obs_normalizer is None else {
            "mean": trainer.obs_normalizer.rms.mean.tolist(), "var": trainer.obs_normalizer.rms.var.tolist(),
            "epsilon": trainer.obs_normalizer.epsilon, "clip": trainer.obs_normalizer.clip,
            "formula": "clip((obs - mean) / sqrt(var + epsilon), -clip, clip)",
            # encoded Dict/Tuple/Discrete observations: only the Box columns (mask true) are normalised
            "mask": None if trainer.obs_normalizer.mask is None else trainer.obs_normalizer.mask.tolist()},
        "quantization": quant_info,
        # the graph's arithmetic: amp.level O1-O3 runs the casts the trained model had (fp16/bf16 matmuls); an INT8
        # file's layers (QuantDense/QuantConv) dequantise and compute in float32 whatever the training's amp was
        "amp": ({"level": cfg.amp.level, "dtype": cfg.amp.dtype if cfg.amp.level != "O0" else None}
                if quant_info is None else {"level": "O0", "dtype": None}),
        "algo": cfg.algo,
        "global_step": trainer.global_step,
        "param_sha256": trainer.parameters_sha256(),
        "source_checkpoint": source,
        "scalebox_ms_version": __version__,
        "mindspore_version": ms.__version__,
        **graph,
    }
    sidecar["sidecar_sha256"] = sidecar_digest(sidecar)  # (MindIRPolicy refuses an edited sidecar)
    return sidecar


# ---------------------------------------------------------------------------------------------------- CLI
#: calibration keeps every step's observations in host memory and steps the envs that long: a typo's 1e20 steps
#: would run until the memory is gone
MAX_CALIBRATE_STEPS = 1_000_000


def build_parser():
    from .cli_common import OneLineArgumentParser

    p = OneLineArgumentParser("export", description="Export a trained policy to MindIR, optionally INT8-quantized.")
    p.add_argument("--run", required=True, metavar="DIR", help="run directory written by scalebox_ms.train")
    p.add_argument("--checkpoint", metavar="FILE", help="checkpoint (.json/.ckpt or prefix); default: the run's latest")
    p.add_argument("--output", metavar="FILE.mindir", help="output file (default: <run>/policy[_int8_<level>].mindir)")
    p.add_argument("--int8", action="store_true", help="post-training INT8 quantization")
    p.add_argument("--calibrate-steps", type=int, default=None, metavar="N",
                   help="env steps of calibration data (--int8; 1 to 1,000,000, default 200)")
    p.add_argument("--quant-level", choices=["L1", "L2"], default=None,
                   help="L1: int8 weights; L2: int8 weights and activations (default L1; needs --int8)")
    p.add_argument("--activation-calibration", choices=["minmax", "percentile"], default=None,
                   help="L2 activation range: largest magnitude seen, or a percentile (default minmax)")
    p.add_argument("--percentile", type=float, default=None, metavar="P",
                   help="percentile for --activation-calibration percentile (default 99.99)")
    p.add_argument("--json", action="store_true", help="print the sidecar as JSON")
    return p


def main(argv=None) -> int:
    from .cli_common import (emit, import_mindspore, refuse_empty_checkpoint, route_sigint_around_mindspore, run_cli,
                             sigint_held, stop_at_once_on_termination)

    if argv is None:  # a process of its own: Ctrl-C must not become MindSpore's SIGTERM (see cli_common)
        route_sigint_around_mindspore()
        stop_at_once_on_termination()  # SIGTERM/SIGHUP: "interrupted" as for Ctrl-C, nothing half-written
    args = build_parser().parse_args(argv)

    def go():
        from .errors import CheckpointError

        if not args.int8 and (args.quant_level or args.activation_calibration or args.calibrate_steps is not None):
            raise ConfigError("--quant-level/--activation-calibration/--calibrate-steps need --int8")
        calibrate_steps = 200 if args.calibrate_steps is None else args.calibrate_steps
        level = args.quant_level or "L1"
        if args.activation_calibration and level != "L2":  # (it would be ignored: L1 keeps activations float)
            raise ConfigError("--activation-calibration: only with --quant-level L2 (L1 quantizes weights only)")
        calib = args.activation_calibration or "minmax"
        if args.percentile is not None and calib != "percentile":  # (it would be ignored)
            raise ConfigError("--percentile: only with --int8 --activation-calibration percentile")
        if args.int8 and not 1 <= calibrate_steps <= MAX_CALIBRATE_STEPS:
            raise ConfigError(f"--calibrate-steps: must be in [1, {MAX_CALIBRATE_STEPS:,}], got {calibrate_steps}")
        refuse_empty_checkpoint(args.checkpoint)
        if not os.path.isdir(args.run) or not os.path.exists(os.path.join(args.run, "config.yaml")):
            raise CheckpointError(f"--run {args.run}: not a run directory (no config.yaml)")
        output = args.output or os.path.join(args.run, f"policy_int8_{level}.mindir" if args.int8 else "policy.mindir")
        if not output.endswith(".mindir"):
            raise ConfigError(f"--output {output}: must end with .mindir")
        import_mindspore()
        from .config import load_config
        from .trainers import acting_trainer

        cfg = load_config(os.path.join(args.run, "config.yaml"))
        # the exported graph uses MindSpore's convolution ops anyway (models.cnn.builtin_patches): a run trained with
        # the C++ patches kernel or the oneDNN op exports on a machine without a compiler too
        cfg.policy.conv_kernel = "builtin"
        cfg.policy.conv_backend = "im2col"
        # (the latest checkpoint, also while a train still writes the run; Ctrl-C held while its graphs compile)
        with sigint_held():
            trainer, ckpt = acting_trainer(cfg, args.run, args.checkpoint)
        sidecar = export_mindir(trainer, output, int8=args.int8, quant_level=level, calibrate_steps=calibrate_steps,
                                activation_calibration=calib,
                                percentile=99.99 if args.percentile is None else args.percentile,
                                source=os.path.abspath(ckpt))  # (it was relative to export's working directory)
        trainer.close()
        written = f"{output} and {sidecar_path(output)}"
        if args.json:
            emit(json.dumps({**sidecar, "path": output}), written)
        else:
            amp = sidecar["amp"]
            kind = (f"INT8 {level}" if args.int8 else "fp32" if amp["level"] == "O0"
                    else f"fp32 weights, {amp['dtype']} compute (amp.level {amp['level']})")
            emit(f"wrote {output} ({kind}, {sidecar['file_bytes']} bytes) and {sidecar_path(output)}", written)

    return run_cli(go)


if __name__ == "__main__":
    import sys

    sys.exit(main())
