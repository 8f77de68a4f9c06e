"""Build gymnasium vector envs and describe their spaces.

``make_vec_env`` uses ``gymnasium.make_vec``: an env's own vectorised implementation where gymnasium has one and
the batch has at least ``VECTOR_ENTRY_MIN_ENVS`` envs (CartPole-v1: ~2.4x faster than SyncVectorEnv at 8 envs), else
``SyncVectorEnv``. Both run in
``AutoresetMode.NEXT_STEP``; see :mod:`scalebox_ms.buffers.rollout` for how steps after an episode end are
handled.
"""
from __future__ import annotations

import importlib
import logging
import os
import re
import sys
from typing import Optional

import numpy as np

from ..errors import ConfigError, first_line, short_repr, user_code_origin
from .spaces import SpaceSpec


# gymnasium's CartPoleVectorEnv takes ~180 us per step whatever the batch size (numpy calls on (N,) arrays), a
# SyncVectorEnv of CartPoleEnvs ~80 us for 1 env and ~185 us for 4 (Zen 1, 2026-12-03): the vector implementation
# from this many envs on (one-env DQN/SAC/TD3 presets step ~2.3x faster through SyncVectorEnv)
VECTOR_ENTRY_MIN_ENVS = 4

# An evaluation episode of an env registered without a step limit (CliffWalking-v1, a user's env) ends here: a
# deterministic policy that never reaches a terminal state would otherwise never finish its evaluation.
# env.kwargs.max_episode_steps sets a limit of the user's choice (for training too).
EVAL_MAX_EPISODE_STEPS = 10_000
_capped = set()


def _log_eval_cap(env_id: str, removed: bool = False) -> None:
    """Log once per env id that evaluation caps its episodes (``removed``: env.kwargs.max_episode_steps -1 took
    away the limit it is registered with)."""
    if env_id not in _capped:
        _capped.add(env_id)
        import logging

        why = ("runs without an episode step limit (env.kwargs.max_episode_steps: -1)" if removed else
               "is registered without an episode step limit (max_episode_steps)")
        logging.getLogger("scalebox_ms").info(
            "%s %s: evaluation episodes are cut (truncated) at %d steps unless the env ends them sooner (set "
            "env.kwargs.max_episode_steps to choose a limit)", env_id, why, EVAL_MAX_EPISODE_STEPS)


