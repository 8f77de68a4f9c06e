"""Atari's standard preprocessing (``env.preprocess: atari``), from gymnasium's and ale-py's own pieces.

Training envs, innermost first (the order of Stable-Baselines3's ``AtariWrapper`` + ``VecFrameStack``):

1. :class:`GameStats` -- the raw game's return and length (frames), put into ``info["game_return"]`` /
   ``info["game_length"]`` when the game ends (SB3's ``Monitor``): the episode statistics scalebox_ms reports
   for Atari are whole games with unclipped rewards, not lives with clipped rewards.
2. ``gymnasium.wrappers.AtariPreprocessing`` -- up to 30 no-op actions on reset, frame skip 4 with max-pooling
   over the last two frames, 84x84 greyscale (the base env is made with ``frameskip=1``; ALE v5's sticky actions,
   ``repeat_action_probability=0.25``, stay as ale-py sets them).
3. :class:`EpisodicLife` -- a lost life ends the *training* episode (``terminated``), and the reset that follows
   continues the same game with a no-op step instead of restarting it (SB3's ``EpisodicLifeEnv``; gymnasium's
   ``terminal_on_life_loss`` restarts the game instead).
4. :class:`FireReset` -- for games with a FIRE action, FIRE then action 2 after every reset (SB3's
   ``FireResetEnv``; Breakout does not launch the ball otherwise).
5. ``gymnasium.wrappers.TransformReward(np.sign)`` -- rewards clipped to their sign.
6. ``gymnasium.wrappers.FrameStackObservation(4)`` -- the last 4 frames, uint8 ``(4, 84, 84)``.

Evaluation envs (``evaluation=True``) get 2, 4 and 6 only: whole games with unclipped rewards.

This module imports gymnasium and numpy only, so process-isolated workers (:mod:`.isolated`) can use it.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

FRAME_STACK = 4


def is_atari(env_id: str) -> bool:
    """An ale-py env id: ``ALE/Breakout-v5`` (or ``ale_py:ALE/...``), or one of the legacy ids ale-py registers
    when imported (``BreakoutNoFrameskip-v4``, ``Breakout-v4``: gymnasium's registry names ale-py as their entry
    point). ale-py is imported only for an id gymnasium does not know yet, so other envs never pay for it."""
    module, _, name = env_id.rpartition(":")
    if module not in ("", "ale_py"):  # a user's module registers the env: not ale-py's (an ALE/ name of its own too)
        return False
    if name.startswith("ALE/"):
        return True
    import gymnasium as gym

    spec = gym.registry.get(name)
    if spec is None:
        import importlib.util

        if importlib.util.find_spec("ale_py") is None:
            return False
        import ale_py  # noqa: F401  (registers its ids)

        spec = gym.registry.get(name)
    return spec is not None and str(spec.entry_point).startswith("ale_py")


def resolve(preprocess: str, env_id: str, kwargs: Optional[dict] = None) -> str:
    """``env.preprocess`` 'auto' -> 'atari' for ale-py envs with screen observations, else 'none' (ale-py's
    ``obs_type: ram`` is a flat 128-byte vector for the MLP). 'atari' with ``obs_type: ram`` is a ConfigError:
    the preprocessing reads the screen."""
    ram = (kwargs or {}).get("obs_type") == "ram"
    if preprocess == "auto":
        return "atari" if is_atari(env_id) and not ram else "none"
    if preprocess == "atari" and ram:
        from ..errors import ConfigError

        raise ConfigError("env.preprocess: atari reads the screen and cannot run with env.kwargs.obs_type ram "
                          "(use preprocess auto or none: the RAM vector trains an MLP)")
    return preprocess


def require_atari_id(env_id: str) -> None:
    """ConfigError unless ``env_id`` is an ale-py env (``env.preprocess: atari``)."""
    if not is_atari(env_id):
        from ..errors import ConfigError, short_repr

        raise ConfigError(f"env.preprocess: atari needs an ale-py env id (ALE/Breakout-v5, BreakoutNoFrameskip-v4, "
                          f"...), not {short_repr(env_id)}")


def check_kwargs(kwargs: dict) -> None:
    """ConfigError for the ale-py arguments ale-py itself takes out of range: a ``repeat_action_probability``
    outside [0, 1] (2.0 repeated every action: the agent's actions were ignored)."""
    p = kwargs.get("repeat_action_probability")
    if p is not None and not (isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1):
        from ..errors import ConfigError, short_repr

        raise ConfigError(f"env.kwargs.repeat_action_probability: must be a number in [0, 1], got {short_repr(p)}")


def make_kwargs(preprocess: str, kwargs: dict) -> dict:
    """The base env's keyword arguments: AtariPreprocessing skips frames itself, so ALE must not."""
    if preprocess == "atari":
        return {"frameskip": 1, **kwargs}
    return dict(kwargs)


def wrappers(preprocess: str, evaluation: bool = False) -> list:
    """The wrapper constructors to apply to each sub-env, innermost first."""
    if preprocess != "atari":
        return []
    import gymnasium as gym

    def preprocessing(env):
        return gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                                               terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)

    def stack(env):
        return gym.wrappers.FrameStackObservation(env, FRAME_STACK)

    if evaluation:
        return [preprocessing, FireReset, stack]
    return [GameStats, preprocessing, EpisodicLife, FireReset, lambda env: gym.wrappers.TransformReward(env, np.sign),
            stack]


