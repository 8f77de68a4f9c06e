"""Process-isolated vector env: each sub-env in its own worker process, restarted when it crashes or hangs.

``IsolatedVectorEnv(env_id, num_envs, kwargs, step_timeout=10.0, memory_limit_bytes=None, seed=0)`` follows
gymnasium 1.x's vector API with ``AutoresetMode.NEXT_STEP`` semantics, like the in-process envs:

* Workers are started with the ``spawn`` method: a fresh interpreter that inherits no file descriptors but the
  pipe to the parent (and none of MindSpore's threads).
* ``memory_limit_bytes`` sets ``RLIMIT_AS`` in each worker, so a sub-env that allocates past it fails inside
  its own process (MindSpore ignores memory limits on CPU; this is how the Sandbox enforces one there).
* If a worker dies (crash, memory limit, killed) or does not answer a step or a reset within ``step_timeout``
  seconds (a fresh worker first gets ``start_timeout``, 60 s, to start and build its env), it is
  terminated and replaced by a fresh worker whose env is reset with a new seed (autoreset seeds derive from
  the seed given to ``reset``). That step reports the
  sub-env's episode as **truncated** with reward 0 and the last observation it produced; the following step is
  the usual NEXT_STEP autoreset step (the fresh reset observation, reward 0). Each event is logged and kept in
  ``events`` (``{"env": i, "kind": "crash"|"timeout"|"memory", "detail": ...}``).

The parent process never runs env code, so a segfaulting or hanging env step cannot take the training run
down. A sub-env that fails to *reset* in ``MAX_RESET_ATTEMPTS`` fresh workers in a row, or fails that many *steps*
in a row (each in a fresh worker), is broken rather than flaky: after collecting every other worker's reply,
``step``/``reset`` raise a one-line ``ScaleboxError``. Info values a worker cannot pickle are left out.
Workers import only gymnasium and this module (no MindSpore), ~60-100 MB each.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import resource
import time
import traceback
from typing import List, Optional

import numpy as np

from ..cli_common import sigint_routing_kept

log = logging.getLogger("scalebox_ms")


def restarted(env, num_envs: int) -> np.ndarray:
    """The sub-envs whose worker the last ``step`` of ``env`` restarted (:attr:`IsolatedVectorEnv.restarted`; all
    False for any other env): that step is reported truncated with reward 0 and the previous observation, which is
    no transition the env made."""
    mask = getattr(env, "restarted", None) if isinstance(env, IsolatedVectorEnv) else None
    return np.zeros(num_envs, bool) if mask is None else mask


def _worker(conn, env_id: str, kwargs: dict, memory_limit: Optional[int], wrap=("none", False)) -> None:
    # runs in the child; ``wrap``: (env.preprocess, evaluation) for :func:`.atari.wrap`
    if memory_limit:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    try:
        import gymnasium as gym

        from . import atari

        if atari.is_atari(env_id):
            atari.import_ale(wrap[0])
        from .factory import is_mujoco, route_mujoco_warnings

        if ":" not in env_id and env_id in gym.registry and is_mujoco(gym.spec(env_id)):
            route_mujoco_warnings()  # (this process's own MuJoCo: its warnings through the log, as in the trainer's)
        env = atari.wrap(gym.make(env_id, **kwargs), *wrap)
        while True:
            cmd, arg = conn.recv()
            if cmd == "reset":
                _send_result(conn, env.reset(seed=arg))
            elif cmd == "step":
                _send_result(conn, env.step(arg))
            elif cmd == "spaces":
                conn.send(("ok", (env.observation_space, env.action_space)))
            elif cmd == "close":
                env.close()
                conn.send(("ok", None))
                return
    except MemoryError:
        conn.send(("memory", "MemoryError (worker memory limit reached)"))
    except (EOFError, KeyboardInterrupt):
        return
    except BaseException as exc:  # report the env's own error instead of dying silently
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}"[:300] + "\n" + traceback.format_exc(limit=3)[-600:]))
        except Exception:
            pass


def _send_result(conn, result: tuple) -> None:
    """A reset/step result to the parent; info values that cannot be pickled (a lock, a handle) are left out:
    scalebox_ms reads only a few plain ones, and one such value failed every step."""
    import pickle

    try:
        conn.send(("ok", result))  # (pickled in full before anything is sent)
    except (pickle.PicklingError, TypeError, AttributeError):
        info = {k: v for k, v in result[-1].items() if _picklable(v)}
        conn.send(("ok", result[:-1] + (info,)))


def _picklable(value) -> bool:
    import pickle

    try:
        pickle.dumps(value)
        return True
    except Exception:
        return False


class WorkerFailure(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


class _Worker:
    def __init__(self, ctx, env_id, kwargs, memory_limit, wrap=("none", False)):
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, env_id, kwargs, memory_limit, wrap), daemon=True)
        with sigint_routing_kept():
            self.proc.start()
        child.close()
        self.ready = False  # it has answered once: its env is built

    def start(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until the worker has built its env."""
        if not self.ready:
            self.call("spaces", None, timeout)

    def call(self, cmd, arg, timeout: float):
        try:
            self.parent.send((cmd, arg))
            if not self.parent.poll(timeout):
                raise WorkerFailure("timeout", f"no answer to {cmd!r} within {timeout:g} s")
            status, payload = self.parent.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            self.proc.join(timeout=1)
            raise WorkerFailure("crash", f"worker process died (exit code {self.proc.exitcode})") from None
        if status == "ok":
            self.ready = True
            return payload
        raise WorkerFailure("memory" if status == "memory" else "crash", payload)

    def kill(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.parent.close()


class IsolatedVectorEnv:
    """N sub-envs in N worker processes; see the module docstring."""

    metadata = {"autoreset_mode": "NextStep"}

    def __init__(self, env_id: str, num_envs: int, kwargs: Optional[dict] = None, step_timeout: float = 10.0,
                 memory_limit_bytes: Optional[int] = None, start_timeout: float = 60.0, wrap=("none", False)):
        from gymnasium.vector import AutoresetMode
        from gymnasium.vector.utils import batch_space

        self.env_id, self.num_envs, self.kwargs = env_id, int(num_envs), dict(kwargs or {})
        self.wrap = wrap  # (env.preprocess, evaluation): each worker wraps its env (scalebox_ms.envs.atari)
        self.step_timeout, self.memory_limit = float(step_timeout), memory_limit_bytes
        self.start_timeout = float(start_timeout)
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
        self._ctx = mp.get_context("spawn")
        self.events: List[dict] = []
        #: added to a sub-env's index in the restart warnings (data parallelism: rank x envs per rank, the index
        #: the run's other messages give); ``events`` keep this env's own indices
        self.index_offset = 0
        #: the sub-envs whose worker the last step restarted (see :func:`restarted`)
        self.restarted = np.zeros(self.num_envs, bool)
        self._workers = [self._start() for _ in range(self.num_envs)]
        obs_space, act_space = self._workers[0].call("spaces", None, self.start_timeout)
        self.single_observation_space, self.single_action_space = obs_space, act_space
        self.observation_space = batch_space(obs_space, self.num_envs)
        self.action_space = batch_space(act_space, self.num_envs)
        self._last_obs = [None] * self.num_envs
        self._needs_reset = np.zeros(self.num_envs, bool)
        self._fresh = np.ones(self.num_envs, bool)  # a worker whose env was never reset: its autoreset is seeded
        self._failed_steps = np.zeros(self.num_envs, int)  # failed steps in a row (each in a fresh worker)
        self._reseed = np.random.default_rng(0)  # seeds of autoresets; re-derived from reset(seed)

    def _start(self) -> _Worker:
        return _Worker(self._ctx, self.env_id, self.kwargs, self.memory_limit, self.wrap)

    def _replace(self, i: int, failure: WorkerFailure) -> None:
        self._workers[i].kill()
        event = {"env": i, "kind": failure.kind, "detail": failure.detail.splitlines()[0][:300]}
        self.events.append(event)
        log.warning("warning: isolated env %d (%s): %s -> worker restarted, episode truncated", i + self.index_offset,
                    failure.kind, event["detail"])
        self._workers[i] = self._start()
        self._needs_reset[i] = self._fresh[i] = True

    MAX_RESET_ATTEMPTS = 3  # (and failed steps in a row, each in a fresh worker)

    def _step_failed(self, i: int, failure: "WorkerFailure", failing: List[int]) -> None:
        self._replace(i, failure)
        self._failed_steps[i] += 1
        if self._failed_steps[i] >= self.MAX_RESET_ATTEMPTS:
            failing.append(i)

    def _reset_worker(self, i: int, seed, infos: Optional[dict] = None, fresh_seed=None):
        """Reset sub-env i, replacing its worker up to MAX_RESET_ATTEMPTS times; None if it never succeeds. The
        reset's info goes into ``infos`` (gymnasium's vector layout). A replaced worker's env is reset with
        ``fresh_seed`` (when given) instead of ``seed``."""
        for _ in range(self.MAX_RESET_ATTEMPTS):
            try:
                self._workers[i].start(self.start_timeout)
                o, info = self._workers[i].call("reset", seed, self.step_timeout)
                if infos is not None and info:
                    self._add_info(infos, info, i)
                self._fresh[i] = False
                return o
            except WorkerFailure as failure:
                self._replace(i, failure)
                seed = seed if fresh_seed is None else fresh_seed
        return None

    def _give_up(self, broken: List[int], what: str = "reset") -> None:
        from ..errors import ScaleboxError

        raise ScaleboxError(f"env {self.env_id!r}: sub-env(s) {broken} failed to {what} {self.MAX_RESET_ATTEMPTS} "
                            f"times in fresh workers ({self.events[-1]['kind']}: {self.events[-1]['detail']})")

    def reset(self, seed=None, options=None):
        seeds = [None] * self.num_envs if seed is None else [int(seed) + i for i in range(self.num_envs)]
        if seed is not None:
            self._reseed = np.random.default_rng(np.random.SeedSequence(int(seed)))
        obs, broken = [], []
        for i in range(self.num_envs):
            o = self._reset_worker(i, seeds[i])
            if o is None:
                broken.append(i)
            self._last_obs[i] = o
            obs.append(o)
        if broken:
            self._give_up(broken)
        self._needs_reset[:] = False
        return self._stack(obs), {}

    def step(self, actions):
        actions = np.asarray(actions)
        n = self.num_envs
        obs, rewards = [None] * n, np.zeros(n, np.float64)
        terminated, truncated = np.zeros(n, bool), np.zeros(n, bool)
        for i, w in enumerate(self._workers):  # send all, then collect: the sub-envs step concurrently
            if not self._needs_reset[i]:
                try:
                    w.parent.send(("step", actions[i]))
                except (BrokenPipeError, OSError):
                    pass  # noticed when collecting
        # one deadline for the whole step: the sub-envs step concurrently, so one that hangs is found after
        # step_timeout whatever the others do (a fresh step_timeout per worker polled made N hung workers take N x)
        deadline = time.monotonic() + self.step_timeout
        broken, failing = [], []
        restarted = np.zeros(n, bool)
        infos: dict = {}  # the sub-envs' infos, batched as gymnasium's vector envs do ("key" + "_key" mask)
        for i, w in enumerate(self._workers):
            if self._needs_reset[i]:  # NEXT_STEP autoreset (after an episode end or a restart)
                # after an episode end without a seed, as gymnasium's vector envs: the env's own RNG goes on (a seed
                # on every autoreset made ale-py's EpisodicLife start a new game at each lost life); a restarted
                # worker's new env from the seed stream (drawn either way: the stream stays the same)
                draw = int(self._reseed.integers(2**31))
                o = self._reset_worker(i, draw if self._fresh[i] else None, infos, fresh_seed=draw)
                if o is None:  # keep collecting the other workers' replies; give up after the loop
                    broken.append(i)
                    obs[i] = self._last_obs[i]
                    continue
                self._needs_reset[i] = False
                obs[i] = self._last_obs[i] = o
                continue
            try:
                if not w.parent.poll(max(0.0, deadline - time.monotonic())):
                    raise WorkerFailure("timeout", f"step took longer than {self.step_timeout:g} s")
                status, payload = w.parent.recv()
                if status != "ok":
                    raise WorkerFailure("memory" if status == "memory" else "crash", payload)
            except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
                w.proc.join(timeout=1)
                failure = WorkerFailure("crash", f"worker process died (exit code {w.proc.exitcode})")
                self._step_failed(i, failure, failing)
                obs[i], truncated[i], restarted[i] = self._last_obs[i], True, True
                continue
            except WorkerFailure as failure:
                self._step_failed(i, failure, failing)
                obs[i], truncated[i], restarted[i] = self._last_obs[i], True, True
                continue
            self._failed_steps[i] = 0
            o, r, term, trunc, info = payload
            if info:
                self._add_info(infos, info, i)
            obs[i] = self._last_obs[i] = o
            rewards[i], terminated[i], truncated[i] = r, term, trunc
            if term or trunc:
                self._needs_reset[i] = True
        if broken:
            self._give_up(broken)
        if failing:  # (an env whose step always fails: restarting it forever trained on nothing, silently)
            self._give_up(failing, "step")
        self.restarted = restarted  # (no transition happened: the trainers keep this step out of what they learn from)
        return self._stack(obs), rewards, terminated, truncated, infos

    def close(self) -> None:
        for w in self._workers:
            try:
                if w.proc.is_alive():
                    w.call("close", None, 2.0)
            except WorkerFailure:
                pass
            w.kill()
        self._workers = []

    def __getstate__(self):  # processes cannot be pickled: checkpoints resume isolated envs with fresh episodes
        raise TypeError("IsolatedVectorEnv holds worker processes and cannot be pickled")

    def _add_info(self, infos: dict, info: dict, i: int) -> dict:
        from gymnasium.vector import VectorEnv

        return VectorEnv._add_info(self, infos, info, i)

    def _stack(self, obs: list):
        """The sub-envs' observations as one batch of the vector observation space (Dict/Tuple: a dict/tuple of
        batched arrays, as gymnasium's own vector envs give them)."""
        from gymnasium.vector.utils import concatenate, create_empty_array

        return concatenate(self.single_observation_space, obs,
                           create_empty_array(self.single_observation_space, len(obs)))
