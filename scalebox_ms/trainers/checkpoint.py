"""Checkpoint files: a MindSpore ``.ckpt`` plus a JSON sidecar, written atomically and hash-checked.

A checkpoint ``<dir>/ckpt_<global_step:012d>`` consists of

* ``.ckpt``     -- MindSpore checkpoint of the policy/value parameters and the optimizer state
                   (names ``model.<param>`` and ``optimizer.<param>``);
* ``.env.pkl``  -- the vector env's in-flight state (positions, RNG states; see :mod:`scalebox_ms.envs.state`)
                   where it can be captured faithfully, so a resumed run continues the very same episodes;
                   absent otherwise (``env_state`` null in the sidecar);
* ``.json``     -- the sidecar: format version, config, counters, normalisation statistics, RNG states, the
                   trainer's in-flight rollout state, and the SHA-256 of the other two files.

The sidecar is written last, so its presence marks a complete checkpoint. Loading verifies both hashes and
refuses, with a one-line :class:`CheckpointError`, a missing, corrupt or mismatched checkpoint.
"""
from __future__ import annotations

import glob
import json
import os
import pickle
from typing import Dict, List, Optional

from ..errors import CheckpointError
from ..fileio import atomic_path, atomic_write_bytes, atomic_write_json, sha256_file

FORMAT = "scalebox_ms.ppo.v1"


def checkpoint_prefix(directory: str, global_step: int) -> str:
    return os.path.join(directory, f"ckpt_{global_step:012d}")


def write_checkpoint(prefix: str, tensors: List[dict], sidecar: dict, env_obj=None) -> str:
    """Write ``prefix.ckpt`` (+ ``prefix.env.pkl``) and finally ``prefix.json``; returns the sidecar path."""
    import mindspore as ms

    with atomic_path(prefix + ".ckpt") as tmp:
        ms.save_checkpoint(tensors, tmp)
    sidecar = dict(sidecar)
    sidecar["format"] = FORMAT
    sidecar["ckpt_sha256"] = sha256_file(prefix + ".ckpt")
    sidecar["env_state"] = None
    if env_obj is not None:
        try:
            blob = pickle.dumps(env_obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # e.g. MuJoCo handles: resume then re-seeds fresh episodes
            sidecar["env_state_error"] = f"{type(exc).__name__}: {exc}"[:200]
        else:
            atomic_write_bytes(prefix + ".env.pkl", blob)
            sidecar["env_state"] = {"file": os.path.basename(prefix) + ".env.pkl",
                                    "sha256": sha256_file(prefix + ".env.pkl")}
    atomic_write_json(prefix + ".json", sidecar)
    return prefix + ".json"


def resolve_checkpoint(path: str) -> str:
    """Accept a sidecar (.json), a .ckpt, a prefix, or a directory (latest checkpoint); return the prefix."""
    if os.path.isdir(path):
        found = list_checkpoints(path)
        if not found:
            ckpt_dir = os.path.join(path, "checkpoints")
            found = list_checkpoints(ckpt_dir) if os.path.isdir(ckpt_dir) else []
        if not found:
            raise CheckpointError(f"no checkpoint found in {path}")
        return found[-1]
    for ext in (".json", ".ckpt", ".env.pkl"):
        if path.endswith(ext):
            path = path[: -len(ext)]
            break
    if not os.path.exists(path + ".json"):
        raise CheckpointError(f"checkpoint not found: {path}.json")
    return path


def list_checkpoints(directory: str) -> List[str]:
    """Complete checkpoints (sidecar present) in ``directory``, oldest first."""
    return sorted(p[: -len(".json")] for p in glob.glob(os.path.join(directory, "ckpt_*.json")))


def read_checkpoint(path: str) -> Dict:
    """Load and verify a checkpoint; returns {'sidecar', 'tensors' (name -> numpy), 'env'}."""
    import mindspore as ms

    prefix = resolve_checkpoint(path)
    try:
        with open(prefix + ".json", "r", encoding="utf-8") as f:
            sidecar = json.load(f)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint sidecar {prefix}.json is unreadable or corrupt ({type(exc).__name__})") from None
    if not isinstance(sidecar, dict) or sidecar.get("format") != FORMAT:
        raise CheckpointError(f"{prefix}.json is not a scalebox_ms checkpoint of format {FORMAT}")
    ckpt = prefix + ".ckpt"
    if not os.path.exists(ckpt):
        raise CheckpointError(f"checkpoint file missing: {ckpt}")
    if sha256_file(ckpt) != sidecar.get("ckpt_sha256"):
        raise CheckpointError(f"checkpoint {ckpt} is corrupt: its SHA-256 does not match the sidecar")
    try:
        params = ms.load_checkpoint(ckpt)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {ckpt} cannot be loaded by MindSpore ({type(exc).__name__})") from None
    tensors = {k: v.asnumpy() for k, v in params.items()}
    env = None
    info: Optional[dict] = sidecar.get("env_state")
    if info:
        env_path = os.path.join(os.path.dirname(prefix), info["file"])
        if not os.path.exists(env_path) or sha256_file(env_path) != info["sha256"]:
            raise CheckpointError(f"checkpoint env state {env_path} is missing or corrupt")
        with open(env_path, "rb") as f:
            env = pickle.loads(f.read())  # hash-verified file written by write_checkpoint
    return {"prefix": prefix, "sidecar": sidecar, "tensors": tensors, "env": env}


def prune_checkpoints(directory: str, keep: int) -> None:
    for prefix in list_checkpoints(directory)[:-keep]:
        for ext in (".json", ".ckpt", ".env.pkl"):  # sidecar first: an interrupted prune leaves no half checkpoint
            if os.path.exists(prefix + ext):
                os.unlink(prefix + ext)
