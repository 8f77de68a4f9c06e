"""``env.backend: envpool``: EnvPool's batched C++ envs (the ``[envpool]`` extra, envpool 1.2.x) as a gymnasium
``VectorEnv``.

EnvPool steps all N envs in C++ threads and already speaks gymnasium's vector API in ``NEXT_STEP`` autoreset mode
(the step after an episode's end returns the reset observation with reward 0 and ignores its action), which is what
the collector expects of every backend. :class:`EnvPoolVectorEnv` adds what EnvPool lacks: ``reset(seed=...)``
(EnvPool seeds env i with ``seed + i`` when the pool is built, so a seeded reset builds a new pool), gymnasium's
``single_*``/batched spaces, and one-line :class:`ConfigError` s for a missing extra or an id EnvPool does not have.

What differs from gymnasium's envs: EnvPool's own implementations (and its own reset noise), so episodes differ for
the same seed; an episode that ends itself on its last allowed step (``max_episode_steps``) is reported by EnvPool as
truncated only, where gymnasium's TimeLimit keeps ``terminated`` too: for the classic-control ids the wrapper
restores the flag from the observation (:mod:`.native.dynamics`' ``terminal``), other envs (MuJoCo's Hopper,
Walker2d, Ant, Humanoid) keep EnvPool's flags, so such a step bootstraps; a pool cannot be pickled, so checkpoints
resume with fresh episodes seeded from (seed, step), as for MuJoCo; ``env.kwargs`` go to ``envpool.make_gymnasium``.
Evaluation, as for every backend, runs gymnasium's env of the same id.

Atari (``ALE/Breakout-v5`` -> EnvPool's ``Breakout-v5``, ``env.preprocess`` auto/atari): EnvPool preprocesses in
C++ with the settings of :data:`ATARI_TRAINING`, chosen to match the gymnasium training pipeline of
:mod:`.atari` (no-op reset, frame skip 4 with max-pooling, 84x84 grey by INTER_AREA, a lost life ends the training
episode, rewards clipped to their sign, 4 frames stacked, ALE v5's sticky actions and 27,000-step limit). Whole
games are reported as :class:`~.atari.GameStats` does (``info["game_return"]`` from EnvPool's unclipped
``info["reward"]``, at the step where ``info["terminated"]`` says the game is over); ``game_length`` counts agent
steps times the frame skip (EnvPool's ``elapsed_step``; the no-op frames of the reset are not counted). A game
that ends inside a reset's no-op actions (EnvPool then starts the next one without flagging the end) is reported
at the step where its lives go up again.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Optional

import numpy as np

from ..errors import ConfigError, import_failure, short_repr

#: threads EnvPool steps the envs with: 0 is EnvPool's own default (one per core, at most num_envs)
DEFAULT_THREADS = 0


def _envpool():
    why = import_failure("envpool")
    if why == "not installed":
        raise ConfigError("env.backend: envpool needs the optional extra: pip install -e \".[envpool]\" "
                          "(envpool 1.2.x)")
    if why:  # (installed but broken: a protobuf or numpy it was not built for, a library of its own missing)
        raise ConfigError(f"env.backend: envpool is {why}; reinstall it: pip install -e \".[envpool]\"")
    import envpool

    return envpool


#: EnvPool's Atari options for training envs: the gymnasium pipeline's settings (envs/atari.py)
ATARI_TRAINING = {"noop_max": 30, "frame_skip": 4, "img_height": 84, "img_width": 84, "gray_scale": True,
                  "use_inter_area_resize": True, "episodic_life": True, "reward_clip": True, "stack_num": 4,
                  "use_fire_reset": True, "repeat_action_probability": 0.25, "max_episode_steps": 27_000}
#: the keys of :data:`ATARI_TRAINING` env.kwargs may set: ale-py's own options, the same on both backends
ATARI_OPTIONS = ("repeat_action_probability",)

#: EnvPool's pool settings (``envpool.make``), not env options: scalebox_ms sets the pool (num_envs = env.num_envs,
#: batch_size = num_envs: synchronous; the task from env.id); given in env.kwargs they changed what was trained
POOL_KEYS = ("batch_size", "max_num_players", "num_envs", "num_threads", "seed", "env_seed", "task", "task_id",
             "thread_affinity_offset", "env_type", "gym_reset_return_info")

#: EnvPool takes int32 seeds only (an AssertionError at the first reset), and int32 step limits
INT32_SEEDS = 2**31


def pool_seed(seed: int) -> int:
    """EnvPool's seed for ``seed``: itself where it is an int32, else reduced into that range (run.seed goes up to
    2**32 - 1, and a resume reseeds from run.seed + the step)."""
    return int(seed) % INT32_SEEDS


def pool_id(env_id: str) -> str:
    """EnvPool's id of ``env_id``: ale-py's ``ALE/Breakout-v5`` is EnvPool's ``Breakout-v5``."""
    name = env_id.split(":", 1)[-1]
    return name[len("ALE/"):] if name.startswith("ALE/") else env_id


