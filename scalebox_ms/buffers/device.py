"""Device-resident buffers: rollout storage with GAE as a graph reverse scan, and a replay ring buffer.

Both keep their data in MindSpore Parameters, so compiled graphs (a native-env rollout, a train step) can
write and read them without a host round trip. Writes go through Tensor-index assignment / ``scatter_update``
(``param[s:e] = x`` inside a graph is silently dropped on MindSpore 2.10, see docs/design.md); flags are stored as
uint8 because the CPU ScatterNdUpdate kernel has no bool variant. Anything random (replay sampling) takes its
draws as an input (:func:`sample_draws`, from a numpy Generator), so results are reproducible and checkpointable.
"""
from __future__ import annotations

from typing import Dict, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops


def _param(shape, dtype, name):
    return Parameter(Tensor(np.zeros(shape, dtype)), name=name, requires_grad=False)


class RolloutBuffer(nn.Cell):
    """(T, N, ...) rollout storage on the device with GAE computed in graph.

    Fields: ``obs``, ``actions``, ``log_probs``, ``values``, ``rewards``, ``terminated``, ``truncated``,
    ``valid`` (uint8 flags), and after :meth:`compute_gae`: ``advantages``, ``returns``. Semantics are those of
    :func:`scalebox_ms.buffers.compute_gae` (NEXT_STEP autoreset: invalid steps get advantage 0, truncated
    episodes bootstrap from the value of the next stored step), which is the numpy reference it is tested against.
    """

    def __init__(self, n_steps: int, num_envs: int, obs_dim: int, action_shape: Tuple[int, ...] = (),
                 discrete: bool = True):
        super().__init__()
        T, N = int(n_steps), int(num_envs)
        self.n_steps, self.num_envs = T, N
        self.obs = _param((T, N, obs_dim), np.float32, "obs")
        self.actions = _param((T, N) + tuple(action_shape), np.int32 if discrete else np.float32, "actions")
        self.log_probs = _param((T, N), np.float32, "log_probs")
        self.values = _param((T, N), np.float32, "values")
        self.rewards = _param((T, N), np.float32, "rewards")
        self.terminated = _param((T, N), np.uint8, "terminated")
        self.truncated = _param((T, N), np.uint8, "truncated")
        self.valid = _param((T, N), np.uint8, "valid")
        self.advantages = _param((T, N), np.float32, "advantages")
        self.returns = _param((T, N), np.float32, "returns")

    def store_observation(self, t, obs, action, log_prob, value, valid):
        """Graph code: what the policy saw and did at step ``t`` (a Tensor index)."""
        self.obs[t] = obs
        self.actions[t] = action
        self.log_probs[t] = log_prob
        self.values[t] = value
        self.valid[t] = valid.astype(ms.uint8)

    def store_outcome(self, t, reward, terminated, truncated):
        """Graph code: what the env returned at step ``t``."""
        self.rewards[t] = reward
        self.terminated[t] = terminated.astype(ms.uint8)
        self.truncated[t] = truncated.astype(ms.uint8)

    def compute_gae(self, last_values, gamma, gae_lambda):
        """Reverse scan over t = T-1 .. 0 in a graph while loop; fills ``advantages`` and ``returns``.
        ``last_values``: (num_envs,) (another shape was a MindSpore traceback and an analyze_fail.ir dump)."""
        if tuple(last_values.shape) != (self.num_envs,):
            raise ValueError(f"compute_gae: last_values has shape {tuple(last_values.shape)}, expected "
                             f"({self.num_envs},): one value per env")
        return self._gae_scan(last_values, gamma, gae_lambda)

    @ms.jit
    def _gae_scan(self, last_values, gamma, gae_lambda):
        running = ops.zeros_like(last_values)
        next_values = last_values
        t = Tensor(self.n_steps - 1, ms.int32)
        while t >= 0:
            term = self.terminated[t].astype(ms.float32)
            done = ops.maximum(term, self.truncated[t].astype(ms.float32))
            valid = self.valid[t].astype(ms.float32)
            value = self.values[t]
            delta = self.rewards[t] + gamma * (1.0 - term) * next_values - value
            running = (delta + gamma * gae_lambda * (1.0 - done) * running) * valid
            self.advantages[t] = running
            self.returns[t] = (running + value) * valid
            next_values = value
            t = t - 1
        return self.advantages

    def fill(self, **arrays) -> None:
        """Host API: copy numpy arrays into the buffers (flags as bool or uint8)."""
        from ..ops import AssignParameters

        names = list(arrays)
        params = [getattr(self, n, None) for n in names]
        for n, p in zip(names, params):
            if not isinstance(p, Parameter):
                raise ValueError(f"fill: unknown field {n!r}")
            if np.shape(arrays[n]) != p.shape:
                raise ValueError(f"fill: field {n!r} has shape {np.shape(arrays[n])}, expected {p.shape}")
        values = tuple(Tensor(np.asarray(arrays[n]).astype(p.asnumpy().dtype)) for n, p in zip(names, params))
        AssignParameters(params).write(values)


