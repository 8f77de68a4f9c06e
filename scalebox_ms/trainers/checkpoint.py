"""Checkpoint files: a MindSpore ``.ckpt`` plus a JSON sidecar, written atomically and hash-checked.

A checkpoint ``<dir>/ckpt_<global_step:012d>`` consists of

* ``.ckpt``     -- MindSpore checkpoint of the policy/value parameters and the optimizer state
                   (names ``model.<param>`` and ``optimizer.<param>``);
* ``.env.pkl``  -- the vector env's in-flight state (positions, RNG states; see :mod:`scalebox_ms.envs.state`)
                   where it can be captured faithfully, so a resumed run continues the very same episodes;
                   absent otherwise (``env_state`` null in the sidecar);
* ``.replay.npz`` -- off-policy algorithms: the replay buffer's contents (numpy ``.npz``, uncompressed; about
                   ``size x (2 x obs_dim + action width + 2) x 4`` bytes), unless ``run.save_replay`` is false;
* ``.json``     -- the sidecar: format version, config, counters, normalisation statistics, RNG states, the
                   trainer's in-flight rollout state, the SHA-256 of the other two files, and ``sidecar_sha256``:
                   the SHA-256 of the sidecar's own canonical JSON (sorted keys, no spaces) without that key.

The sidecar is written last, so its presence marks a complete checkpoint. Loading verifies all three hashes and
that the sidecar is consistent with its file name (``global_step``), and refuses, with a one-line
:class:`CheckpointError`, a missing, corrupt, edited or mismatched checkpoint. Sidecars without
``sidecar_sha256`` (written before it existed) are refused too: their content cannot be verified.

A write that fails (disk full, file size limit) removes what it wrote and raises a one-line
:class:`CheckpointError`; the previous checkpoint stays the latest, and one already at the same prefix (a save to a
fixed name) stays as it was: every file is written in full before any file of it is replaced.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import pickle
import re
from typing import Dict, List, Optional, Tuple

from ..errors import CheckpointError, short_repr
from ..fileio import errors_named, json_text, remove_temporaries, sha256_file, sidecar_digest, staged_path

FORMAT = "scalebox_ms.ppo.v1"  # (the name predates the off-policy trainers; their checkpoints use it too)
# sidecar first: removing it first leaves no half checkpoint
EXTENSIONS = (".json", ".ckpt", ".env.pkl", ".replay.npz")


#: an off-policy iteration (one metrics row, the unit of checkpoints and ``--until``) is the fewest whole training
#: phases adding up to at least this many env steps
OFFPOLICY_ITERATION_STEPS = 1000


def steps_per_iteration(config: dict) -> int:
    """Env steps per iteration of a config in dict form: ppo.n_steps x env.num_envs for PPO; for DQN/SAC/TD3
    whole training phases (train_freq x num_envs) adding up to at least :data:`OFFPOLICY_ITERATION_STEPS`."""
    algo = config.get("algo", "ppo")
    num_envs = int(config["env"]["num_envs"])
    if algo == "ppo":
        return int(config["ppo"]["n_steps"]) * num_envs
    phase = _phase_steps(config, algo)
    return phase * max(1, -(-OFFPOLICY_ITERATION_STEPS // phase))


def _phase_steps(config: dict, algo: str) -> int:
    """Env steps of one off-policy training phase: train_freq x env.num_envs."""
    return int(config[algo]["train_freq"]) * int(config["env"]["num_envs"])


def iteration_shape(config: dict) -> tuple:
    """(env steps per iteration, per training phase) of a config in dict form (PPO: no phases, 0)."""
    algo = config.get("algo", "ppo")
    return steps_per_iteration(config), 0 if algo == "ppo" else _phase_steps(config, algo)


def steps_match(config: dict, global_step: int, iteration: int) -> bool:
    """Whether ``global_step`` env steps can follow ``iteration`` iterations of ``config`` (dict form): PPO's
    iterations are whole (``iteration x steps_per_iteration``); an off-policy iteration is 1 up to
    ``steps_per_iteration / phase`` whole training phases (the last one before the run's end or ``--until`` may be
    cut short). Both counted from the sidecar's ``steps_base`` where another config trained before (fine-tuning
    with another ``n_steps`` or ``train_freq``)."""
    per_iteration = steps_per_iteration(config)
    algo = config.get("algo", "ppo")
    if algo == "ppo":
        return global_step == iteration * per_iteration
    phase = _phase_steps(config, algo)
    return global_step % phase == 0 and iteration * phase <= global_step <= iteration * per_iteration


def checkpoint_prefix(directory: str, global_step: int) -> str:
    return os.path.join(directory, f"ckpt_{global_step:012d}")


def write_checkpoint(prefix: str, tensors: List[dict], sidecar: dict, env_obj=None, replay=None) -> str:
    """Write ``prefix.ckpt`` (+ ``prefix.env.pkl``, + ``prefix.replay.npz`` for a dict of ``replay`` arrays) and
    finally ``prefix.json``; returns the sidecar path.

    Every file is first written in full to a temporary file; only then does a checkpoint already at ``prefix``
    (a save to a fixed name) give way: its sidecar goes, the new files replace its files, and the new sidecar
    lands. A write that fails (a full disk) leaves that earlier checkpoint as it was."""
    for ext in EXTENSIONS:
        if os.path.isdir(prefix + ext):
            raise CheckpointError(f"cannot write checkpoint {prefix}: {prefix + ext} is a directory")
    staged: Dict[str, str] = {}  # extension -> its temporary file
    committing = False
    try:
        sidecar = _stage_checkpoint(prefix, tensors, sidecar, env_obj, replay, staged)
        with _staging(prefix, ".json", staged) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write(json_text(sidecar))
        # everything is on disk: from here on only renames and unlinks, which need no space
        if os.path.exists(prefix + ".json"):  # (the checkpoint at prefix is incomplete until the new sidecar lands)
            os.unlink(prefix + ".json")
        committing = True
        for ext in EXTENSIONS[1:]:
            if ext in staged:
                os.replace(staged[ext], prefix + ext)
                del staged[ext]
            elif os.path.exists(prefix + ext):  # (the earlier checkpoint's file, which this one has not)
                os.unlink(prefix + ext)
        os.replace(staged[".json"], prefix + ".json")
        del staged[".json"]
        return prefix + ".json"
    except BaseException as exc:  # a write error, or a second signal (abort at once) between the files
        for tmp in staged.values():
            remove_temporaries(tmp)
        if committing:  # no half checkpoint: the previous one stays the latest
            for ext in EXTENSIONS:
                if os.path.isfile(prefix + ext):
                    os.unlink(prefix + ext)
        if isinstance(exc, OSError):
            raise CheckpointError(f"cannot write checkpoint {prefix}: {exc.strerror or exc}") from None
        raise


@contextlib.contextmanager
def _staging(prefix: str, ext: str, staged: Dict[str, str]):
    """A temporary file for ``prefix + ext``, recorded in ``staged`` (an error names the file it stands for)."""
    with errors_named(prefix + ext), staged_path(prefix + ext) as tmp:
        staged[ext] = tmp
        yield tmp


@contextlib.contextmanager
def _save_failure_unlogged():
    """MindSpore logs "Failed to save the checkpoint file ..." (CRITICAL, to stderr) before it raises; the raise
    becomes write_checkpoint's one-line CheckpointError, so that record is dropped while the file is written."""
    from mindspore import log

    try:
        logger = log._get_logger()  # (private: MindSpore 2.10 has no public handle on its logger)
    except Exception:  # (another MindSpore: its line is printed, as before)
        logger = None

    def keep(record) -> bool:
        return not str(record.msg).startswith("Failed to save the checkpoint file")

    if logger is not None:
        logger.addFilter(keep)
    try:
        yield
    finally:
        if logger is not None:
            logger.removeFilter(keep)