def make_vec_env(env_id: str, num_envs: int, kwargs=None, isolation: str = "none", step_timeout: float = 10.0,
                 worker_memory_limit: Optional[int] = None, backend: str = "gymnasium", preprocess: str = "none",
                 evaluation: bool = False):
    """A NEXT_STEP vector env; ``isolation`` 'process'/'strict' puts each sub-env in its own worker process;
    ``backend='native'`` gives the MindSpore implementation (:mod:`scalebox_ms.envs.native`); ``preprocess``
    is ``env.preprocess`` (:mod:`.atari`; ``evaluation``: the evaluation variant, whole games, raw rewards; an env
    without a step limit of its own gets one of ``EVAL_MAX_EPISODE_STEPS``)."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    from . import atari

    if backend == "native":
        from .native import SUPPORTED, make_native

        if env_id not in SUPPORTED:
            raise ConfigError(f"env.backend: native has no {short_repr(env_id)} (it has {', '.join(SUPPORTED)})")
        return make_native(env_id, num_envs)
    if backend == "envpool":
        from .envpool_env import EnvPoolVectorEnv

        return _probed(EnvPoolVectorEnv(env_id, num_envs, kwargs, preprocess=atari.resolve(preprocess, env_id, kwargs)),
                       env_id, kwargs)
    preprocess = atari.resolve(preprocess, env_id, kwargs)
    if preprocess == "atari":
        atari.require_atari_id(env_id)
    ale = atari.is_atari(env_id)
    given = dict(kwargs or {})  # (the user's env.kwargs, for messages: scalebox_ms may add some below)
    if ale:
        atari.check_kwargs(given)
    kwargs = atari.make_kwargs(preprocess, given)
    if "max_episode_steps" in kwargs and kwargs["max_episode_steps"] is None:  # (null: the registered limit, as for
        del kwargs["max_episode_steps"]  # gym.make; CartPoleVectorEnv compared its step counts with None)
    wrap = (preprocess, evaluation)
    registered_id = env_id
    if ":" in env_id:  # gymnasium's "module:Env-v0": import the module that registers the env
        module, registered_id = env_id.split(":", 1)
        if not module or not registered_id:
            raise ConfigError(f"env.id: {short_repr(env_id)}: expected 'module:EnvName-v0'")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"env.id: {short_repr(env_id)}: cannot import {module!r} ({exc})") from None
        except (Exception, SystemExit) as exc:  # the user's module fails while it is imported (any error of theirs;
            # sys.exit(0) in it ended train with exit 0 and nothing trained)
            raise ConfigError(f"env.id: {short_repr(env_id)}: importing {module!r} raised {_raised(exc)}") from None
    if ale:
        atari.import_ale(preprocess)
    try:
        spec = gym.spec(registered_id)
    except gym.error.Error as exc:
        raise ConfigError(f"env.id: unknown environment {short_repr(env_id)} ({first_line(exc)})") from None
    if is_mujoco(spec):
        route_mujoco_warnings()
    # (env.kwargs.max_episode_steps -1: gymnasium's "no TimeLimit", as for an env registered without one)
    unlimited = kwargs.get("max_episode_steps", spec.max_episode_steps) in (None, -1)
    if evaluation and unlimited and not ale:  # (ALE cuts its games itself: max_num_frames_per_episode)
        removed = kwargs.get("max_episode_steps") == -1
        kwargs["max_episode_steps"] = EVAL_MAX_EPISODE_STEPS
        _log_eval_cap(env_id, removed)
    try:
        if isolation in ("process", "strict"):
            from .isolated import IsolatedVectorEnv, WorkerFailure

            try:
                env = IsolatedVectorEnv(env_id, num_envs, kwargs, step_timeout=step_timeout,
                                        memory_limit_bytes=worker_memory_limit, wrap=wrap)
            except WorkerFailure as exc:
                raise ConfigError(f"env.id: {short_repr(env_id)} cannot start in an isolated worker ({exc.kind}: "
                                  f"{first_line(exc)}); {_worker_start_hint(str(exc))}") from None
        else:
            mode = ("vector_entry_point" if spec.vector_entry_point is not None and not kwargs.get("render_mode")
                    and preprocess == "none" and num_envs >= VECTOR_ENTRY_MIN_ENVS
                    and kwargs.get("max_episode_steps") != -1  # (CartPoleVectorEnv cut every episode at step 1)
                    and not ale else "sync")  # (ale-py's is its own preprocessing pipeline)
            # (each sub-env of a SyncVectorEnv: Atari's preprocessing, then its info cut to what is read; gymnasium's
            # own vector envs take no wrappers)
            extra = {"wrappers": atari.wrappers(*wrap) + [atari.OnlyGameEnd]} if mode == "sync" else {}
            if mode == "vector_entry_point" and kwargs:  # its own checks of env.kwargs may be laxer than the single
                gym.make(env_id, **kwargs).close()  # env's, which evaluation plays (CartPole: max_episode_steps 0)
            env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode, **extra, **kwargs)
    except ConfigError:
        raise  # (already names the culprit: not wrapped again below, ConfigError being a ValueError)
    except gym.error.DependencyNotInstalled as exc:
        extra = ("; scalebox_ms's extra: pip install -e \".[mujoco]\"" if "mujoco" in str(exc).lower() else "")
        raise ConfigError(f"env.id: {short_repr(env_id)} needs an optional dependency ({first_line(exc)}){extra}") \
            from None
    except (gym.error.Error, TypeError, ValueError) as exc:
        added = {k: v for k, v in kwargs.items() if k not in given}  # (Atari's frameskip, evaluation's step cap)
        raise ConfigError(f"env.id: cannot create {short_repr(env_id)} with env.kwargs={short_repr(given)}"
                          + (f" (and {short_repr(added)} set by scalebox_ms)" if added else "")
                          + f" ({first_line(exc)})") from None
    except (Exception, SystemExit) as exc:  # the env's own constructor (or its entry point) failed: name it and where
        raise ConfigError(f"env.id: cannot create {short_repr(env_id)}: {_raised(exc)}") from None
    autoreset = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if AutoresetMode(autoreset) != AutoresetMode.NEXT_STEP:
        close_env(env, env_id)
        raise ConfigError(f"env.id: {short_repr(env_id)} vector env uses autoreset mode {autoreset}; scalebox_ms needs NEXT_STEP")
    return _probed(env, env_id, kwargs)


def is_mujoco(spec) -> bool:
    return isinstance(spec.entry_point, str) and spec.entry_point.startswith("gymnasium.envs.mujoco")


def route_mujoco_warnings() -> None:
    """MuJoCo's warnings through the ``scalebox_ms`` logger, each distinct one once, instead of MuJoCo's own handler
    (stderr, and a ``MUJOCO_LOG.TXT`` appended in the working directory). Dropped: the deprecation of
    ``settotalmass`` in gymnasium's own model files, printed twice per process whatever the user does. A handler
    the user installed stays."""
    try:
        import mujoco
    except Exception:  # (not installed, or broken: gymnasium's own error names it when the env is made)
        return
    if mujoco.get_mju_user_warning() is not None:  # (ours already, or the user's own)
        return
    seen = set()

    def warn(text: str) -> None:
        if "'settotalmass' is deprecated" not in text and text not in seen:
            seen.add(text)
            logging.getLogger("scalebox_ms").warning(f"warning: MuJoCo: {text}")

    mujoco.set_mju_user_warning(warn)


def _worker_start_hint(failure: str) -> str:
    """What to do about an isolated worker that failed while starting (``failure``: its error's text)."""
    if re.search(r"\b(Name|Namespace|Version)NotFound\b", failure):  # (registered in this process only)
        return ("each worker is a fresh Python process: register the env when a module is imported and give env.id "
                "as 'module:EnvName-v0' (the worker imports the module)")
    return "check sandbox.worker_memory_limit/step_timeout" + _main_guard_hint()


def _main_guard_hint() -> str:
    """A hint for a worker that died while starting, when the process runs a script of the user's: spawned workers
    import the main module, and one that builds a trainer at its top level (no ``if __name__ == "__main__":``)
    makes each worker fail as it starts."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is not None or not isinstance(path, str) or not path.endswith(".py"):
        return ""  # (python -m: a module's own main, as our CLIs; a console script; a notebook)
    return (f"; or, if {os.path.basename(main.__file__)} builds the trainer at its top level, put that under "
            "'if __name__ == \"__main__\":' (each isolated worker imports the main module)")


def _raised(exc: BaseException) -> str:
    """'<type> (<file:line in function>): <message>' of an exception raised by a user's env code; for SystemExit
    (``sys.exit()`` in it), what was called."""
    if isinstance(exc, SystemExit):
        return f"SystemExit{user_code_origin(exc)}: it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}{user_code_origin(exc)}: {first_line(exc)}"


def close_env(env, env_id: str) -> None:
    """``env.close()``; an env whose close() raises is logged, not raised: the work is done by then (and an error
    that stopped it must not be replaced by this one: a close() that reads what only reset() sets fails exactly
    when reset failed)."""
    try:
        env.close()
    except Exception as exc:
        logging.getLogger("scalebox_ms").warning("warning: env %r: close() raised %s: %s", env_id, type(exc).__name__,
                                                 first_line(exc))


def _probed(env, env_id: str, kwargs):
    """``env`` once its spaces are known to be supported and one probe step works (else closed, ConfigError)."""
    try:
        space_spec(env.single_observation_space, env.single_action_space, env_id, features="mlp")
    except ConfigError:
        close_env(env, env_id)
        raise
    call = "reset"
    try:  # one probe step, so bad env.kwargs fail here (before a run directory exists), not mid-training
        env.reset(seed=0)
        call = "step"
        env.step(env.action_space.sample())
    except Exception as exc:
        # (asked before the env is closed, and only of an unpacking-like error: it runs the env's reset again)
        old_api = _old_gym_api(env) if isinstance(exc, (ValueError, TypeError)) else None
        close_env(env, env_id)
        what = "cannot reset" if call == "reset" else "fails its first step"
        if old_api:
            raise ConfigError(f"env.id: {short_repr(env_id)} follows gym's older API ({old_api}); scalebox_ms needs "
                              "gymnasium's: reset() -> (observation, info), step() -> (observation, reward, "
                              "terminated, truncated, info)") from None
        if _in_info_batching(exc):  # (not the env's code, nor its kwargs: gymnasium's batching of its infos)
            raise ConfigError(f"env.id: {short_repr(env_id)}: gymnasium's vector env cannot batch the info dict of "
                              f"its {call} ({type(exc).__name__}: {first_line(exc)}); each info key needs one shape "
                              "and type from step to step") from None
        raise ConfigError(f"env.id: {short_repr(env_id)} with env.kwargs={short_repr(kwargs)} {what} "
                          f"({type(exc).__name__}: {first_line(exc)})") from None
    return env


def _old_gym_api(env) -> Optional[str]:
    """What of gym's older API (before gymnasium) a sub-env of a vector env that failed its probe follows, if any:
    reset returning the observation alone, step returning 4 values (gymnasium then fails with an unpacking error that
    names neither). Asks the first sub-env's own reset and step, past its wrappers."""
    subs = getattr(env, "envs", None)
    if not subs:
        return None
    sub = subs[0].unwrapped
    try:
        out = sub.reset(seed=0)
        if not (isinstance(out, tuple) and len(out) == 2):
            return "reset() returned the observation alone"
        out = sub.step(env.single_action_space.sample())
    except Exception:  # (its own error: the probe's message says it)
        return None
    return "step() returned 4 values" if isinstance(out, tuple) and len(out) == 4 else None


def _in_info_batching(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside gymnasium's vector env batching a sub-env's info (``_add_info``)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_add_info" and "gymnasium" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def space_spec(obs_space, act_space, env_id: str = "env", features: str = "auto") -> SpaceSpec:
    """Check the spaces are supported and describe them; ConfigError names what is not supported.

    Observations: any space :class:`~.obs_encoding.ObsEncoder` encodes (``obs_dim`` is its encoded width;
    ``features`` is ``policy.features``). Actions: Discrete, 1-D bounded Box, 1-D MultiDiscrete, 1-D MultiBinary
    (see :mod:`.spaces`)."""
    import functools

    from gymnasium import spaces

    from .obs_encoding import ObsEncoder

    enc = ObsEncoder(obs_space, env_id, features)
    SpaceSpec_ = functools.partial(SpaceSpec, image_shape=enc.obs_shape if enc.image else None,
                                   image_parts=enc.image_parts)
    obs_dim = enc.obs_dim
    where = f"env.id: {short_repr(env_id)} has"
    if obs_dim == 0 or 0 in np.shape(getattr(act_space, "nvec", getattr(act_space, "low", 1))):
        # (a zero-width layer: MindSpore's initializer failed with a traceback)
        empty = "observation" if obs_dim == 0 else "action"
        raise ConfigError(f"{where} an empty {empty} space ({short_repr(obs_space if obs_dim == 0 else act_space)}): "
                          f"no {empty} values")
    if isinstance(act_space, spaces.Discrete):
        if int(act_space.start) != 0:
            raise ConfigError(f"{where} Discrete actions starting at {act_space.start}; only start=0 is supported")
        return SpaceSpec_(obs_dim=obs_dim, discrete=True, action_dim=int(act_space.n))
    if isinstance(act_space, spaces.Box):
        if len(act_space.shape) != 1:
            raise ConfigError(f"{where} a Box action space of shape {act_space.shape}; only 1-D is supported")
        if not np.issubdtype(act_space.dtype, np.floating):  # (the policy's float actions would be off-space)
            raise ConfigError(f"{where} a Box action space of {act_space.dtype} values; continuous actions need a "
                              "float Box (integer actions: Discrete or MultiDiscrete)")
        if not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
            raise ConfigError(f"{where} an unbounded Box action space; bounds are required")
        return SpaceSpec_(obs_dim=obs_dim, discrete=False, action_dim=int(act_space.shape[0]),
                          low=tuple(float(x) for x in act_space.low), high=tuple(float(x) for x in act_space.high))
    if isinstance(act_space, spaces.MultiDiscrete):
        if len(act_space.shape) != 1:
            raise ConfigError(f"{where} a MultiDiscrete action space of shape {act_space.shape}; only 1-D is supported")
        nvec = tuple(int(n) for n in act_space.nvec)
        start = tuple(int(s) for s in getattr(act_space, "start", np.zeros(len(nvec), np.int64)))
        return SpaceSpec_(obs_dim=obs_dim, discrete=False, action_dim=len(nvec), action_kind="multidiscrete",
                          nvec=nvec, action_start=start)
    if isinstance(act_space, spaces.MultiBinary):
        if np.ndim(act_space.n) != 0 and len(act_space.shape) != 1:
            raise ConfigError(f"{where} a MultiBinary action space of shape {act_space.shape}; only 1-D is supported")
        return SpaceSpec_(obs_dim=obs_dim, discrete=False, action_dim=int(np.prod(act_space.shape)),
                          action_kind="multibinary")
    raise ConfigError(f"{where} action space {type(act_space).__name__}; scalebox_ms supports Discrete, Box, "
                      "MultiDiscrete and MultiBinary actions")
