"""What a checkpoint holds of a trainer, and how it is put back.

:func:`save` captures the trainer's state -- the model Parameters and the optimizer state (and the AMP loss
scaler's) in the logical ``nn.Dense`` layout, and in the sidecar the config, counters, episode statistics,
normalisation statistics, the Generator's state, the in-flight rollout state and a hash of the parameters --
and writes it with :func:`scalebox_ms.trainers.checkpoint.write_checkpoint`. :func:`load` verifies and restores
all of it, so training continues bit for bit as if it had not stopped.
"""
from __future__ import annotations

import collections
import hashlib
import json
import os

import numpy as np

from ..errors import CheckpointError, ScaleboxError


def named_state(model, update_step):
    """[(checkpoint name, Parameter)]: ``model.*``, then ``optimizer.*`` (Adam state), then the update's own state
    (``amp.*``)."""
    out = [("model." + n, p) for n, p in model.parameters_and_names()]
    model_ids = {id(p) for _, p in out}
    for name, param in update_step.optimizer.parameters_and_names():
        if id(param) not in model_ids:
            out.append(("optimizer." + name, param))
    out += [(param.name, param) for param in update_step.state_parameters()]  # amp.loss_scale, ...
    return out


class ParameterValues:
    """Read all state Parameters to numpy, and write values back so that compiled graphs see them."""

    def __init__(self, named):
        self.named = named
        self._writer = None

    def snapshot(self):
        return [param.asnumpy().copy() for _, param in self.named]

    def restore(self, values) -> None:
        import mindspore as ms

        from ..ops import AssignParameters

        if self._writer is None:
            self._writer = AssignParameters([param for _, param in self.named])
        self._writer.write(ms.Tensor(np.asarray(v, dtype=param.asnumpy().dtype))
                           for (_, param), v in zip(self.named, values))