def _stage_checkpoint(prefix: str, tensors: List[dict], sidecar: dict, env_obj, replay,
                      staged: Dict[str, str]) -> dict:
    """Write the checkpoint's data files to temporary files (``staged``: extension -> path); returns the sidecar
    that describes them."""
    import mindspore as ms

    with _staging(prefix, ".ckpt", staged) as tmp, _save_failure_unlogged():
        ms.save_checkpoint(tensors, tmp)
    sidecar = dict(sidecar)
    sidecar["format"] = FORMAT
    sidecar["ckpt_sha256"] = sha256_file(staged[".ckpt"])
    sidecar["env_state"] = None
    if env_obj is not None:
        try:
            blob = pickle.dumps(env_obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # e.g. MuJoCo handles: resume then re-seeds fresh episodes
            sidecar["env_state_error"] = f"{type(exc).__name__}: {exc}"[:200]
        else:
            with _staging(prefix, ".env.pkl", staged) as tmp, open(tmp, "wb") as f:
                f.write(blob)
            sidecar["env_state"] = {"file": os.path.basename(prefix) + ".env.pkl",
                                    "sha256": sha256_file(staged[".env.pkl"])}
    sidecar["replay_state"] = None
    if replay is not None:
        with _staging(prefix, ".replay.npz", staged) as tmp:
            write_npz(tmp, replay)
        sidecar["replay_state"] = {"file": os.path.basename(prefix) + ".replay.npz",
                                   "sha256": sha256_file(staged[".replay.npz"]),
                                   "bytes": os.path.getsize(staged[".replay.npz"])}
    sidecar = json.loads(json.dumps(sidecar))  # the JSON form (tuples -> lists, ...) is what gets hashed
    sidecar["sidecar_sha256"] = sidecar_digest(sidecar)
    return sidecar


def write_npz(path: str, arrays: dict) -> None:
    """``numpy.savez``'s format (uncompressed .npy members; ``numpy.load`` reads it), with the zip archive closed
    when a write fails: ``np.savez`` on a file object left its half-written ZipFile to the garbage collector, whose
    ``__del__`` then printed a traceback ("seek of closed file") after the one-line disk-full error."""
    import zipfile

    import numpy as np

    with open(path, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)


def resolve_checkpoint(path: str) -> str:
    """Accept a sidecar (.json), a .ckpt, a prefix, or a directory (latest checkpoint), as a str or a path-like;
    return the prefix."""
    if not isinstance(path, (str, os.PathLike)):
        raise CheckpointError(f"the checkpoint path must be a path, got {type(path).__name__}")
    path = os.fspath(path) or "."  # ("": the current directory, where save("") writes)
    if os.path.isdir(path):  # (a run's own ckpt_<12-digit step> names first: a ckpt_1000 copied in is not its latest)
        def numbered(directory):
            return list_checkpoints(directory, own=True) or list_checkpoints(directory)

        found = numbered(path)
        if not found:
            ckpt_dir = os.path.join(path, "checkpoints")
            found = numbered(ckpt_dir) if os.path.isdir(ckpt_dir) else []
        if not found:
            raise CheckpointError(f"no checkpoint found in {path}")
        return found[-1]
    for ext in EXTENSIONS:
        if path.endswith(ext):
            path = path[: -len(ext)]
            break
    if not os.path.exists(path + ".json"):
        raise CheckpointError(f"checkpoint not found: {path}.json")
    return path


def load_into(trainer, checkpoint: Optional[str], run_dir: str, attempts: int = 5, replay: bool = True,
              run_config: Optional[dict] = None, free_keys=()) -> str:
    """``trainer.load`` of ``checkpoint``, or else of ``run_dir``'s latest checkpoint; returns its prefix.

    A run still being trained prunes old checkpoints (``run.keep_checkpoints``, sidecar first): the latest one
    picked here may be gone before it is read. Such a vanished checkpoint is replaced by the new latest (up to
    ``attempts`` times); any other failure (corrupt, mismatched) is raised as it is. With ``run_config`` (the
    config.yaml the trainer was built from, as a dict) a checkpoint trained with another config is refused, except
    for ``free_keys`` (an edited ``policy.activation`` would load the weights into another function)."""
    def load(prefix):
        if run_config is not None:
            from .lifecycle import config_changes

            changed = config_changes(read_sidecar(prefix)["config"], run_config, free_keys)
            if changed:
                from ..errors import ConfigError

                raise ConfigError(f"{os.path.join(run_dir, 'config.yaml')} differs from the config "
                                  f"{os.path.basename(prefix)} was trained with: {', '.join(changed)} (checkpoint -> "
                                  f"config.yaml); restore config.yaml (the trained config is in {prefix}.json)")
        trainer.load(prefix, replay=replay)

    if checkpoint:
        prefix = resolve_checkpoint(checkpoint)
        ckpt_dir = os.path.realpath(os.path.join(run_dir, "checkpoints"))
        where = os.path.realpath(os.path.dirname(prefix))
        if where != ckpt_dir and not (where + os.sep).startswith(os.path.join(ckpt_dir, "discarded", "")):
            # (the run's config.yaml built this trainer: another run's weights would load into it, or fail late)
            from ..errors import ConfigError

            raise ConfigError(f"--checkpoint {checkpoint}: not one of {run_dir}'s checkpoints (in "
                              f"{os.path.join(run_dir, 'checkpoints')}); give that run's directory as --run")
        load(prefix)
        return prefix
    if not os.path.isdir(os.path.join(run_dir, "checkpoints")):  # (resolve_checkpoint would take it as a prefix)
        raise CheckpointError(f"no checkpoint found in {run_dir} (it has no checkpoints/ directory)")
    for attempt in range(attempts):
        prefix = resolve_checkpoint(os.path.join(run_dir, "checkpoints"))
        try:
            load(prefix)
            return prefix
        except Exception:
            if os.path.exists(prefix + ".json") or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


#: a checkpoint name that orders by its number (``save("ckpt_7")``, or a run's own)
CHECKPOINT_NAME = re.compile(r"ckpt_(\d+)")
#: a run's own checkpoint name: ``ckpt_<global step>`` padded to 12 digits (:func:`checkpoint_prefix`)
AUTO_NAME = re.compile(r"ckpt_(\d{12})")


def list_checkpoints(directory: str, own: bool = False) -> List[str]:
    """Complete checkpoints (sidecar present) named ``ckpt_<number>`` in ``directory``, oldest (lowest number)
    first; other names (a user's ``ckpt_best``) are not the run's. ``own``: a run's ``checkpoints/``, whose own
    names are ``ckpt_<12-digit step>`` (a ``ckpt_1000`` copied in was taken for its latest and rewound the run)."""
    found = []
    name = AUTO_NAME if own else CHECKPOINT_NAME
    for path in glob.glob(os.path.join(glob.escape(directory), "ckpt_*.json")):
        m = name.fullmatch(os.path.basename(path)[: -len(".json")])
        if m:
            found.append((int(m.group(1)), path[: -len(".json")]))
    return [prefix for _, prefix in sorted(found)]


def read_sidecar(prefix: str) -> dict:
    """The verified sidecar of ``prefix``: valid JSON, our format, untouched (``sidecar_sha256``) and consistent
    with its file name. Raises a one-line :class:`CheckpointError` otherwise."""
    name = os.path.basename(prefix) + ".json"
    try:
        with open(prefix + ".json", "r", encoding="utf-8") as f:
            sidecar = json.load(f)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint sidecar {prefix}.json is unreadable or corrupt ({type(exc).__name__})") from None
    if not isinstance(sidecar, dict) or sidecar.get("format") != FORMAT:
        raise CheckpointError(f"{prefix}.json is not a scalebox_ms checkpoint of format {FORMAT}")
    if "sidecar_sha256" not in sidecar:
        raise CheckpointError(f"checkpoint sidecar {prefix}.json has no sidecar_sha256 (written by an older "
                              "scalebox_ms): its content cannot be verified")
    if sidecar["sidecar_sha256"] != sidecar_digest(sidecar):
        raise CheckpointError(f"checkpoint sidecar {prefix}.json was edited or is corrupt: its content does not "
                              "match its sidecar_sha256")
    for key, low in (("global_step", 0), ("iteration", 0), ("world_size", 1)):
        value = sidecar.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise CheckpointError(f"checkpoint sidecar {prefix}.json: {key} must be an integer >= {low}, got {value!r}")
    m = AUTO_NAME.fullmatch(name[: -len(".json")])  # (a run's own name: a sidecar copied over another is refused)
    if m and int(m.group(1)) != sidecar["global_step"]:
        raise CheckpointError(f"checkpoint sidecar {prefix}.json: global_step {sidecar['global_step']} does not "
                              f"match the step {int(m.group(1))} in its file name")
    if not isinstance(sidecar.get("config"), dict) or not isinstance(sidecar.get("ckpt_sha256"), str):
        raise CheckpointError(f"checkpoint sidecar {prefix}.json: config or ckpt_sha256 missing")
    try:  # every iteration adds a fixed number of env steps (all ranks' envs under data parallelism)
        per_iteration = steps_per_iteration(sidecar["config"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"checkpoint sidecar {prefix}.json: its config does not say how many env steps an "
                              "iteration has") from None
    base = sidecar.get("steps_base", [0, 0])  # (global_step, iteration) where this config's iterations began
    if not (isinstance(base, list) and len(base) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                              for v in base)
            and 0 <= base[0] <= sidecar["global_step"] and 0 <= base[1] <= sidecar["iteration"]):
        raise CheckpointError(f"checkpoint sidecar {prefix}.json: steps_base must be [global_step, iteration] of an "
                              f"earlier point, got {short_repr(base)}")
    if not steps_match(sidecar["config"], sidecar["global_step"] - base[0], sidecar["iteration"] - base[1]):
        since = f" since step {base[0]} (iteration {base[1]})" if base != [0, 0] else ""
        raise CheckpointError(f"checkpoint sidecar {prefix}.json: global_step {sidecar['global_step']} does not fit "
                              f"iteration {sidecar['iteration']} of {per_iteration} env steps per iteration{since}")
    return sidecar


def verify_checkpoint(prefix: str, check_replay: bool = True) -> dict:
    """Check the sidecar and the hashes of the files it covers (without loading them); returns the sidecar.
    ``check_replay=False``: not the replay buffer's file (a run with ``run.save_replay: false`` does without it)."""
    sidecar = read_sidecar(prefix)
    ckpt = prefix + ".ckpt"
    if not os.path.exists(ckpt):
        raise CheckpointError(f"checkpoint file missing: {ckpt}")
    if sha256_file(ckpt) != sidecar["ckpt_sha256"]:
        raise CheckpointError(f"checkpoint {ckpt} is corrupt: its SHA-256 does not match the sidecar")
    for key, what, ext in (("env_state", "env state", ".env.pkl"), ("replay_state", "replay buffer", ".replay.npz")):
        if (check_replay or key != "replay_state") and sidecar.get(key) and not _intact(prefix, sidecar, key, ext):
            raise CheckpointError(f"checkpoint {what} {prefix + ext} is missing or corrupt")
    return sidecar


def _intact(prefix: str, sidecar: dict, key: str, ext: str) -> bool:
    """The file of the sidecar's ``key`` exists and has its SHA-256 (found from the prefix, as the .ckpt is: a
    checkpoint's files renamed together load)."""
    info, path = sidecar.get(key), prefix + ext
    return isinstance(info, dict) and os.path.exists(path) and sha256_file(path) == info.get("sha256")


def newest_intact(directory: str, check_replay: bool = True) -> Tuple[Optional[str], Dict[str, str]]:
    """The newest of a run's own checkpoints in ``directory`` that verifies, and {prefix: why} for the newer ones
    that do not."""
    broken: Dict[str, str] = {}
    for prefix in reversed(list_checkpoints(directory, own=True)):
        try:
            verify_checkpoint(prefix, check_replay)
        except CheckpointError as exc:
            broken[prefix] = str(exc)
            continue
        return prefix, broken
    return None, broken


def read_checkpoint(path: str, replay: bool = True, check_replay: bool = True) -> Dict:
    """Load and verify a checkpoint; returns {'prefix', 'sidecar', 'tensors' (name -> numpy), 'env', 'replay',
    'replay_lost'}.

    ``replay=False``: the replay buffer's file is verified but not read (``'replay'`` is None). ``check_replay=False``
    (a run with ``run.save_replay: false``): a missing or corrupt replay file is no error; ``'replay'`` is then None
    and ``'replay_lost'`` True."""
    import mindspore as ms

    prefix = resolve_checkpoint(path)
    sidecar = verify_checkpoint(prefix, check_replay)
    ckpt = prefix + ".ckpt"
    try:
        params = ms.load_checkpoint(ckpt)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {ckpt} cannot be loaded by MindSpore ({type(exc).__name__})") from None
    tensors = {k: v.asnumpy() for k, v in params.items()}
    env = None
    if sidecar.get("env_state"):
        with open(prefix + ".env.pkl", "rb") as f:
            env = pickle.loads(f.read())  # hash-verified file written by write_checkpoint
    arrays = None
    lost = bool(sidecar.get("replay_state")) and not check_replay and not _intact(prefix, sidecar, "replay_state",
                                                                                  ".replay.npz")
    if sidecar.get("replay_state") and replay and not lost:
        import numpy as np

        with np.load(prefix + ".replay.npz", allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    return {"prefix": prefix, "sidecar": sidecar, "tensors": tensors, "env": env, "replay": arrays,
            "replay_lost": lost}


def prune_checkpoints(directory: str, keep: int) -> None:
    """Remove all but the ``keep`` newest of a run's own checkpoints (``ckpt_<12 digits>``) in ``directory``."""
    own = list_checkpoints(directory, own=True)
    for prefix in own[:-keep]:
        for ext in EXTENSIONS:  # sidecar first: an interrupted prune leaves no half checkpoint
            if os.path.exists(prefix + ext):
                os.unlink(prefix + ext)
