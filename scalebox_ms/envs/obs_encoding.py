"""Observations of any supported gymnasium space as one flat float32 vector per env (SB3's ``preprocess_obs``).

Every observation space is a tree whose leaves are ``Box``, ``Discrete``, ``MultiDiscrete`` or ``MultiBinary``,
joined by ``Dict`` (in the space's own key order, as ``gymnasium.spaces.flatten`` walks it) and ``Tuple`` (by
index). :class:`ObsEncoder` walks that tree once and lays the leaves side by side:

=================== ======================================== ===================== ==========
leaf                columns                                   values                normalised
=================== ======================================== ===================== ==========
``Box``             prod(shape), flattened in C order         the observation       yes
``Discrete(n)``     n                                         one-hot of obs-start  no
``MultiDiscrete``   sum(nvec), one one-hot per component      one-hot of obs-start  no
``MultiBinary``     prod(shape)                               0 / 1                 no
=================== ======================================== ===================== ==========

Observation normalisation (``env.normalize_obs``) applies to the ``Box`` columns only
(:attr:`ObsEncoder.normalize_mask`); one-hots and bits reach the network as they are. A plain ``Box`` space is
the common case and encodes exactly as before this module existed: ``float32`` and flattened.

The encoding runs on the host, once per vector step, so everything downstream (rollout storage, replay buffers,
the compiled acting and update graphs, the C++ MLP kernels) sees a flat ``(batch, obs_dim)`` float32 array.

**Images** (``features='auto'`` or ``'nature_cnn'``): an observation space that is itself an image ``Box``
(uint8, three dimensions, bounds 0 and 255: SB3's ``is_image_space``) is not flattened. It stays uint8,
channels first (``(C, H, W)``; a channels-last space, detected as SB3 does by the position of the smallest
dimension, is transposed), and the network scales it by 1/255 in the graph (:class:`~scalebox_ms.models.cnn.NatureCNN`).
Images are never normalised.

**Images inside a Dict/Tuple** (the same detection; SB3's ``MultiInputPolicy``) become ``image`` leaves of the
flat vector: the frame, transposed to (C, H, W) like a top-level image, is packed three pixels per float32
column (:func:`pack_pixels`: ``p0 + 256 p1 + 65536 p2``, an integer below 2**24 and so exact in float32), which
keeps one flat float32 array per observation through rollouts, replay buffers and graphs at 4/3 of the uint8
bytes instead of 4x. The model unpacks the columns exactly and runs one NatureCNN per image leaf
(:class:`~scalebox_ms.models.cnn.CombinedFeatures`, SB3's ``CombinedExtractor``). Packed columns are never
normalised. ``features='mlp'`` flattens images like any Box.

Exported MindIR policies take the raw leaves instead, one input per leaf in :attr:`ObsEncoder.leaves` order, and
encode them inside the graph (:class:`scalebox_ms.models.obs_encoder.ObsEncoderCell`, tested against this one).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import numpy as np

from ..errors import ConfigError, TrainingError, short_repr

LEAF_KINDS = ("box", "discrete", "multidiscrete", "multibinary", "image")
PIXELS_PER_COLUMN = 3  # uint8 pixels packed into one float32 column (exact: 3 * 8 bits <= float32's 24-bit mantissa)
MIN_CNN_SIDE = 36  # NatureCNN's three valid convolutions need frames of at least 36 x 36 pixels


@dataclass(frozen=True)
class Leaf:
    """One leaf of the observation space and its columns ``[offset, offset + width)`` in the encoded vector."""

    path: Tuple[Any, ...]           # keys (Dict) and indices (Tuple) from the root; () for a non-composite space
    kind: str                       # one of LEAF_KINDS
    shape: Tuple[int, ...]          # the leaf's own observation shape (() for Discrete)
    offset: int
    width: int
    nvec: Tuple[int, ...] = ()      # discrete: (n,); multidiscrete: the flattened nvec
    start: Tuple[int, ...] = ()     # discrete / multidiscrete: the flattened start values
    chw: Tuple[int, ...] = ()       # image: the (C, H, W) frame the CNN sees (``shape`` is the env's, maybe HWC)

    @property
    def channels_last(self) -> bool:
        """image: the env gives (H, W, C) frames (transposed to ``chw`` by the encoders)."""
        return bool(self.chw) and tuple(self.shape) != tuple(self.chw)

    @property
    def name(self) -> str:
        """``"obs"`` for a non-composite space, else the path joined with dots (``"position.0"``)."""
        return ".".join(str(p) for p in self.path) if self.path else "obs"

    @property
    def input_dtype(self) -> str:
        """dtype of this leaf's input in an exported MindIR policy."""
        if self.kind == "image":
            return "uint8"
        return "int32" if self.kind in ("discrete", "multidiscrete") else "float32"


