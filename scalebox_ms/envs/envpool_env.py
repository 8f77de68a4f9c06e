"""``env.backend: envpool``: EnvPool's batched C++ envs (the ``[envpool]`` extra, envpool 1.2.x) as a gymnasium
``VectorEnv``.

EnvPool steps all N envs in C++ threads and already speaks gymnasium's vector API in ``NEXT_STEP`` autoreset mode
(the step after an episode's end returns the reset observation with reward 0 and ignores its action), which is what
the collector expects of every backend. :class:`EnvPoolVectorEnv` adds what EnvPool lacks: ``reset(seed=...)``
(EnvPool seeds env i with ``seed + i`` when the pool is built, so a seeded reset builds a new pool), gymnasium's
``single_*``/batched spaces, and one-line :class:`ConfigError` s for a missing extra or an id EnvPool does not have.

What differs from gymnasium's envs: EnvPool's own implementations (and its own reset noise), so episodes differ for
the same seed; a pool cannot be pickled, so checkpoints resume with fresh episodes seeded from (seed, step), as for
MuJoCo; ``env.kwargs`` go to ``envpool.make_gymnasium``. Evaluation, as for every backend, runs gymnasium's env of
the same id. Atari ids are refused: EnvPool's Atari preprocessing is its own, and evaluation would run ours.
"""
from __future__ import annotations

import warnings
from typing import Optional

import numpy as np

from ..errors import ConfigError, short_repr

#: threads EnvPool steps the envs with: 0 is EnvPool's own default (one per core, at most num_envs)
DEFAULT_THREADS = 0


def _envpool():
    try:
        import envpool
    except ImportError:
        raise ConfigError("env.backend: envpool needs the optional extra: pip install -e \".[envpool]\" "
                          "(envpool 1.2.x)") from None
    return envpool


def check_id(env_id: str) -> None:
    """ConfigError unless EnvPool has ``env_id`` (and it is not an Atari game)."""
    envpool = _envpool()
    from .atari import is_atari

    if is_atari(env_id):
        raise ConfigError(f"env.backend: envpool is not used for Atari ({short_repr(env_id)}): its preprocessing "
                          "differs from the evaluation's; use env.backend gymnasium")
    if env_id not in envpool.list_all_envs():
        raise ConfigError(f"env.backend: envpool has no {short_repr(env_id)} (envpool.list_all_envs() lists its ids)")


class EnvPoolVectorEnv:
    """``num_envs`` EnvPool envs of ``env_id`` behind gymnasium's ``VectorEnv`` interface (NEXT_STEP autoreset)."""

    def __init__(self, env_id: str, num_envs: int, kwargs: Optional[dict] = None, seed: int = 0):
        from gymnasium.vector import AutoresetMode
        from gymnasium.vector.utils import batch_space

        check_id(env_id)
        self.env_id, self.num_envs, self.kwargs = env_id, int(num_envs), dict(kwargs or {})
        self._pool = None
        self._seed = None
        self._build(seed)
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
            with warnings.catch_warnings():  # EnvPool's float64 Box bounds: gymnasium warns on the float32 cast
                warnings.filterwarnings("ignore", message=".*precision lowered.*")
                self._pool = envpool.make_gymnasium(self.env_id, num_envs=self.num_envs, seed=int(seed),
                                                    num_threads=DEFAULT_THREADS, **self.kwargs)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"env.kwargs: envpool cannot make {short_repr(self.env_id)} with "
                              f"{short_repr(self.kwargs)} ({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})") from None
        self._seed = int(seed)

    def reset(self, seed: Optional[int] = None, options=None):
        if seed is not None:  # gymnasium's semantics: a seed restarts the envs' RNGs (EnvPool: a new pool)
            self._build(seed)
        obs, info = self._pool.reset()
        return obs, info

    def step(self, actions):
        return self._pool.step(np.asarray(actions, dtype=self._action_dtype))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __repr__(self) -> str:
        return f"EnvPoolVectorEnv({self.env_id!r}, num_envs={self.num_envs})"