def parameters_sha256(model) -> str:
    """SHA-256 over all policy/value parameters (name, dtype, shape, bytes), sorted by name, in the logical
    (nn.Dense) layout: a FusedDense model hashes like the dense model with the same weights."""
    h = hashlib.sha256()
    for name, value in sorted(model.logical_parameters(), key=lambda kv: kv[0]):
        arr = np.ascontiguousarray(value)
        h.update(name.encode())
        h.update(str(arr.dtype).encode())
        h.update(str(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def save(trainer, prefix: str) -> str:
    """Write a checkpoint of ``trainer`` at ``prefix``; returns the sidecar path. A directory (an existing one, a
    path ending in a separator, or ``""`` for the current one) gets the run's own name for the checkpoint,
    ``<directory>/ckpt_<global step>``, which ``load_trainer(directory)`` finds."""
    import mindspore as ms

    from ..envs import state as env_state
    from .checkpoint import AUTO_NAME, EXTENSIONS, checkpoint_prefix, write_checkpoint

    if not isinstance(prefix, (str, os.PathLike)):
        raise CheckpointError(f"save: the checkpoint prefix must be a path, got {type(prefix).__name__}")
    prefix = os.fspath(prefix)
    if prefix == "" or prefix.endswith(("/", os.sep)) or os.path.isdir(prefix):
        prefix = checkpoint_prefix(prefix or ".", trainer.global_step)
    for ext in EXTENSIONS:  # (the name of one of its files: the prefix load then finds)
        if prefix.endswith(ext) and len(os.path.basename(prefix)) > len(ext):
            prefix = prefix[: -len(ext)]
            break  # (one, as resolve_checkpoint strips one)
    m = AUTO_NAME.fullmatch(os.path.basename(prefix))
    if m and int(m.group(1)) != trainer.global_step:
        raise CheckpointError(f"save: {os.path.basename(prefix)} is the name of a run's checkpoint at step "
                              f"{int(m.group(1))} (this trainer is at step {trainer.global_step}); give another name, "
                              "or a directory to get the name of this step")

    c = trainer.collector
    # stored in the logical (nn.Dense) layout whatever policy.layer/align: FusedDense padding is not saved, and
    # the off-policy twin critics' ensemble tensors are stored per critic (checkpoint_items: the file format of the
    # separate critics, which load() stacks back, so checkpoints read both ways across versions)
    items = getattr(trainer.model, "checkpoint_items", None)
    tensors = []
    for name, param in trainer._named_state():
        array = trainer.model.to_logical(name, param.asnumpy())
        for n, a in (items(name, array) if items is not None else [(name, array)]):
            tensors.append({"name": n, "data": ms.Tensor(np.asarray(a, order="C"))})  # (0-d stays 0-d)
    sidecar = {
        "config": trainer.config.to_dict(),
        "global_step": trainer.global_step,
        "iteration": trainer.iteration,
        "steps_base": list(trainer.steps_base),
        "wall_time_s": trainer.wall_time_s,
        "evaluations": list(trainer.evaluations),
        "episodes": c.episodes,
        "episode_returns": list(c.episode_returns),
        "episode_lengths": list(c.episode_lengths),
        # isolated envs' worker restarts of the whole run (summary.json's env_events, metrics' env_restarts)
        "env_events": list(c.env.events) if isinstance(getattr(c.env, "events", None), list) else None,
        "rng": c.rng.bit_generator.state,
        "obs_normalizer": c.obs_normalizer.state_dict() if c.obs_normalizer else None,
        "reward_scaler": c.reward_scaler.state_dict() if c.reward_scaler else None,
        "inflight": None,  # below
        "space_spec": trainer.spec.__dict__,
        "observation_layout": c.encoder.layout(),
        "param_sha256": trainer.parameters_sha256(),
        "world_size": trainer.dist.world_size,
        **trainer._sidecar_extra(),
    }
    snapshot = env_state.capture(c.env) if c.obs is not None else None
    sidecar["inflight"] = c.inflight_state()
    if snapshot is None and c.obs is not None:
        sidecar["env_state_note"] = (f"{type(c.env).__name__} cannot be captured faithfully: "
                                     "a resumed run starts fresh episodes")
        # fresh episodes on resume: the in-flight observations would go unused (Atari: ~1 MB of frames as JSON)
        sidecar["inflight"] = {"fresh_episodes": True}
        for key in getattr(trainer, "INFLIGHT_EXTRA", ()):  # the algorithm's own in-flight keys, unused likewise
            sidecar[key] = None
    return write_checkpoint(prefix, tensors, sidecar, env_obj=snapshot, replay=trainer._replay_state())


def _jsonable(obj):
    return json.loads(json.dumps(obj))


def _function_choices(trainer, cfg: dict) -> dict:
    """The choices in a config (as a dict) that decide what function a model's weights compute but not their shapes
    (the feature extractor shows in the spaces' spec, compared on its own), as this trainer resolves them: a trainer
    that differs in one would load a checkpoint's weights without a complaint and act as another policy."""
    from ..envs.atari import resolve

    policy, env = cfg.get("policy") or {}, cfg.get("env") or {}
    out = {"policy.activation": policy.get("activation"), "env.normalize_obs": env.get("normalize_obs")}
    if env.get("normalize_obs"):
        out["env.clip_obs"] = env.get("clip_obs")
    if trainer.spec.cnn:  # (vector observations: actor and critic have their own networks either way)
        out["policy.share_features"] = policy.get("share_features")
    if env.get("preprocess") is not None:
        try:
            out["env.preprocess"] = resolve(env["preprocess"], env.get("id", ""), env.get("kwargs"))
        except ScaleboxError:
            out["env.preprocess"] = env["preprocess"]
    return {k: v for k, v in out.items() if v is not None}  # (a checkpoint from before a key existed: not compared)


def _env_changes(trainer, ck_env: dict, env_state_dict) -> list:
    """What builds other envs in this trainer than the checkpoint's: ``env.<key>`` names whose checkpoint value
    (``ck_env``, its config's env section) differs (a resolved ``env.preprocess`` that differs is refused before:
    another function), and the kind of vector env (``sandbox.isolation_level``: isolated workers or not), which
    ``env_state_dict`` (the checkpoint's captured env) shows."""
    from ..config import EnvConfig
    from ..envs import state as env_state

    changed = [f"env.{key}" for key in ("backend", "kwargs")
               if _jsonable(ck_env.get(key, getattr(EnvConfig(), key))) != _jsonable(getattr(trainer.config.env, key))]
    if not changed and not env_state.fits(trainer.collector.env, env_state_dict):
        changed.append(f"kind of vector env (here {type(trainer.collector.env).__name__}, e.g. by "
                       "sandbox.isolation_level)")
    return changed


def _check_same_function(trainer, ck_cfg: dict, prefix: str) -> None:
    theirs, ours = _function_choices(trainer, ck_cfg), _function_choices(trainer, trainer.config.to_dict())
    for key in theirs:
        if key in ours and theirs[key] != ours[key]:
            raise CheckpointError(f"checkpoint {prefix} was trained with {key}={theirs[key]!r}, this trainer has "
                                  f"{key}={ours[key]!r}: its weights would compute another function here; build the "
                                  "trainer from the checkpoint's config (load_trainer(path))")


def _unplaced(trainer, tensors: dict, named) -> list:
    """The checkpoint tensors none of this trainer's Parameters takes (its per-critic names of a TwinCritic ensemble
    count as taken): a model built from another config (SAC's ent_coef 'auto' has a temperature optimizer, AMP in
    DQN/SAC/TD3 a loss scaler), whose parameter hash the checkpoint's cannot match. PPO's loss scaler (``amp.*``)
    is outside the model and its hash: an AMP checkpoint loads into a float32 PPO trainer without it."""
    items = getattr(trainer.model, "checkpoint_items", None)
    taken = set()
    for name, _ in named:
        taken.add(name)
        if items is not None:
            taken.update(n for n, _ in items(name, tensors[name]))
    return sorted(n for n in tensors if n not in taken and not n.startswith("amp."))


def _config_hint(trainer, sc: dict) -> str:
    """'; it was trained with another config (key=old -> new, ...)' naming the first differences, or ''."""
    from .lifecycle import config_changes

    changes = config_changes(sc.get("config") or {}, trainer.config.to_dict(), free=())
    changes.sort(key=lambda change: change.startswith("run."))  # (what builds the model first; sort is stable)
    if not changes:
        return ""
    more = f", and {len(changes) - 4} more" if len(changes) > 4 else ""
    return (f"; it was trained with another config ({', '.join(changes[:4])}{more}: checkpoint -> this trainer); "
            "build the trainer from the checkpoint's config (load_trainer(path))")


def _layout_text(layout) -> str:
    """An observation layout (``ObsEncoder.layout``) in words: ``obs: multidiscrete (2,) nvec [3, 4]``."""
    try:
        return ", ".join(f"{'.'.join(map(str, leaf['path'])) or 'obs'}: {leaf['kind']} {tuple(leaf['shape'])}"
                         + (f" nvec {leaf['nvec']}" if leaf.get("nvec") else "") for leaf in layout)
    except (TypeError, KeyError, AttributeError):
        return repr(layout)


def load(trainer, path: str, replay: bool = True):
    """Restore parameters, optimizer, statistics, counters, RNG and env state (and, with ``replay``, the replay
    buffer's contents) from a checkpoint."""
    from .checkpoint import read_checkpoint

    # (a run that writes no replay does without one: a missing or damaged replay file is not fatal there)
    ck = read_checkpoint(path, replay=replay, check_replay=bool(trainer.config.run.save_replay))
    sc, tensors = ck["sidecar"], ck["tensors"]
    algo = (sc.get("config") or {}).get("algo", "ppo")
    if algo != trainer.algo:  # (the first difference the checks below found was an env or policy key)
        raise CheckpointError(f"checkpoint {ck['prefix']} is a {str(algo).upper()} checkpoint, this is a "
                              f"{type(trainer).__name__}; load_trainer(path) builds the trainer of its algorithm")
    spec = trainer.spec.__dict__
    old = sc.get("space_spec")
    try:  # checkpoints from before a SpaceSpec field existed: the field's default
        old = type(trainer.spec)(**old).__dict__ if isinstance(old, dict) else old
    except (TypeError, ValueError):
        pass
    if old != spec and _jsonable(old) != _jsonable(spec):
        raise CheckpointError(f"checkpoint {ck['prefix']} was made for spaces {sc.get('space_spec')}, "
                              f"this trainer has {spec}")
    ck_env = (sc.get("config") or {}).get("env", {})
    for key in ("id", "num_envs"):
        if ck_env.get(key) != getattr(trainer.config.env, key):
            raise CheckpointError(f"checkpoint {ck['prefix']} was made with env.{key}={ck_env.get(key)!r}, "
                                  f"this trainer has env.{key}={getattr(trainer.config.env, key)!r}")
    # (after the checks above, which name a changed width or env more fully: this is the same width's other meaning)
    layout = trainer.collector.encoder.layout()  # (older checkpoints: not recorded, not checked)
    if sc.get("observation_layout") is not None and _jsonable(sc["observation_layout"]) != _jsonable(layout):
        raise CheckpointError(f"checkpoint {ck['prefix']} was made for observations "
                              f"{_layout_text(sc['observation_layout'])}; this trainer's env has "
                              f"{_layout_text(layout)}")
    _check_same_function(trainer, sc.get("config") or {}, ck["prefix"])
    named = trainer._named_state()
    upgrade = getattr(trainer.model, "upgrade_tensors", None)  # (off-policy: checkpoints of the per-critic layout)
    if upgrade is not None:
        tensors = upgrade(tensors, [n for n, _ in named])
    missing = [n for n, _ in named if n not in tensors]
    if missing:
        raise CheckpointError(f"checkpoint {ck['prefix']} does not match this model: missing {missing[0]}"
                              + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
                              + _config_hint(trainer, sc))
    extra = _unplaced(trainer, tensors, named)
    if extra:  # (checked before anything is written: a refused load leaves the trainer as it was)
        raise CheckpointError(f"checkpoint {ck['prefix']} does not match this model: it holds {extra[0]}"
                              + (f" and {len(extra) - 1} more" if len(extra) > 1 else "")
                              + ", which this model has no place for" + _config_hint(trainer, sc))
    for name, param in named:
        arr = tensors[name] = trainer.model.to_storage(name, tensors[name])
        if tuple(arr.shape) != tuple(param.shape):
            raise CheckpointError(f"checkpoint {ck['prefix']}: {name} has shape {tuple(arr.shape)}, "
                                  f"the model expects {tuple(param.shape)}")
    trainer._values.restore([tensors[name] for name, _ in named])
    c = trainer.collector
    trainer.global_step = int(sc["global_step"])
    trainer.iteration = int(sc["iteration"])
    from .checkpoint import iteration_shape

    if iteration_shape(sc["config"]) == iteration_shape(trainer.config.to_dict()):
        trainer.steps_base = tuple(sc.get("steps_base", (0, 0)))
    else:  # (fine-tuning with another n_steps or train_freq: its iterations are counted from here)
        trainer.steps_base = (trainer.global_step, trainer.iteration)
    trainer.wall_time_s = float(sc["wall_time_s"])
    trainer.evaluations = [e for e in sc.get("evaluations") or [] if isinstance(e, dict)]  # (older checkpoints: none)
    c.episodes = int(sc["episodes"])
    c.episode_returns = collections.deque(sc["episode_returns"], maxlen=100)
    c.episode_lengths = collections.deque(sc["episode_lengths"], maxlen=100)
    if isinstance(getattr(c.env, "events", None), list):  # (before fresh_episodes below: its restarts come after)
        c.env.events[:] = [e for e in sc.get("env_events") or [] if isinstance(e, dict)]  # (older checkpoints: none)
    c.rng.bit_generator.state = sc["rng"]
    trainer._restore_extra(sc)
    if ck.get("replay") is not None:
        trainer._restore_replay(ck["replay"])
    else:  # (not saved, or not read: empty, whatever this trainer collected before)
        trainer._restore_replay(None)
        if replay and sc.get("replay_saved") is False and sc.get("replay_size"):
            trainer.log.warning("warning: checkpoint was saved without its replay buffer (run.save_replay: false): the "
                                "buffer starts empty (training resumed from here refills it)")
        elif replay and ck["replay_lost"]:
            trainer.log.warning(f"warning: checkpoint {os.path.basename(ck['prefix'])}: its replay buffer file is "
                                "missing or corrupt; with run.save_replay: false the buffer starts empty (training "
                                "resumed from here refills it)")
    if c.obs_normalizer is not None and sc.get("obs_normalizer"):
        c.obs_normalizer.load_state_dict(sc["obs_normalizer"])
    if c.reward_scaler is not None and sc.get("reward_scaler"):
        c.reward_scaler.load_state_dict(sc["reward_scaler"])
    inflight = sc.get("inflight")
    seed = trainer.config.run.seed

    def fresh_episodes():
        """Start this trainer's envs afresh, seeded from (seed, step) so a resume stays deterministic; the reward
        scaling's per-env discounted returns belonged to episodes that no longer run."""
        c.reset(seed=trainer._env_seed(seed + trainer.global_step), step=trainer.global_step,
                update_statistics=False)
        if c.reward_scaler is not None:
            c.reward_scaler.returns[:] = 0.0

    if trainer.dist.distributed and inflight is not None:
        # data parallel: rank 0's checkpoint holds rank 0's env state only; every rank restarts its episodes
        # from seeds derived from (seed, step, rank), and ranks > 0 their sampling stream likewise
        fresh_episodes()
        if trainer.dist.rank > 0:
            c.rng = np.random.Generator(np.random.PCG64([seed, trainer.global_step]).jumped(trainer.dist.rank))
    elif inflight is not None and sc.get("world_size", 1) != trainer.dist.world_size:
        # a data-parallel checkpoint in one process (evaluate, export, predict): rank 0's envs are a share of this
        # trainer's; start all of them afresh, seeded from (seed, step) (it cannot learn on: learn refuses)
        fresh_episodes()
    elif inflight is not None and ck["env"] is not None and (changes := _env_changes(trainer, ck_env, ck["env"])):
        # the checkpoint's pickled envs are not this trainer's (another env.kwargs or backend, e.g. fine-tuning on
        # changed dynamics; isolated workers): keep this trainer's envs, fresh episodes seeded from (seed, step)
        changed = " and ".join(changes)
        trainer.log.warning(f"warning: checkpoint {os.path.basename(ck['prefix'])}: its envs were built with another "
                            f"{changed} than this trainer's: its in-flight episodes are not restored; this "
                            "trainer's envs start fresh episodes")
        fresh_episodes()
    elif inflight is not None and ck["env"] is not None:
        from ..envs import state as env_state

        c.restore_inflight(env_state.restore(c.env, ck["env"]), inflight)
    elif inflight is None:  # saved before any env step: this trainer's own episodes, if any, are not the checkpoint's
        c.obs = None  # (learn's first reset, seeded from the run's seed and the step, as for the checkpointed trainer)
        if trainer.dist.distributed and trainer.dist.rank > 0:  # (the checkpoint's stream is rank 0's)
            c.rng = np.random.Generator(np.random.PCG64([seed, trainer.global_step]).jumped(trainer.dist.rank))
    else:
        # env could not be pickled: start fresh episodes (the statistics stay the checkpoint's: evaluate and export
        # load it, they must normalise as it says)
        fresh_episodes()
    if trainer.parameters_sha256() != sc.get("param_sha256"):
        raise CheckpointError(f"checkpoint {ck['prefix']}: restored parameters do not hash to the recorded "
                              "param_sha256")
    return trainer