class ReplayBuffer(nn.Cell):
    """Ring buffer of ``capacity`` transitions on the device.

    ``specs`` maps field names to (per-item shape, numpy dtype), e.g.
    ``{"obs": ((4,), np.float32), "action": ((), np.int32), "reward": ((), np.float32)}``.

    Graph API (usable inside your own compiled train step): :meth:`add` writes a batch at the ring position
    with wrap-around; :meth:`gather` returns the items at rows ``draws mod len`` for int32 ``draws`` from
    :func:`sample_draws` (uniform sampling with replacement). Host API: :meth:`add_batch`, :meth:`sample`,
    ``len(buffer)``, :meth:`state_dict` / :meth:`load_state_dict`.
    """

    def __init__(self, capacity: int, specs: Dict[str, Tuple[Sequence[int], type]], spare_row: bool = False):
        super().__init__()
        # (int32 ring arithmetic in the graphs, rows drawn from [0, DRAW_RANGE): 2**32 + 3 wrapped to a ring of 3)
        if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)) \
                or not 1 <= capacity <= DRAW_RANGE:
            raise ValueError(f"capacity: must be an integer from 1 to {DRAW_RANGE}, got {capacity!r}")
        if not specs:
            raise ValueError("specs: at least one field is required")
        self.capacity = int(capacity)
        self.names = tuple(specs)
        self.specs = {k: (tuple(shape), np.dtype(dt)) for k, (shape, dt) in specs.items()}
        for name, (_, dt) in self.specs.items():
            if dt == np.bool_:  # (MindSpore 2.10's CPU ScatterUpdate has no bool kernel: it failed at the first add)
                raise ValueError(f"specs: field {name!r} is bool; store flags as uint8")
        # spare_row: one row past the ring that add_masked writes its masked-out items to (never sampled)
        rows = self.capacity + int(bool(spare_row))
        self.spare_row = bool(spare_row)
        self.fields = ms.ParameterTuple([_param((rows,) + shape, dt, f"replay_{name}")
                                         for name, (shape, dt) in self.specs.items()])
        self.position = _param((), np.int32, "replay_position")
        self.size = _param((), np.int32, "replay_size")
        self._compiled = {}  # a plain dict: a child Cell pointing back at this Cell would make a cycle

    # -- graph API ---------------------------------------------------------------------------------
    def add(self, items):
        """Write a batch (tuple in ``specs`` order, each (B, ...)) at the ring position; returns the new size."""
        b = items[0].shape[0]
        skip = max(0, b - self.capacity)  # static: a batch larger than the ring keeps only its last items
        if skip:
            items = tuple(x[skip:] for x in items)
        idx = ops.remainder(self.position + skip + ops.arange(b - skip, dtype=ms.int32), self.capacity)
        for field, value in zip(self.fields, items):
            ops.scatter_update(field, idx, value)
        ops.assign(self.position, ops.remainder(self.position + b, self.capacity))
        new_size = ops.minimum(self.size + b, self.capacity)
        ops.assign(self.size, new_size)
        return new_size

    def add_masked(self, items, valid):
        """Write the items whose ``valid`` (B,) int32 flag is 1, in order, at the ring position (the others go to the
        spare row); returns the new size. Needs ``spare_row=True`` and B <= capacity."""
        n_valid = valid.sum().astype(ms.int32)
        offset = (ops.cumsum(valid, 0) - valid).astype(ms.int32)  # rank of each valid item among the valid ones
        ring = ops.remainder(self.position + offset, self.capacity)
        idx = ops.select(valid > 0, ring, ops.fill(ms.int32, valid.shape, self.capacity))
        for field, value in zip(self.fields, items):
            ops.scatter_update(field, idx, value)
        ops.assign(self.position, ops.remainder(self.position + n_valid, self.capacity))
        new_size = ops.minimum(self.size + n_valid, self.capacity)
        ops.assign(self.size, new_size)
        return new_size

    def gather(self, draws):
        """Items at rows ``draws mod len(self)`` for int32 ``draws`` uniform in [0, 2**31 - 1) (:func:`sample_draws`):
        uniform sampling with replacement, every row within a relative 1e-3 of the same probability up to 2.1M
        rows (float32 draws ``u * size`` had 24 random bits: rows of a 1e6 buffer came 16 or 17 times in 2**24, 6%
        apart, and a 2e7 buffer never sampled 4.3M of its rows). Row 0, never written, of an empty buffer: a
        phase's batched sampling runs before it knows whether it trains."""
        size = ops.maximum(self.size, 1)
        idx = ops.clip_by_value(ops.remainder(draws, size), 0, size - 1)  # (exact on CPU; a bound on any backend)
        return tuple(ops.gather(field, idx, 0) for field in self.fields)

    # -- host API ----------------------------------------------------------------------------------
    def add_batch(self, **arrays) -> int:
        items = self._host_items("add_batch", arrays)
        if "add" not in self._compiled:
            self._compiled["add"] = _Compiled(self, "add")
        return int(self._compiled["add"](items).asnumpy())

    def add_batch_masked(self, valid, **arrays) -> int:
        """``add_batch`` of the items whose ``valid`` flag is non-zero, in order (``add_masked``, what the training
        phases run; needs ``spare_row=True``). One compiled graph per batch size."""
        items = self._host_items("add_batch_masked", arrays)
        if not self.spare_row:
            raise ValueError("add_batch_masked: the buffer has no spare row (spare_row=False)")
        valid = np.asarray(valid)
        if valid.shape != (items[0].shape[0],):
            raise ValueError(f"add_batch_masked: valid has shape {valid.shape}, expected ({items[0].shape[0]},)")
        if valid.shape[0] > self.capacity:  # (the ring positions of one call must not collide)
            raise ValueError(f"add_batch_masked: a batch of {valid.shape[0]} items is larger than the capacity "
                             f"{self.capacity}")
        if "add_masked" not in self._compiled:
            self._compiled["add_masked"] = _CompiledAddMasked(self)
        flags = Tensor((valid != 0).astype(np.int32))  # (a flag of 2 counted twice: a never-written row sampled)
        return int(self._compiled["add_masked"](items, flags).asnumpy())

    def _host_items(self, caller: str, arrays: dict):
        """The fields' arrays as a mutable tuple of Tensors in ``names`` order (every field, no other key), each of
        shape (B,) + the field's shape with one B."""
        if set(arrays) != set(self.names):
            raise ValueError(f"{caller}: expected fields {list(self.names)}, got {sorted(arrays)}")
        values = {n: np.asarray(arrays[n], self.specs[n][1]) for n in self.names}
        batch = values[self.names[0]].shape[:1]
        for n in self.names:
            if values[n].shape != batch + self.specs[n][0] or not batch:
                raise ValueError(f"{caller}: field {n!r} has shape {values[n].shape}, expected (B,) + "
                                 f"{self.specs[n][0]}" + (f" with B = {batch[0]}" if batch else ""))
        return ms.mutable(tuple(Tensor(values[n]) for n in self.names))

    def sample(self, batch_size: int, rng: np.random.Generator) -> Dict[str, np.ndarray]:
        if len(self) == 0:
            raise ValueError("sample: the replay buffer is empty")
        if "gather" not in self._compiled:
            self._compiled["gather"] = _Compiled(self, "gather")
        draws = Tensor(sample_draws(rng, int(batch_size)))
        return {n: v.asnumpy() for n, v in zip(self.names, self._compiled["gather"](draws))}

    def __len__(self) -> int:
        return int(self.size.asnumpy())

    def state_dict(self) -> Dict[str, np.ndarray]:
        out = {name: field.asnumpy()[: len(self)].copy() for name, field in zip(self.names, self.fields)}
        out["_position"] = np.asarray(int(self.position.asnumpy()))
        out["_size"] = np.asarray(len(self))
        return out

    def clear(self) -> None:
        """Empty the buffer (size and ring position 0; the rows are left as they are: nothing samples them)."""
        from ..ops import AssignParameters

        zero = Tensor(np.asarray(0, np.int32))
        AssignParameters([self.position, self.size]).write([zero, zero])

    def load_state_dict(self, state: Dict[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict`'s contents. A buffer of the same capacity gets them as they were (ring position
        included: sampling continues bit for bit); one of another capacity gets the rows oldest first, and when it
        is smaller than their number only the newest ``capacity`` rows (the ones a ring of that size would hold)."""
        from ..ops import AssignParameters

        size, position = int(state["_size"]), int(state["_position"])
        for name in self.names:
            if np.shape(state[name]) != (size,) + self.specs[name][0]:
                raise ValueError(f"load_state_dict: field {name!r} has shape {np.shape(state[name])}, expected "
                                 f"{(size,) + self.specs[name][0]}")
        order = None  # (rows as saved)
        wrapped = position < size  # (a full ring whose oldest row is at position)
        if size > self.capacity or (wrapped and size != self.capacity):  # another capacity: oldest first, newest kept
            keep = min(size, self.capacity)
            order = np.concatenate([np.arange(position, size), np.arange(position)])[size - keep:]
            size, position = keep, keep % self.capacity
        values = []
        for name, field in zip(self.names, self.fields):
            full = np.zeros(field.shape, self.specs[name][1])
            full[:size] = state[name] if order is None else np.asarray(state[name])[order]
            values.append(Tensor(full))
        values += [Tensor(np.asarray(position % self.capacity, np.int32)), Tensor(np.asarray(size, np.int32))]
        AssignParameters(list(self.fields) + [self.position, self.size]).write(values)


DRAW_RANGE = 2 ** 31 - 1  # (exclusive bound of :func:`sample_draws`; int32 in the graph)


def sample_draws(rng: np.random.Generator, shape) -> np.ndarray:
    """int32 draws uniform in [0, DRAW_RANGE) for :meth:`ReplayBuffer.gather` (rows ``draw mod size``)."""
    return rng.integers(0, DRAW_RANGE, shape, dtype=np.int32)


class _Compiled(nn.Cell):
    """A compiled call of one ReplayBuffer graph method."""

    def __init__(self, buffer: ReplayBuffer, method: str):
        super().__init__(auto_prefix=False)
        self.buffer = buffer
        self.is_add = method == "add"

    @ms.jit
    def construct(self, x):
        if self.is_add:
            return self.buffer.add(x)
        return self.buffer.gather(x)


class _CompiledAddMasked(nn.Cell):
    """A compiled call of ``ReplayBuffer.add_masked``."""

    def __init__(self, buffer: ReplayBuffer):
        super().__init__(auto_prefix=False)
        self.buffer = buffer

    @ms.jit
    def construct(self, items, valid):
        return self.buffer.add_masked(items, valid)
