"""The observation encoding of :mod:`scalebox_ms.envs.obs_encoding` as graph ops, for exported policies.

Training encodes on the host (one numpy pass per vector step); an exported MindIR policy must take the raw
observation, so :class:`ObsEncoderCell` rebuilds the same flat vector inside the graph from one input Tensor
per leaf, in :attr:`ObsEncoder.leaves` order: ``float32 (B, *shape)`` for Box and MultiBinary leaves, ``int32
(B,)`` for Discrete and ``int32 (B, *shape)`` for MultiDiscrete leaves, ``uint8 (B, *shape)`` for image leaves
(the env's frames, HWC or CHW: packed three pixels per column as the host does). Tests check it against the host
encoder.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from ..envs.obs_encoding import PIXELS_PER_COLUMN


class ObsEncoderCell(nn.Cell):
    """(leaf_0, leaf_1, ...) -> float32 (B, obs_dim), the columns :class:`~scalebox_ms.envs.obs_encoding.ObsEncoder`
    writes."""

    def __init__(self, encoder):
        super().__init__()
        # static description per leaf: (kind, flattened width, [(start value, n), ...] for index leaves,
        # channels last (image leaves))
        self.parts = tuple((leaf.kind, int(np.prod(leaf.shape, dtype=np.int64)) if leaf.shape else 1,
                            tuple(zip(leaf.start, leaf.nvec)), leaf.channels_last) for leaf in encoder.leaves)
        self.on = Tensor(1.0, ms.float32)
        self.off = Tensor(0.0, ms.float32)

    def construct(self, *leaves):
        cols = []
        for i, (kind, size, index, channels_last) in enumerate(self.parts):
            if kind == "image":
                cols.append(_pack_pixels(leaves[i], size, channels_last))
                continue
            x = leaves[i].reshape(leaves[i].shape[0], size)
            if kind in ("box", "multibinary"):
                cols.append(x.astype(ms.float32))
            else:
                for j, (start, n) in enumerate(index):
                    cols.append(ops.one_hot(x[:, j] - start, n, self.on, self.off))
        return ops.concat(cols, 1)


def _pack_pixels(frames, size: int, channels_last: bool):
    """uint8 frames (B, *shape) -> float32 (B, ceil(size / 3)) as :func:`~scalebox_ms.envs.obs_encoding.pack_pixels`
    (channels-last frames transposed to CHW first)."""
    if channels_last:
        frames = ops.transpose(frames, (0, 3, 1, 2))
    x = frames.reshape(frames.shape[0], size).astype(ms.float32)
    pad = -size % PIXELS_PER_COLUMN
    if pad:
        x = ops.concat([x, ops.zeros((x.shape[0], pad), ms.float32)], 1)
    x = x.reshape(x.shape[0], -1, PIXELS_PER_COLUMN)
    return x[:, :, 0] + 256.0 * x[:, :, 1] + 65536.0 * x[:, :, 2]
