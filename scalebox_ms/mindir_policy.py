"""Running an exported policy (``policy.mindir`` + its sidecar ``policy.mindir.json``, written by
:mod:`scalebox_ms.export`) with MindSpore only: :class:`MindIRPolicy` checks observations as ``predict`` does and
maps the graph's outputs to env actions; :func:`evaluate_mindir` plays episodes with it (``evaluate --mindir``)."""
from __future__ import annotations

import json
import logging
import os
from typing import List

from .errors import ConfigError, short_repr
from .fileio import sha256_file, sidecar_digest

# numpy and MindSpore are imported on use: `python -m scalebox_ms.evaluate` routes Ctrl-C before they start threads


FORMAT = "scalebox_ms.policy.mindir.v2"  # (v2: the sidecar carries its own sidecar_sha256)
FORMAT_V1 = "scalebox_ms.policy.mindir.v1"


def sidecar_path(mindir_path: str) -> str:
    return mindir_path + ".json"


class MindIRPolicy:
    """Run an exported file with MindSpore only (``mindspore.load`` + ``nn.GraphCell``)."""

    def __init__(self, path: str):
        import mindspore as ms

        if not os.path.exists(path):
            raise ConfigError(f"--mindir {path}: file not found")
        try:
            with open(sidecar_path(path), "r", encoding="utf-8") as f:
                self.sidecar = json.load(f)
        except (OSError, ValueError):
            raise ConfigError(f"--mindir {path}: sidecar {sidecar_path(path)} is missing or corrupt") from None
        sc = self.sidecar
        if (not isinstance(sc, dict) or not isinstance(sc.get("input"), dict) or not isinstance(sc.get("env_id"), str)
                or not isinstance(sc.get("action_space"), dict) or "type" not in sc["action_space"]):
            raise ConfigError(f"--mindir {path}: sidecar {sidecar_path(path)} is missing or corrupt")
        # (every field is used as it stands: an edited one ended in a KeyError or a MindSpore traceback)
        # (v1 sidecars written before 2026-12-05 have no file_sha256: the graph's size is all they can check)
        hashed = sc.get("format") == FORMAT or sc.get("file_sha256") is not None
        if sc.get("format") == FORMAT_V1:  # an older export's: its graph is checked below
            unchecked = ("its own SHA-256): an edit to it" if hashed else
                         "its own or its graph's SHA-256): an edit to it, or another export's graph of the same size,")
            logging.getLogger("scalebox_ms.mindir").warning(
                f"warning: --mindir {path}: sidecar {sidecar_path(path)} is of an older export ({FORMAT_V1}, without "
                f"{unchecked} cannot be detected; export again for a checked one")
        elif sc.get("format") != FORMAT:
            raise ConfigError(f"--mindir {path}: sidecar {sidecar_path(path)} is not one of scalebox_ms.export "
                              f"(format {short_repr(sc.get('format'))}, not {FORMAT}); export again")
        elif sc.get("sidecar_sha256") != sidecar_digest(sc):
            raise ConfigError(f"--mindir {path}: sidecar {sidecar_path(path)} was edited since the export (its "
                              "sidecar_sha256 does not match); export again")
        if os.path.getsize(path) != sc.get("file_bytes") or (hashed and sha256_file(path) != sc.get("file_sha256")):
            raise ConfigError(f"--mindir {path}: not the file its sidecar {os.path.basename(sidecar_path(path))} "
                              "describes (another export's, or changed since); export again")
        try:
            self.cell = ms.nn.GraphCell(ms.load(path))
        except Exception as exc:
            raise ConfigError(f"--mindir {path}: MindSpore cannot load it ({type(exc).__name__})") from None

    def __call__(self, obs) -> "np.ndarray":  # noqa: F821 (numpy imported on use)
        """Actions for a batch of observations as the env returns them (Dict/Tuple: a dict/tuple of batches; one
        observation is a batch of one). Observations that are not numbers, of another shape, outside the space (a
        Discrete value out of range, pixels beyond 0..255) or not finite are a one-line ValueError, as for
        ``predict``: the graph would cast them to something else silently."""
        import mindspore as ms
        import numpy as np

        from .envs.obs_encoding import check_finite, numbers

        what = "MindIRPolicy"

        def batch(x, shape, flat=None):  # (a wrong shape would fail inside the GraphCell)
            shape = tuple(shape)
            if x.shape == shape:  # one observation
                return x.reshape((1,) + (flat or shape))
            if x.ndim < 1 or x.shape[1:] not in (shape, flat):
                forms = [s for s in dict.fromkeys((shape, flat)) if s is not None]
                want = " or ".join(f"(N, {', '.join(map(str, s))})" for s in forms)
                raise ValueError(f"{what}: observations of shape {x.shape}; the policy takes a batch {want}")
            if len(x) == 0:
                raise ValueError(f"{what}: an empty batch (0 observations)")
            return x.reshape((-1,) + (flat or shape))

        inp = self.sidecar["input"]
        if inp.get("leaves") is not None:
            encoder = self._encoder()
            obs, single = encoder.as_batch(obs, what)
            with np.errstate(over="ignore"):  # (beyond float32: inf, named below)
                arrays = encoder.leaf_arrays(obs, what)
            for leaf, x in zip(encoder.leaves, arrays):
                check_finite(x, what, single, f"observation part {leaf.name}")
            return self._run(*[ms.Tensor(x) for x in arrays])
        obs = numbers(obs, what)
        if inp.get("image"):
            x = batch(obs, inp["shape"][1:])
            if x.dtype != np.uint8:  # (float frames scaled to [0, 1], or values beyond a byte: garbage as uint8)
                encoder = self._encoder()
                x = encoder._pixels(x, what, encoder.leaves[0])
            return self._run(ms.Tensor(x))
        # (a scalar Box observation has observation_shape [], which is not "absent")
        shape = tuple(inp["observation_shape"] if "observation_shape" in inp else inp["shape"][1:])
        with np.errstate(over="ignore"):  # (beyond float32: inf, named below)
            x = batch(obs.astype(np.float32, copy=False), shape, flat=tuple(inp["shape"][1:]))
        check_finite(x, what, False)
        return self._run(ms.Tensor(x))

    def _run(self, *tensors) -> "np.ndarray":  # noqa: F821
        try:
            return self.cell(*tensors).asnumpy()
        except (RuntimeError, TypeError, ValueError) as exc:  # (MindSpore's: ~50 lines of its own traceback)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"MindIRPolicy: the graph refused the inputs its sidecar describes ({first}); export "
                              "again") from None

    def _encoder(self):
        """The ObsEncoder of the observation space the sidecar describes (its checks of observations)."""
        if getattr(self, "_obs_encoder", None) is None:
            from .envs.exported_space import space_of_inputs
            from .envs.obs_encoding import LEAF_KINDS, ObsEncoder

            inp = self.sidecar["input"]
            if inp.get("leaves") is not None and not all(
                    isinstance(d, dict) and d.get("kind") in LEAF_KINDS for d in inp["leaves"]):
                raise ConfigError("MindIRPolicy: the sidecar's input leaves lack their kind (box, discrete, ...): "
                                  "not a sidecar written by scalebox_ms.export; export again")
            encoder = ObsEncoder(space_of_inputs(inp), self.sidecar.get("env_id", "env"))
            if inp.get("leaves") is not None and [(list(leaf.path), list(leaf.shape)) for leaf in encoder.leaves] != [
                    (list(d["path"]), list(d["shape"])) for d in inp["leaves"]]:
                raise ConfigError(f"MindIRPolicy: the sidecar's input leaves {[d['path'] for d in inp['leaves']]} "
                                  "do not describe one observation space; export again")
            self._obs_encoder = encoder
        return self._obs_encoder

    def env_actions(self, actions: "np.ndarray") -> "np.ndarray":  # noqa: F821
        """The graph's actions as the env takes them (int64 indices plus the space's start, int8 bits; Box actions
        in the space's dtype, clipped to its bounds in it: float32(0.1) is above a float64 bound 0.1)."""
        import numpy as np

        space = self.sidecar["action_space"]
        kind = space["type"]
        if kind == "Discrete":
            return actions.astype(np.int64)
        if kind == "MultiDiscrete":
            return actions.astype(np.int64) + np.asarray(space["start"], np.int64)
        if kind == "MultiBinary":
            return actions.astype(np.int8)
        dtype = np.dtype(space.get("dtype", "float32"))  # (sidecars before it: float32, the graph's own)
        return np.clip(actions.astype(dtype), np.asarray(space["low"], dtype), np.asarray(space["high"], dtype))


def evaluate_mindir(path: str, episodes: int = 20, seed: int = 10_000, max_envs: int = 16,
                    should_stop=None) -> List[float]:
    """Episodes of an exported policy on fresh gymnasium envs (same protocol as ``evaluate_policy``, whose
    ``should_stop`` this passes on)."""
    from .trainers.evaluation import run_episodes

    policy = MindIRPolicy(path)

    def act(obs):
        return policy.env_actions(policy(obs))

    return run_episodes(policy.sidecar["env_id"], policy.sidecar.get("env_kwargs") or {}, act, episodes, seed,
                        max_envs, preprocess=policy.sidecar.get("env_preprocess", "auto"), should_stop=should_stop)
