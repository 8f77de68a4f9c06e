"""Small learnable envs with the spaces scalebox_ms encodes beyond a flat Box (registered on import).

* ``DictMatch-v0`` -- Dict observation {"position": Box(1,), "flag": Discrete(2)}; four actions. The right action
  is ``2 * flag + (position > 0)``: a policy must read both parts. Reward 1 for the right action, 8 steps per
  episode (best return 8, random 2).
* ``MultiDiscreteMatch-v0`` -- Box(2,) observation in [-1, 1]; MultiDiscrete([3, 2]) action with start [1, 0].
  Component 0 must name the third of [-1, 1] that obs[0] lies in (1, 2, 3), component 1 whether obs[1] > 0.
  Reward 1 per right component, 8 steps (best return 16).
* ``MultiBinaryMatch-v0`` -- Box(3,) observation; MultiBinary(3) action; reward 1 per bit equal to obs[i] > 0,
  8 steps (best return 24).
* ``WordsObs-v0`` -- a Dict observation with a Text part, which scalebox_ms cannot encode (for error tests).
* ``OffSpaceObs-v0`` -- a Dict observation whose Discrete part is out of its space from the first reset on.
* ``ScalarObs-v0`` -- a scalar Box observation (shape ``()``), two actions.
* ``NarrowF64Action-v0`` -- Box(-0.1, 0.1) float64 actions the env checks are in its space (``integers=True``: an
  int64 Box).
* ``SameWidthObs-v0`` -- 7 encoded observation columns in another layout per ``layout`` kwarg (checkpoint checks).
* ``OldApi-v0`` -- gym's older API: reset returns the observation alone (``step_only=True``: step returns 4 values).
* ``VaryingInfo-v0`` -- a step info array of another shape per sub-env (gymnasium cannot batch it).
* ``InfoSteps-v0`` -- Box(1,) observation, two actions, 3 steps per episode; ``info`` holds the step count, the
  last step adds ``ended`` (for the vector envs' info batching).
"""
import gymnasium as gym
import numpy as np
from gymnasium import spaces

EPISODE = 8


class _Steps(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.state = self._draw()
        return self._obs(), {}

    def step(self, action):
        reward = float(self._reward(action))
        self.t += 1
        self.state = self._draw()
        return self._obs(), reward, False, self.t >= EPISODE, {}


class DictMatch(_Steps):
    observation_space = spaces.Dict({"position": spaces.Box(-1.0, 1.0, (1,), np.float32), "flag": spaces.Discrete(2)})
    action_space = spaces.Discrete(4)

    def _draw(self):
        return float(self.np_random.uniform(-1, 1)), int(self.np_random.integers(2))

    def _obs(self):
        return {"position": np.array([self.state[0]], np.float32), "flag": self.state[1]}

    def _reward(self, action):
        position, flag = self.state
        return int(action) == 2 * flag + int(position > 0)


class MultiDiscreteMatch(_Steps):
    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.MultiDiscrete([3, 2], start=[1, 0])

    def _draw(self):
        return self.np_random.uniform(-1, 1, 2).astype(np.float32)

    def _obs(self):
        return self.state.copy()

    def _reward(self, action):
        third = 1 + min(2, int((self.state[0] + 1.0) / (2.0 / 3.0)))
        return (int(action[0]) == third) + (int(action[1]) == int(self.state[1] > 0))


class MultiBinaryMatch(_Steps):
    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.MultiBinary(3)

    def _draw(self):
        return self.np_random.uniform(-1, 1, 3).astype(np.float32)

    def _obs(self):
        return self.state.copy()

    def _reward(self, action):
        return int((np.asarray(action).astype(bool) == (self.state > 0)).sum())


class WordsObs(_Steps):
    observation_space = spaces.Dict({"count": spaces.Discrete(3), "words": spaces.Text(5)})
    action_space = spaces.Discrete(2)

    def _draw(self):
        return 0

    def _obs(self):
        return {"count": 0, "words": "hi"}

    def _reward(self, action):
        return 0


class OffSpaceObs(_Steps):
    """Its Discrete part returns 7, outside Discrete(2), from the first reset on (for error tests)."""
    observation_space = spaces.Dict({"position": spaces.Box(-1.0, 1.0, (1,), np.float32), "flag": spaces.Discrete(2)})
    action_space = spaces.Discrete(2)

    def _draw(self):
        return 0

    def _obs(self):
        return {"position": np.zeros(1, np.float32), "flag": 7}

    def _reward(self, action):
        return 0


class ScalarObs(_Steps):
    """A scalar Box observation (shape ()); the right action is obs > 0."""
    observation_space = spaces.Box(-1.0, 1.0, (), np.float32)
    action_space = spaces.Discrete(2)

    def _draw(self):
        return np.float32(self.np_random.uniform(-1, 1))

    def _obs(self):
        return np.array(self.state, np.float32)

    def _reward(self, action):
        return int(action) == int(self.state > 0)


class IntKeysObs(DictMatch):
    """DictMatch with the Dict keys 0 and 1: trains; its export is refused (a number in an input's path reads as a
    Tuple index)."""
    observation_space = spaces.Dict({0: spaces.Box(-1.0, 1.0, (1,), np.float32), 1: spaces.Discrete(2)})

    def _obs(self):
        return {0: np.array([self.state[0]], np.float32), 1: self.state[1]}


class NarrowF64Action(_Steps):
    """Box(-0.1, 0.1) float64 actions, which the env checks are in its space (float32(0.1) > 0.1 is not): reward
    -|action - 0.1 obs| (best 0). With ``integers=True`` the Box holds int64 values."""
    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, integers=False):
        self.action_space = (spaces.Box(-2, 2, (1,), np.int64) if integers
                             else spaces.Box(-0.1, 0.1, (1,), np.float64))

    def _draw(self):
        return np.float32(self.np_random.uniform(-1, 1))

    def _obs(self):
        return np.array([self.state], np.float32)

    def _reward(self, action):
        assert self.action_space.contains(action), f"{action!r} is not in {self.action_space}"
        return -abs(float(action[0]) - 0.1 * float(self.state))