def check_id(env_id: str) -> None:
    """ConfigError unless EnvPool has ``env_id``."""
    from .atari import is_atari

    envpool = _envpool()
    if pool_id(env_id) not in envpool.list_all_envs():
        hint = ("EnvPool runs ale-py's v5 games: ALE/<Game>-v5, or env.backend gymnasium for the legacy v4 ids"
                if is_atari(env_id) else "envpool.list_all_envs() lists its ids")
        raise ConfigError(f"env.backend: envpool has no {short_repr(env_id)} ({hint})")


@contextlib.contextmanager
def _no_precision_warning():
    """Without gymnasium's 'precision lowered by casting to float32' warning: EnvPool builds its Box spaces from
    float64 bounds anew on every reset and step (and every catch_warnings exit re-arms a shown warning)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered.*")
        yield


class EnvPoolVectorEnv:
    """``num_envs`` EnvPool envs of ``env_id`` behind gymnasium's ``VectorEnv`` interface (NEXT_STEP autoreset)."""

    def __init__(self, env_id: str, num_envs: int, kwargs: Optional[dict] = None, seed: int = 0,
                 preprocess: str = "none"):
        from gymnasium.vector import AutoresetMode
        from gymnasium.vector.utils import batch_space

        from .atari import is_atari, require_atari_id

        check_id(env_id)
        self.env_id, self.num_envs, self.kwargs = env_id, int(num_envs), dict(kwargs or {})
        self.atari = preprocess == "atari"
        if self.atari:
            require_atari_id(env_id)
        ale = is_atari(env_id)
        if ale and self.kwargs.get("obs_type") == "ram":
            raise ConfigError("env.kwargs.obs_type: ram is not available with env.backend envpool (EnvPool's Atari "
                              "envs give screen frames); use env.backend gymnasium")
        if ale and not self.atari:
            raise ConfigError(f"env.preprocess: none with env.backend envpool: EnvPool's Atari envs always "
                              f"preprocess ({short_repr(env_id)}); use auto (or backend gymnasium for raw frames)")
        pool = sorted(set(self.kwargs) & set(POOL_KEYS))
        if pool:  # (batch_size < num_envs made EnvPool asynchronous: steps of a part of the envs, a shape error later)
            raise ConfigError(f"env.kwargs.{pool[0]}: an EnvPool pool setting, not an env option; scalebox_ms sets "
                              "the pool itself (num_envs: env.num_envs, synchronous, the task: env.id)")
        # (sticky actions are an option of gymnasium's ALE env too, which evaluates: both take env.kwargs' value;
        # it was refused, so EnvPool could not train without them, rl-zoo3's NoFrameskip setting)
        clash = sorted(set(self.kwargs) & set(ATARI_TRAINING) - set(ATARI_OPTIONS)) if self.atari else []
        if clash:  # evaluation passes env.kwargs to gymnasium's pipeline, whose preprocessing has no such options
            raise ConfigError(f"env.kwargs.{clash[0]}: EnvPool's Atari preprocessing is fixed to the gymnasium "
                              "pipeline's settings (evaluation runs gymnasium's env with the same env.kwargs)")
        if ale:
            from .atari import check_kwargs

            check_kwargs(self.kwargs)
        self._options = {**(ATARI_TRAINING if self.atari else {}), **self.kwargs}
        limit = self._options.get("max_episode_steps")
        if limit is None:  # (null: the registered limit, as gym.make takes it; EnvPool's own default)
            self._options.pop("max_episode_steps", None)
        elif limit == -1 and not isinstance(limit, bool):  # (gymnasium's "no TimeLimit"; EnvPool cut every 2nd step)
            self._options["max_episode_steps"] = INT32_SEEDS - 1
        elif isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or not 1 <= limit < INT32_SEEDS:
            # (0 or -2: EnvPool truncated every other step, silently; gymnasium refuses them)
            raise ConfigError(f"env.kwargs.max_episode_steps: must be a whole number in [1, {INT32_SEEDS - 1}] (or -1: "
                              f"no limit, null: the env's own), got {short_repr(limit)}")
        from .native import SUPPORTED

        # classic control: the termination rule on the observation, for episodes that end on their last step
        self._terminal = None
        if env_id in SUPPORTED:
            from .native.dynamics import DYNAMICS

            self._terminal = DYNAMICS[env_id]().terminal
        self._game_return = np.zeros(self.num_envs)
        self._lives = np.zeros(self.num_envs, np.int64)
        self._elapsed = np.zeros(self.num_envs, np.int64)
        self._ended = np.zeros(self.num_envs, bool)  # a game ended at the previous step (the next is its reset)
        self._pool = None
        self._seed = None
        self._build(seed)
        with _no_precision_warning():
            self.single_observation_space = self._pool.observation_space
            self.single_action_space = self._pool.action_space
            self.observation_space = batch_space(self.single_observation_space, self.num_envs)
            self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
        self._action_dtype = self.single_action_space.dtype

    def _build(self, seed: int) -> None:
        envpool = _envpool()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        try:
            with _no_precision_warning():
                self._pool = envpool.make_gymnasium(pool_id(self.env_id), num_envs=self.num_envs,
                                                    seed=pool_seed(seed), num_threads=DEFAULT_THREADS, **self._options)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"env.kwargs: envpool cannot make {short_repr(self.env_id)} with "
                              f"{short_repr(self.kwargs)} ({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})") from None
        self._seed = int(seed)

    def reset(self, seed: Optional[int] = None, options=None):
        if seed is not None:  # gymnasium's semantics: a seed restarts the envs' RNGs (EnvPool: a new pool)
            self._build(seed)
        with _no_precision_warning():
            obs, info = self._pool.reset()
        self._game_return[:] = 0.0
        if self.atari:
            self._lives[:] = info["lives"]
            self._elapsed[:] = 0
            self._ended[:] = False
        return obs, info

    def step(self, actions):
        with _no_precision_warning():
            out = self._pool.step(np.asarray(actions, dtype=self._action_dtype))
        if not self.atari:
            obs, reward, terminated, truncated, info = out
            if self._terminal is not None and np.any(truncated):  # EnvPool: done & ~truncated, where gymnasium's
                # TimeLimit keeps terminated for an episode that ends itself on its last allowed step
                terminated = np.asarray(terminated, bool) | (np.asarray(truncated, bool) & self._terminal(obs))
            return obs, reward, terminated, truncated, info
        obs, reward, terminated, truncated, info = out
        lives, elapsed = np.asarray(info["lives"]), np.asarray(info["elapsed_step"])
        over = (np.asarray(info["terminated"]) > 0) | np.asarray(truncated, bool)
        # a game that ended inside the no-ops of a life's reset is never flagged: the lives went up instead
        restarted = (lives > self._lives) & ~over & ~self._ended
        length = np.where(restarted, self._elapsed, elapsed)
        game_return = self._game_return.copy()
        self._game_return += info["reward"]  # (unclipped; 0 on the autoreset step after a game's end)
        game_return[~restarted] = self._game_return[~restarted]
        ended = over | restarted
        if ended.any():  # whole games, as envs.atari.GameStats reports them
            frame_skip = self._options["frame_skip"]
            info = {**info, "game_return": np.where(ended, game_return, 0.0), "_game_return": ended,
                    "game_length": np.where(ended, length * frame_skip, 0), "_game_length": ended}
            self._game_return[over] = 0.0
            self._game_return[restarted] = np.asarray(info["reward"])[restarted]  # (the new game's first step)
        self._lives, self._elapsed, self._ended = lives.copy(), elapsed.copy(), ended
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __repr__(self) -> str:
        return f"EnvPoolVectorEnv({self.env_id!r}, num_envs={self.num_envs})"