def wrap(env, preprocess: str, evaluation: bool = False):
    for w in wrappers(preprocess, evaluation):
        env = w(env)
    return env


def import_ale(preprocess: str = "atari") -> None:
    """ale-py registers the ``ALE/`` ids with gymnasium when imported; gymnasium's resize wrapper of the Atari
    preprocessing (``preprocess`` 'atari') needs OpenCV."""
    from ..errors import ConfigError, import_failure

    needs = (("ale_py", "ale-py"),) + ((("cv2", "opencv-python-headless"),) if preprocess == "atari" else ())
    for module, package in needs:
        why = import_failure(module)
        if why == "not installed":
            raise ConfigError(f"env.id: Atari envs need ale-py and opencv ({package} is not installed): "
                              "pip install -e \".[atari]\"")
        if why:
            raise ConfigError(f"env.id: Atari envs need ale-py and opencv: {package} is {why}; reinstall it: "
                              "pip install -e \".[atari]\"")
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Warning)  # (its banner at every game made, an info line)


def _gym_wrapper():
    import gymnasium as gym

    return gym.Wrapper


class GameStats(_gym_wrapper()):
    """Whole-game return and length (raw frames) in ``info`` at the step the game ends."""

    def reset(self, **kwargs):
        self.game_return, self.game_length = 0.0, 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_return += float(reward)
        self.game_length += 1
        if terminated or truncated:
            info = {**info, "game_return": self.game_return, "game_length": self.game_length}
        return obs, reward, terminated, truncated, info


def game_end(info: dict) -> dict:
    """The GameStats entries of a step's info: a game that ends inside a reset is reported in the reset's info."""
    return {k: info[k] for k in ("game_return", "game_length") if k in info}


class OnlyGameEnd(_gym_wrapper()):
    """A sub-env's info cut to what scalebox_ms reads of it (:func:`game_end`: GameStats's keys; nothing for other
    envs), outermost in each sub-env of the SyncVectorEnvs :func:`~.factory.make_vec_env` builds. gymnasium batches
    every key of every step's info: an env whose info values change shape or type from step to step or env to env
    could not train, and MuJoCo's six keys cost about a tenth of HalfCheetah's vector step
    (``benchmarks/info_batching.py``)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, game_end(info)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, game_end(info)


class EpisodicLife(_gym_wrapper()):
    """A lost life is a terminal state for training; the game itself goes on (reset = one no-op step).

    A reset with a ``seed`` (or ``options``) always restarts the game: gymnasium's meaning of a seeded reset, and
    what makes a seeded run reproducible (SB3's ``EpisodicLifeEnv`` ignores the seed unless the game is over, so a
    step taken before the seeded reset, e.g. a probe step, would carry into the run)."""

    def __init__(self, env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        ended = {}
        if self.game_over or kwargs.get("seed") is not None or kwargs.get("options"):
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                ended = game_end(info)
                obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, {**info, **ended}


class FireReset(_gym_wrapper()):
    """After a reset, press FIRE (action 1) and then action 2, for games whose action set has FIRE."""

    def __init__(self, env):
        super().__init__(env)
        self.fire = "FIRE" in env.unwrapped.get_action_meanings() and len(env.unwrapped.get_action_meanings()) >= 3

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        if not self.fire:
            return obs, info
        ended = game_end(info)  # a game that ended inside the inner reset (EpisodicLife's no-op step)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                ended = game_end(info) or ended
                obs, info = self.env.reset(**kwargs)
                ended = game_end(info) or ended
        return obs, {**info, **ended}
