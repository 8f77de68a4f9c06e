"""The observation space an exported policy's sidecar describes (:func:`space_of_inputs`), for
:class:`~scalebox_ms.export.MindIRPolicy` to check its inputs with an :class:`~.obs_encoding.ObsEncoder` as
``predict`` does."""
from __future__ import annotations

import numpy as np


def space_of_inputs(inp: dict):
    """The gymnasium observation space an exported policy's sidecar ``input`` describes (its ``leaves``:
    :meth:`.obs_encoding.ObsEncoder.describe`), bounds aside (a Box is unbounded, an image Box uint8 0..255), with its Dict keys
    and Tuple indices in the inputs' order."""
    import collections

    from gymnasium import spaces

    if inp.get("image"):
        return spaces.Box(0, 255, tuple(inp["shape"][1:]), np.uint8)
    if inp.get("leaves") is None:
        shape = tuple(inp["observation_shape"] if "observation_shape" in inp else inp["shape"][1:])
        return spaces.Box(-np.inf, np.inf, shape, np.float32)

    def leaf_space(d):
        shape, kind = tuple(d["shape"]), d.get("kind")
        if kind == "image":
            return spaces.Box(0, 255, shape, np.uint8)
        if kind == "discrete":
            return spaces.Discrete(d["nvec"][0], start=d["start"][0])
        if kind == "multidiscrete":
            return spaces.MultiDiscrete(np.reshape(d["nvec"], shape), start=np.reshape(d["start"], shape))
        if kind == "multibinary":
            return spaces.MultiBinary(list(shape))
        return spaces.Box(-np.inf, np.inf, shape, np.float32)

    def tree(leaves, depth):
        if len(leaves) == 1 and len(leaves[0]["path"]) == depth:
            return leaf_space(leaves[0])
        parts = collections.OrderedDict()
        for d in leaves:
            parts.setdefault(d["path"][depth], []).append(d)
        if all(isinstance(k, int) for k in parts):
            return spaces.Tuple([tree(v, depth + 1) for v in parts.values()])
        return spaces.Dict(collections.OrderedDict((k, tree(v, depth + 1)) for k, v in parts.items()))

    return tree(inp["leaves"], 0)
