"""The observation encoding of :mod:`scalebox_ms.envs.obs_encoding` as graph ops, for exported policies.

Training encodes on the host (one numpy pass per vector step); an exported MindIR policy must take the raw
observation, so :class:`ObsEncoderCell` rebuilds the same flat vector inside the graph from one input Tensor
per leaf, in :attr:`ObsEncoder.leaves` order: ``float32 (B, *shape)`` for Box and MultiBinary leaves, ``int32
(B,)`` for Discrete and ``int32 (B, *shape)`` for MultiDiscrete leaves. Tests check it against the host encoder.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops


class ObsEncoderCell(nn.Cell):
    """(leaf_0, leaf_1, ...) -> float32 (B, obs_dim), the columns :class:`~scalebox_ms.envs.obs_encoding.ObsEncoder`
    writes."""

    def __init__(self, encoder):
        super().__init__()
        # static description per leaf: (kind, flattened width, [(start value, n), ...] for index leaves)
        self.parts = tuple((leaf.kind, int(np.prod(leaf.shape, dtype=np.int64)) if leaf.shape else 1,
                            tuple(zip(leaf.start, leaf.nvec))) for leaf in encoder.leaves)
        self.on = Tensor(1.0, ms.float32)
        self.off = Tensor(0.0, ms.float32)

    def construct(self, *leaves):
        cols = []
        for i, (kind, size, index) in enumerate(self.parts):
            x = leaves[i].reshape(leaves[i].shape[0], size)
            if kind in ("box", "multibinary"):
                cols.append(x.astype(ms.float32))
            else:
                for j, (start, n) in enumerate(index):
                    cols.append(ops.one_hot(x[:, j] - start, n, self.on, self.off))
        return ops.concat(cols, 1)