class SameWidthObs(_Steps):
    """Observations of 7 encoded columns in three layouts (``layout``): MultiDiscrete([3, 4]) (one-hots),
    MultiDiscrete([4, 3]) (``swapped``) or Box(7,) (``box``); two actions, reward 0 (for checkpoint checks)."""
    LAYOUTS = {"multidiscrete": spaces.MultiDiscrete([3, 4]), "swapped": spaces.MultiDiscrete([4, 3]),
               "box": spaces.Box(-1.0, 1.0, (7,), np.float32), "wide_box": spaces.Box(-5.0, 5.0, (7,), np.float32)}
    action_space = spaces.Discrete(2)

    def __init__(self, layout="multidiscrete"):
        self.observation_space = self.LAYOUTS[layout]

    def _draw(self):
        return self.observation_space.sample()

    def _obs(self):
        return self.state

    def _reward(self, action):
        return 0


class OldApi(gym.Env):
    """gym's older API (before gymnasium): reset returns the observation alone (``step_only``: step returns 4
    values, reset is gymnasium's)."""
    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, step_only=False):
        self.step_only = step_only

    def reset(self, *, seed=None, options=None):
        return (np.zeros(3, np.float32), {}) if self.step_only else np.zeros(3, np.float32)

    def step(self, action):
        return np.zeros(3, np.float32), 1.0, False, {}


class VaryingInfo(gym.Env):
    """A step info whose array has another shape in each sub-env (1 + reset seed % 2): gymnasium's vector env
    cannot batch it."""
    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = 1 + (seed or 0) % 2
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {"contacts": np.zeros(self.k)}


class InfoSteps(gym.Env):
    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {"reset": 1}

    def step(self, action):
        self.t += 1
        info = {"count": self.t, **({"ended": 10 * self.t + int(action)} if self.t == 3 else {})}
        return np.zeros(1, np.float32), 0.0, self.t == 3, False, info


for _name, _cls in (("DictMatch-v0", DictMatch), ("MultiDiscreteMatch-v0", MultiDiscreteMatch),
                    ("MultiBinaryMatch-v0", MultiBinaryMatch), ("WordsObs-v0", WordsObs), ("InfoSteps-v0", InfoSteps),
                    ("OffSpaceObs-v0", OffSpaceObs), ("ScalarObs-v0", ScalarObs), ("IntKeysObs-v0", IntKeysObs),
                    ("NarrowF64Action-v0", NarrowF64Action), ("VaryingInfo-v0", VaryingInfo),
                    ("SameWidthObs-v0", SameWidthObs), ("OldApi-v0", OldApi)):
    if _name not in gym.registry:
        gym.register(_name, entry_point=f"{__name__}:{_cls.__name__}")