class ObsEncoder:
    """gymnasium observations (a batch, or one observation) -> ``float32 (batch, obs_dim)``."""

    def __init__(self, space, env_id: str = "env", features: str = "auto"):
        from gymnasium import spaces

        self.space = space
        self.env_id = env_id
        self.features = features
        self.leaves: List[Leaf] = []
        self._offset = 0
        #: an image observation kept as uint8 (C, H, W) for a CNN
        self.image = features != "mlp" and is_image_space(space)
        self._walk(space, ())
        if features == "nature_cnn" and not self.image and not self.image_parts:
            raise ConfigError(f"policy.features: nature_cnn needs an image observation (uint8 Box of 3 dimensions "
                              f"with bounds 0 and 255, alone or inside a Dict/Tuple); {short_repr(env_id)} has "
                              f"{_describe(space)}")
        self.obs_dim = self._offset
        #: channels last in the env's space (HWC): transposed to CHW by the encoder
        self.channels_last = self.image and int(np.argmin(space.shape)) != 0
        shape = tuple(int(s) for s in space.shape) if self.image else (self.obs_dim,)
        #: shape and dtype of one encoded observation
        self.obs_shape = (shape[2], shape[0], shape[1]) if self.channels_last else shape
        self.obs_dtype = np.uint8 if self.image else np.float32
        #: a plain Box space: encoding is a float32 cast and a flatten, as it always was
        self.plain = isinstance(space, spaces.Box) and not self.image
        self.tuple_space = isinstance(space, spaces.Tuple)
        mask = np.zeros(self.obs_dim, bool)
        for leaf in self.leaves:
            if leaf.kind == "box":
                mask[leaf.offset:leaf.offset + leaf.width] = True
        #: True for the columns that observation normalisation applies to (the Box leaves')
        self.normalize_mask = mask

    def _walk(self, space, path) -> None:
        from gymnasium import spaces

        where = f"env.id: {short_repr(self.env_id)} has an observation"
        if isinstance(space, spaces.Dict):
            for key, sub in space.spaces.items():
                self._walk(sub, path + (key,))
        elif isinstance(space, spaces.Tuple):
            for i, sub in enumerate(space.spaces):
                self._walk(sub, path + (i,))
        elif isinstance(space, spaces.Box):
            if path and self.features != "mlp" and is_image_space(space):  # a NatureCNN per image leaf
                shape = tuple(int(s) for s in space.shape)
                chw = (shape[2], shape[0], shape[1]) if int(np.argmin(shape)) != 0 else shape
                if min(chw[1:]) < MIN_CNN_SIDE:
                    raise ConfigError(f"{where} part {'.'.join(map(str, path))} that is an image of {chw[1]}x{chw[2]} "
                                      f"pixels; NatureCNN needs at least {MIN_CNN_SIDE}x{MIN_CNN_SIDE} "
                                      "(policy.features: mlp flattens it)")
                pixels = int(np.prod(shape, dtype=np.int64))
                self._add(path, "image", shape, -(-pixels // PIXELS_PER_COLUMN), chw=chw)
                return
            self._add(path, "box", space.shape, int(np.prod(space.shape, dtype=np.int64)))
        elif isinstance(space, spaces.Discrete):
            self._add(path, "discrete", (), int(space.n), (int(space.n),), (int(space.start),))
        elif isinstance(space, spaces.MultiDiscrete):
            nvec = tuple(int(n) for n in np.asarray(space.nvec).reshape(-1))
            start = tuple(int(s) for s in np.asarray(getattr(space, "start", np.zeros_like(space.nvec))).reshape(-1))
            self._add(path, "multidiscrete", tuple(space.shape), sum(nvec), nvec, start)
        elif isinstance(space, spaces.MultiBinary):
            shape = tuple(int(n) for n in np.atleast_1d(space.n))
            self._add(path, "multibinary", shape, int(np.prod(shape, dtype=np.int64)))
        else:
            part = f" part {'.'.join(map(str, path))}" if path else " space"
            raise ConfigError(f"{where}{part} of type {type(space).__name__}; scalebox_ms supports Box, Discrete, "
                              "MultiDiscrete and MultiBinary observations, and Dict/Tuple of them")

    def _add(self, path, kind, shape, width, nvec=(), start=(), chw=()) -> None:
        self.leaves.append(Leaf(tuple(path), kind, tuple(int(s) for s in shape), self._offset, width, nvec, start,
                                tuple(chw)))
        self._offset += width

    @property
    def image_parts(self) -> Tuple[Tuple[int, int, Tuple[int, int, int]], ...]:
        """``(offset, width, (C, H, W))`` of each image leaf's packed columns (empty without image leaves)."""
        return tuple((leaf.offset, leaf.width, leaf.chw) for leaf in self.leaves if leaf.kind == "image")

    # ------------------------------------------------------------------ encoding
    def _leaf_value(self, obs, leaf: Leaf):
        for p in leaf.path:
            obs = obs[p]
        return obs

    def is_single(self, obs) -> bool:
        """Whether ``obs`` is one observation (not a batch), judged from its first leaf's dimensions."""
        leaf = self.leaves[0]
        return np.ndim(self._leaf_value(obs, leaf)) == len(leaf.shape)

    def check_shapes(self, obs, single: bool, what: str = "predict") -> None:
        """A ValueError naming the part (Dict key / Tuple index) of ``obs`` that is missing or whose shape is not the
        observation space's (one observation, or a batch ``(N, *shape)`` when not ``single``), or that the space has
        not (a Dict key or Tuple index more: gymnasium's ``contains`` refuses it, and it was silently dropped)."""
        extra = _extra_part(self.space, obs)
        if extra is not None:
            raise ValueError(f"{what}: observation part {'.'.join(map(str, extra))} is not in the env's observation "
                             f"space ({' '.join(str(self.space).split())})")
        sizes = {}
        for leaf in self.leaves:
            part = "observation" if not leaf.path else f"observation part {leaf.name}"
            try:
                value = self._leaf_value(obs, leaf)
            except (KeyError, IndexError, TypeError):
                hint = ""
                if isinstance(obs, (list, tuple)) and obs and isinstance(obs[0], (dict, list, tuple)):
                    from gymnasium import spaces

                    kind = "dict" if isinstance(self.space, spaces.Dict) else "tuple"
                    hint = f"; a batch is one {kind} of batched parts, not a list of observations"
                raise ValueError(f"{what}: {part} is missing (the env's observation space is {self.space}{hint})") \
                    from None
            value = numbers(value, what, part)
            got = value.shape
            if (got if single else got[1:]) != tuple(leaf.shape) or (not single and len(got) != len(leaf.shape) + 1):
                raise ValueError(f"{what}: {part} has shape {got}; the env's observation space needs {leaf.shape} "
                                 f"(one observation) or (N, {', '.join(map(str, leaf.shape))}) (a batch)")
            if not single:
                sizes[leaf.name] = got[0]
        if len(set(sizes.values())) > 1:
            raise ValueError(f"{what}: the observation parts are batches of different sizes "
                             f"({', '.join(f'{k}: {v}' for k, v in sizes.items())})")

    def as_batch(self, obs, what: str):
        """``(batch, single)``: ``obs`` checked against the observation space and, when it is one observation, given
        a batch axis (a Tuple observation may also come as a list or a 1-D array of its parts). Not numbers, a part
        missing or of another shape, parts of different batch sizes, an empty batch: a one-line ValueError that
        starts with ``what``."""
        if self.plain:
            with np.errstate(over="ignore"):  # (beyond float32: inf, which check_finite then names in one line)
                obs = numbers(obs, what).astype(np.float32, copy=False)
        elif self.tuple_space and isinstance(obs, (list, np.ndarray)):
            obs = self._tuple_parts(obs, what)
        try:
            single = self.is_single(obs)
        except (KeyError, IndexError, TypeError):
            single = False  # (a part is missing: check_shapes names it)
        self.check_shapes(obs, single, what)  # (a wrong shape would fail deep inside a graph compile)
        if not single and np.shape(self._leaf_value(obs, self.leaves[0]))[0] == 0:
            raise ValueError(f"{what}: an empty batch (0 observations)")
        if single:
            obs = obs[None] if self.plain else _batch_of_one(obs)
        return obs, single

    def _tuple_parts(self, obs, what: str):
        """A Tuple observation given as a list or an array, as a tuple of its parts. A Tuple of scalar parts (e.g.
        Blackjack's three Discretes) may come as an ``(N, parts)`` array of N observations, or ``(parts, N)``; a
        square one is ambiguous and refused (it used to be read as parts by rows, and ``(N, parts)`` arrays misread
        as N parts)."""
        parts = len(self.space.spaces)
        if not all(getattr(sub, "shape", None) == () for sub in self.space.spaces):
            return tuple(obs) if isinstance(obs, list) or obs.ndim == 1 else obs
        try:
            array = np.asarray(obs)
        except ValueError:  # (ragged: check_shapes names the part)
            return tuple(obs)
        if array.ndim != 2 or array.dtype.kind not in "biuf":
            return tuple(obs) if array.ndim == 1 or isinstance(obs, list) else obs
        if array.shape == (parts, parts):
            raise ValueError(f"{what}: a ({parts}, {parts}) array is ambiguous for a Tuple of {parts} parts "
                             f"(observations by rows, or parts by rows); give a tuple of {parts} batched parts")
        if array.shape[1] == parts:  # N observations by rows
            return tuple(array[:, i] for i in range(parts))
        if array.shape[0] == parts:  # the parts by rows
            return tuple(array)
        raise ValueError(f"{what}: an array of shape {array.shape} for a Tuple of {parts} scalar parts; give (N, "
                         f"{parts}) observations by rows, or a tuple of {parts} batched parts")

    def leaf_arrays(self, obs, what: Optional[str] = None) -> List[np.ndarray]:
        """The batch's leaves in :attr:`leaves` order, each ``(batch, *leaf.shape)`` in its input dtype, checked to
        lie in the space (see :meth:`encode`): pixels 0..255, whole numbers within Discrete/MultiDiscrete, bits 0/1.
        """
        out = []
        for leaf in self.leaves:
            x = np.asarray(self._leaf_value(obs, leaf))
            if leaf.kind == "image":
                x = self._pixels(x, what, leaf)
            elif leaf.kind != "box" and x.dtype.kind == "f" and (x != np.round(x)).any():  # (the cast would truncate)
                flat = x.reshape(max(1, x.shape[0] if x.ndim else 1), -1)
                bad = np.argwhere(flat != np.round(flat))[0]
                self._off_space(what, leaf, flat[tuple(bad)], int(bad[0]), f"{leaf.kind}: whole numbers")
            x = x.reshape((-1,) + leaf.shape)
            flat = x.reshape(len(x), -1)
            if leaf.kind == "multibinary" and ((flat != 0) & (flat != 1)).any():
                bad = np.argwhere((flat != 0) & (flat != 1))[0]
                self._off_space(what, leaf, flat[tuple(bad)], int(bad[0]), "multibinary: values 0 or 1")
            if leaf.kind in ("discrete", "multidiscrete"):
                start, end = np.asarray(leaf.start), np.asarray(leaf.start) + np.asarray(leaf.nvec)
                off = (flat < start) | (flat >= end)
                if off.any():
                    bad = np.argwhere(off)[0]
                    self._off_space(what, leaf, flat[tuple(bad)], int(bad[0]),
                                    f"{leaf.kind} {list(leaf.nvec)}, start {list(leaf.start)}")
            out.append(x.astype(np.dtype(leaf.input_dtype), copy=False))
        return out

    def encode(self, obs, what: Optional[str] = None) -> np.ndarray:
        """A batch of observations -> ``float32 (batch, obs_dim)`` (images: ``uint8 (batch, C, H, W)``). A Discrete/
        MultiDiscrete value outside its space, or a MultiBinary value other than 0/1, is a TrainingError blaming
        the env, or with ``what`` (the caller's name, e.g. 'predict') a ValueError blaming the argument."""
        if self.image:
            obs = self._pixels(obs, what, self.leaves[0])
            return np.ascontiguousarray(obs.transpose(0, 3, 1, 2)) if self.channels_last else obs
        if self.plain:
            obs = np.asarray(obs, np.float32)
            return obs.reshape(obs.shape[0], -1)
        arrays = self.leaf_arrays(obs, what)
        B = arrays[0].shape[0]
        out = np.zeros((B, self.obs_dim), np.float32)
        for leaf, x in zip(self.leaves, arrays):
            cols = slice(leaf.offset, leaf.offset + leaf.width)
            if leaf.kind == "image":
                out[:, cols] = pack_pixels(x.transpose(0, 3, 1, 2) if leaf.channels_last else x)
                continue
            if leaf.kind in ("box", "multibinary"):
                out[:, cols] = x.reshape(B, -1)
                continue
            idx = x.reshape(B, -1).astype(np.int64) - np.asarray(leaf.start, np.int64)  # (in range: leaf_arrays)
            bounds = np.asarray(leaf.nvec, np.int64)
            col0 = leaf.offset + np.concatenate([[0], np.cumsum(bounds)[:-1]])
            out[np.arange(B)[:, None], col0[None, :] + idx] = 1.0
        return out

    def _pixels(self, x, what: Optional[str], leaf) -> np.ndarray:
        """Frames as uint8; other dtypes only with whole values in 0..255 (float frames scaled to [0, 1], or values
        beyond a byte, would otherwise be cast to garbage silently)."""
        x = np.asarray(x)
        if x.dtype == np.uint8:
            return x
        if x.size and (not np.issubdtype(x.dtype, np.number) or (x != np.round(x)).any() or x.min() < 0
                       or x.max() > 255):
            bad = np.argwhere((x != np.round(x)) | (x < 0) | (x > 255))[0] if np.issubdtype(x.dtype, np.number) \
                else np.zeros(x.ndim, int)
            self._off_space(what, leaf, x[tuple(bad)], int(bad[0]), "uint8 pixels 0..255; scale float frames back")
        return x.astype(np.uint8)

    def _off_space(self, what: Optional[str], leaf, value, row: int, space: str) -> None:
        value = value.item() if hasattr(value, "item") else value
        value = int(value) if isinstance(value, float) and value.is_integer() else value
        if what is None:
            raise TrainingError(f"env {self.env_id!r} returned observation {leaf.name} = {value} at env index {row}, "
                                f"outside its space ({space})")
        raise ValueError(f"{what}: observation {leaf.name} = {value} at index {row} is outside the env's observation "
                         f"space ({space})")

    def layout(self) -> list:
        """The observation's structure as the network reads it, as JSON: each leaf's path, kind, shape, columns and
        one-hot sizes; images as the CNN sees them, (C, H, W), whether the env gives HWC or CHW frames; not a Box's
        bounds or dtype, which ``env.kwargs`` may change when fine-tuning. Checkpoints record it, and are refused for
        an env whose layout differs (same width, other meaning: a MultiDiscrete [3, 4] trained on one-hots, fed a
        Box of 7 raw floats). Dict keys that are not strings or numbers are recorded as their ``str``."""
        if self.image:
            return [{"path": [], "kind": "image", "shape": list(self.obs_shape), "columns": [0, self.obs_dim]}]
        return [{"path": [p if isinstance(p, (str, int)) else str(p) for p in leaf.path], "kind": leaf.kind,
                 "shape": list(leaf.chw or leaf.shape), "columns": [leaf.offset, leaf.offset + leaf.width],
                 **({"nvec": list(leaf.nvec), "start": list(leaf.start)} if leaf.nvec else {})}
                for leaf in self.leaves]

    def describe(self) -> Optional[list]:
        """The leaves as JSON (None for a plain Box space): what an exported policy's inputs are."""
        if self.plain or self.image:
            return None
        return [{"name": leaf.name, "path": list(leaf.path), "kind": leaf.kind, "shape": list(leaf.shape),
                 "dtype": leaf.input_dtype, "columns": [leaf.offset, leaf.offset + leaf.width],
                 **({"nvec": list(leaf.nvec), "start": list(leaf.start)} if leaf.nvec else {}),
                 **({"image": {"chw": list(leaf.chw), "channels_last": leaf.channels_last, "scaled_in_graph": "1/255",
                               "packed": f"{PIXELS_PER_COLUMN} pixels per float32 column"}} if leaf.chw else {})}
                for leaf in self.leaves]


def numbers(value, what: str, part: str = "observation") -> np.ndarray:
    """``value`` as a numpy array of numbers (bool, integer or real), else a one-line ValueError naming ``what``
    (e.g. 'predict') and the part: a ragged nesting, strings, objects or complex numbers."""
    try:
        array = np.asarray(value)
    except ValueError:  # (numpy >= 1.24: a ragged nesting)
        raise ValueError(f"{what}: {part} is a ragged nesting of sequences, not an array of one shape") from None
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{what}: {part} must hold numbers, got {array.dtype} values")
    return array


def check_finite(x: np.ndarray, what: str, single: bool, part: str = "observation") -> None:
    """A one-line ValueError when float ``x`` (a batch) holds NaN or infinity."""
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        row = int(np.argwhere(~np.isfinite(x.reshape(len(x), -1)))[0][0])
        raise ValueError(f"{what}: the {part}{'' if single else f' at index {row}'} is not finite as float32 (NaN, "
                         "infinity, or beyond +-3.4e38)")


def _extra_part(space, obs, path=()) -> Optional[tuple]:
    """The path of a part of ``obs`` (a Dict key, a Tuple index) that ``space`` does not have, or None."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict) and isinstance(obs, dict):
        for key in obs:
            if key not in space.spaces:
                return path + (key,)
        parts = [(k, sub) for k, sub in space.spaces.items() if k in obs]
    elif isinstance(space, spaces.Tuple) and isinstance(obs, (tuple, list)):
        if len(obs) > len(space.spaces):
            return path + (len(space.spaces),)
        parts = list(enumerate(space.spaces))[:len(obs)]
    else:
        return None
    for key, sub in parts:
        found = _extra_part(sub, obs[key], path + (key,))
        if found is not None:
            return found
    return None


def _batch_of_one(obs):
    """One Dict/Tuple/Discrete observation as a batch of one (the same nesting, each leaf with a batch axis)."""
    if isinstance(obs, dict):
        return {k: _batch_of_one(v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_batch_of_one(v) for v in obs)
    return np.asarray(obs)[None]


def pack_pixels(frames: np.ndarray) -> np.ndarray:
    """uint8 frames (B, ...) -> float32 (B, ceil(n / 3)): pixels i, i+1, i+2 of each flattened frame (C order) as
    ``p0 + 256 * p1 + 65536 * p2`` (the last column zero-padded). Every value is an integer below 2**24, so float32
    holds it exactly; :func:`scalebox_ms.models.cnn.unpack_pixels` is the inverse (graph code)."""
    x = np.asarray(frames, np.uint8).reshape(len(frames), -1)
    pad = -x.shape[1] % PIXELS_PER_COLUMN
    if pad:
        x = np.concatenate([x, np.zeros((len(x), pad), np.uint8)], 1)
    x = x.reshape(len(x), -1, PIXELS_PER_COLUMN).astype(np.int32)
    return (x[..., 0] + 256 * x[..., 1] + 65536 * x[..., 2]).astype(np.float32)


def is_image_space(space) -> bool:
    """SB3's test: a uint8 Box of three dimensions whose bounds are 0 and 255."""
    from gymnasium import spaces

    return (isinstance(space, spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8
            and bool(np.all(space.low == 0)) and bool(np.all(space.high == 255)))


def _describe(space) -> str:
    shape = getattr(space, "shape", None)
    return f"{type(space).__name__}{'' if shape is None else ' of shape ' + str(tuple(shape))}" + (
        f", dtype {space.dtype}" if getattr(space, "dtype", None) is not None else "")
