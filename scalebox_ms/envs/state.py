"""Capture and restore a vector env's in-flight state for checkpoints.

Only representations known to round-trip exactly are used:

* envs that pickle whole and faithfully: scalebox_ms's native envs and gymnasium's classic-control vector
  envs (``CartPoleVectorEnv``);
* ``SyncVectorEnv`` whose sub-envs are gymnasium classic-control or toy-text envs (FrozenLake, Blackjack, Taxi,
  CliffWalking: plain Python state and a numpy RNG): the sub-envs (state, RNG, time-limit counters) plus the
  vector env's autoreset flags (the vector env itself holds unpicklable factories);
* anything else (MuJoCo, whose envs pickle without their simulation state; isolated worker processes) gives
  ``None``: a resumed run then starts fresh episodes, seeded from (seed, global step).
"""
from __future__ import annotations

from typing import Any, Optional

_FAITHFUL_MODULES = ("gymnasium.envs.classic_control", "gymnasium.envs.toy_text", "scalebox_ms.envs.native")


def _faithful(obj) -> bool:
    return type(obj).__module__.startswith(_FAITHFUL_MODULES)


def capture(env) -> Optional[Any]:
    from gymnasium.vector import SyncVectorEnv

    if _faithful(env):
        return {"kind": "whole", "env": env}
    if isinstance(env, SyncVectorEnv) and all(_faithful(e.unwrapped) for e in env.envs):
        return {"kind": "sync_subenvs", "envs": list(env.envs), "autoreset": env._autoreset_envs.copy()}
    return None


def fits(current_env, state) -> bool:
    """Whether ``state`` (:func:`capture`'s) was captured from an env of ``current_env``'s kind: the same class for a
    whole env, gymnasium's SyncVectorEnv of as many sub-envs for sub-envs. Not so when the trainer was built with
    another ``sandbox.isolation_level`` (an IsolatedVectorEnv) or env backend than the checkpoint's."""
    from gymnasium.vector import SyncVectorEnv

    if state["kind"] == "whole":
        return type(state["env"]) is type(current_env)
    return (state["kind"] == "sync_subenvs" and isinstance(current_env, SyncVectorEnv)
            and len(state["envs"]) == len(current_env.envs))


def restore(current_env, state):
    """Return the env to continue with (``current_env`` updated in place, or the unpickled one)."""
    if state["kind"] == "whole":
        restored = state["env"]
        if (hasattr(current_env, "take_state") and type(restored) is type(current_env)
                and (restored.env_id, restored.num_envs) == (current_env.env_id, current_env.num_envs)):
            current_env.take_state(restored)  # (native envs: graphs hold the running env's Parameters)
            return current_env
        current_env.close()
        return restored
    if state["kind"] == "sync_subenvs":
        for e in current_env.envs:
            e.close()
        current_env.envs = state["envs"]
        current_env._autoreset_envs = state["autoreset"]
        return current_env
    raise ValueError(f"unknown env state kind {state['kind']!r}")
