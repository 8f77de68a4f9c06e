"""Deterministic evaluation on fresh gymnasium envs.

Isolation: :func:`evaluate_policy` builds its envs the way the trainer builds its own (its config's
``sandbox.isolation_level``, ``step_timeout``, ``worker_memory_limit``). Under 'process' or
'strict' every eval sub-env runs in a worker process (:class:`~scalebox_ms.envs.IsolatedVectorEnv`), so an env
that segfaults, raises or hangs cannot take the evaluating process down:

* An episode during which its sub-env's worker was restarted is not counted (its return is a fragment cut
  short by the restart); that sub-env plays another episode in its place. Restarts while a sub-env is being
  reset (between episodes) do not spoil an episode.
* Restarts are bounded: once an evaluation has seen more than ``max_restarts`` of them (default
  ``episodes``, i.e. one per episode asked for), it stops with :class:`EvaluationError`, a one-line message
  naming the env id, the number of restarts and the last failure (``crash``/``timeout``/``memory`` and its
  detail). A sub-env that cannot even be reset raises it too. The exception carries ``returns`` (the episodes
  completed so far) and ``env_events`` for a caller that records a partial result.

The result is a :class:`Returns`: a ``list`` of the episode returns (so ``evaluate_policy(trainer, episodes=n)``
is the list of floats it always was) with two attributes: ``env_events``, the worker restarts seen (dicts as in
``IsolatedVectorEnv.events``), and ``replayed``, the number of episodes discarded and played again. Without
isolation both are empty and nothing else changes.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np

from ..errors import ConfigError, ScaleboxError, first_line, user_code_origin
from ..parallel.ranks import beat
from ..envs.factory import close_env


class Returns(list):
    """Episode returns (a list of floats) plus what process isolation did during the evaluation."""

    def __init__(self, returns=(), env_events=(), replayed: int = 0):
        super().__init__(returns)
        self.env_events: List[dict] = list(env_events)
        self.replayed = int(replayed)


class EvaluationError(ScaleboxError):
    """Evaluation gave up (too many env worker restarts, or a sub-env that cannot reset); ``returns`` holds the
    episodes completed before that, ``env_events`` the restarts."""

    def __init__(self, message: str, returns: Returns):
        super().__init__(message)
        self.returns, self.env_events = returns, returns.env_events


class EvaluationInterrupted(ScaleboxError):
    """``should_stop`` said stop (a signal arrived) before the episodes were done."""


def isolation_kwargs(trainer) -> dict:
    """``make_vec_env`` isolation arguments for envs like ``trainer``'s own (see ``PPOTrainer``)."""
    from ..sandbox import env_isolation

    return {**env_isolation(trainer.config.sandbox), "preprocess": trainer.config.env.preprocess}


def run_episodes(env_id: str, env_kwargs: Optional[dict], act: Callable[[np.ndarray], np.ndarray], episodes: int,
                 seed: int = 10_000, max_envs: int = 16, *, isolation: str = "none", step_timeout: float = 10.0,
                 worker_memory_limit: Optional[int] = None, max_restarts: Optional[int] = None,
                 preprocess: str = "auto", should_stop: Optional[Callable[[], bool]] = None) -> Returns:
    """Play ``episodes`` full episodes with ``act(obs_batch) -> action_batch`` on new vector envs.

    Episodes are spread over ``min(episodes, max_envs)`` envs with fixed per-env targets (as SB3's
    ``evaluate_policy``), so short episodes are not over-counted. Returns the undiscounted, unscaled returns.
    ``isolation``/``step_timeout``/``worker_memory_limit`` are passed to ``make_vec_env``; under isolation,
    episodes spoilt by a worker restart are replayed, at most ``max_restarts`` (default ``episodes``) restarts
    in all (see the module docstring). ``should_stop`` is asked before every vector step; when it returns True the
    evaluation raises :class:`EvaluationInterrupted`.
    """
    from ..envs import make_vec_env

    if isinstance(episodes, bool) or not isinstance(episodes, (int, np.integer)) or episodes < 1:
        raise ValueError(f"episodes: must be an integer >= 1, got {episodes!r}")
    _check_seed(seed)
    if isinstance(max_envs, bool) or not isinstance(max_envs, (int, np.integer)) or max_envs < 1:
        raise ValueError(f"max_envs: must be an integer >= 1, got {max_envs!r}")
    limit = episodes if max_restarts is None else int(max_restarts)
    n = min(episodes, max_envs)
    env = make_vec_env(env_id, n, env_kwargs, isolation=isolation, step_timeout=step_timeout,
                       worker_memory_limit=worker_memory_limit, preprocess=preprocess, evaluation=True)
    events = getattr(env, "events", None)  # IsolatedVectorEnv's restart log; None without isolation
    result = Returns()
    try:
        targets = np.array([(episodes + i) // n for i in range(n)])
        counts = np.zeros(n, int)
        ep_return = np.zeros(n)
        valid = np.ones(n, bool)  # False: the next step is a NEXT_STEP autoreset step
        spoilt = np.zeros(n, bool)  # the current episode saw a worker restart
        obs, _ = _env_call(env.reset, env_id, result, episodes, seed=seed)
        seen = len(events) if events is not None else 0  # restarts before the first episode spoil none
        while (counts < targets).any():
            if should_stop is not None and should_stop():
                raise EvaluationInterrupted(f"evaluation of {env_id!r} interrupted ({len(result)} of {episodes} "
                                            "episodes done)")
            try:
                action = act(obs)
            except ValueError as exc:  # the policy refused what the env returned (predict: non-finite, off-space)
                raise EvaluationError(f"evaluation of {env_id!r}: {_without_caller(str(exc))}", result) from exc
            obs, reward, terminated, truncated, _ = _env_call(env.step, env_id, result, episodes, action)
            if events is not None and len(events) > seen:
                for event in events[seen:]:
                    spoilt[event["env"]] |= valid[event["env"]]  # mid-episode, not while resetting
                seen = len(events)
                result.env_events = list(events)
                if seen > limit:  # every restart counts, also those while starting or resetting a sub-env
                    last = events[-1]
                    raise EvaluationError(
                        f"evaluation of {env_id!r}: {seen} env worker restarts, more than the {limit} allowed "
                        f"({len(result)} of {episodes} episodes done); last: {last['kind']}: {last['detail']}", result)
            reward = np.asarray(reward, np.float64)
            if not np.isfinite(reward[valid]).all():  # (the mean would be NaN: not even valid JSON)
                i = int(np.flatnonzero(valid & ~np.isfinite(reward))[0])
                raise EvaluationError(f"evaluation of {env_id!r}: the env returned a non-finite reward "
                                      f"({reward[i]}) at env index {i} ({len(result)} of {episodes} episodes "
                                      "done)", result)
            ep_return += np.where(valid, reward, 0.0)
            done = (np.asarray(terminated) | np.asarray(truncated)) & valid
            for i in np.flatnonzero(done):
                beat()  # (a --workers job's rank 0 evaluating after training: an episode is progress)
                if counts[i] < targets[i]:
                    if spoilt[i]:
                        result.replayed += 1
                    else:
                        result.append(float(ep_return[i]))
                        counts[i] += 1
            ep_return[done] = 0.0
            spoilt[done] = False
            valid = ~done
        if events is not None:
            result.env_events = list(events)
        return result
    except (EvaluationError, EvaluationInterrupted):
        raise
    except ScaleboxError as exc:  # IsolatedVectorEnv gave up on a sub-env that cannot reset
        if events is not None:
            result.env_events = list(events)
        raise EvaluationError(f"evaluation of {env_id!r}: {str(exc).splitlines()[0]}", result) from None
    finally:
        close_env(env, env_id)


def _env_call(fn, env_id: str, result: Returns, episodes: int, *args, **kwargs):
    """``fn(*args, **kwargs)`` (the eval env's reset or step); an exception of the env's own (a bug in a user's env,
    not isolated) is a one-line EvaluationError with the episodes done so far, the original chained."""
    try:
        return fn(*args, **kwargs)
    except (ScaleboxError, MemoryError):
        raise
    except Exception as exc:
        message = first_line(exc)
        raise EvaluationError(f"evaluation of {env_id!r}: the env raised {type(exc).__name__}"
                              f"{user_code_origin(exc)}: {message} ({len(result)} of {episodes} episodes done)",
                              result) from exc


def check_evaluation_env(trainer, evaluating: bool = False) -> None:
    """Where training and evaluation envs differ (``env.backend`` envpool or native trains on its own engine,
    evaluation plays gymnasium's env of the same ``env.id``/``env.kwargs``), make sure gymnasium can build that env
    before a run starts, so a finished training run does not fail at its evaluation. ConfigError otherwise. A run
    that does not evaluate is only warned where the spaces differ (``evaluate`` and ``export`` of it play gymnasium's
    env); where gymnasium cannot build the env at all, nothing is said (the run is meant for its own engine).
    ``evaluating``: called by ``evaluate``/``export --int8``, which play gymnasium's env now: refused either way."""
    from ..envs import make_vec_env

    cfg, run = trainer.config.env, trainer.config.run
    evaluates = evaluating or run.eval_episodes > 0 or run.eval_every > 0
    if cfg.backend == "gymnasium":
        return
    try:
        env = make_vec_env(cfg.id, 1, cfg.kwargs, preprocess=cfg.preprocess, evaluation=True)
    except ConfigError as exc:
        if not evaluates:
            return
        hint = "" if evaluating else " (or set run.eval_episodes=0 and run.eval_every=0)"
        raise ConfigError(f"env.backend: {cfg.backend} trains on its own envs but evaluation plays gymnasium's, "
                          f"and gymnasium cannot: {exc}{hint}") from None
    try:
        train_env = trainer.collector.env
        for what in ("observation", "action"):
            ours, theirs = (getattr(e, f"single_{what}_space") for e in (train_env, env))
            if not same_layout(ours, theirs):  # (EnvPool's Blackjack-v1: a Box where gymnasium's is a Tuple)
                ours, theirs = (" ".join(str(x).split()) for x in (ours, theirs))  # (numpy wraps long bounds)
                line = (f"env.backend: {cfg.backend}'s {cfg.id} has the {what} space {ours}, gymnasium's (which "
                        f"evaluation plays) {theirs}: the policy would be evaluated on {what}s of another kind than "
                        "it was trained on")
                if evaluates:
                    raise ConfigError(f"{line}; train with env.backend gymnasium")
                trainer.log.warning(f"warning: {line}: `evaluate` and `export --int8` of this run will fail")
    finally:
        close_env(env, cfg.id)


def same_layout(a, b) -> bool:
    """Whether two gymnasium spaces have the same kind and shape, part by part (dtypes and Box bounds aside)."""
    from gymnasium import spaces

    if type(a) is not type(b):
        return False
    if isinstance(a, spaces.Dict):
        return list(a.spaces) == list(b.spaces) and all(same_layout(a[k], b[k]) for k in a.spaces)
    if isinstance(a, spaces.Tuple):
        return len(a.spaces) == len(b.spaces) and all(same_layout(x, y) for x, y in zip(a.spaces, b.spaces))
    if isinstance(a, spaces.Discrete):
        return int(a.n) == int(b.n) and int(a.start) == int(b.start)
    if isinstance(a, spaces.MultiDiscrete):
        return np.array_equal(a.nvec, b.nvec) and np.array_equal(a.start, b.start)
    return a.shape == b.shape


def _check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: must be an integer >= 0, got {seed!r}")


def _without_caller(message: str) -> str:
    """'predict: the observation at index 1 is not finite ...' -> 'the observation at index 1 ...' (one line)."""
    line = message.splitlines()[0] if message else "the policy refused an observation"
    return line[len("predict: "):] if line.startswith("predict: ") else line


def evaluate_policy(trainer, episodes: int = 20, seed: int = 10_000, deterministic: bool = True,
                    max_envs: int = 16, max_restarts: Optional[int] = None,
                    should_stop: Optional[Callable[[], bool]] = None) -> Returns:
    """Episodes of ``trainer``'s policy on new envs of its ``env.id``/``env.kwargs``, isolated as its own envs
    are (see the module docstring); observations are normalised with the trainer's statistics without updating
    them. Stochastic actions (``deterministic=False``) draw their noise from a Generator seeded from ``seed``,
    so the same seed gives the same episodes."""
    import numpy as np

    cfg = trainer.config.env
    _check_seed(seed)  # (before PCG64 sees it)
    rng = None if deterministic else np.random.Generator(np.random.PCG64([seed, 2]))
    return run_episodes(cfg.id, cfg.kwargs, lambda obs: trainer.predict(obs, deterministic=deterministic, rng=rng),
                        episodes, seed, max_envs, max_restarts=max_restarts, should_stop=should_stop,
                        **isolation_kwargs(trainer))
