"""``learn``'s hooks and arguments, shared by every trainer: :class:`Callback`, the callbacks' checks and answers,
the step counts' checks."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import ConfigError, short_repr


class Callback:
    """Hooks into ``learn``. Return False from ``on_iteration_end`` to stop training."""

    def on_training_start(self, trainer) -> None:
        pass

    def on_iteration_end(self, trainer, metrics: dict) -> Optional[bool]:
        return None

    def on_training_end(self, trainer) -> None:
        pass


def _whole(name: str, value) -> int:
    """``learn``'s step counts: an integer (or a float holding one, 1e5), as the config's integer keys take."""
    import numbers

    whole = (isinstance(value, numbers.Integral) and not isinstance(value, bool)) or \
        (isinstance(value, float) and value.is_integer())
    if not whole:
        raise ConfigError(f"{name}: expected an integer, got {short_repr(value)}")
    if abs(int(value)) >= 2**63:  # (run.total_steps is a 64-bit integer: a checkpoint of it would not load)
        raise ConfigError(f"{name}: expected a 64-bit integer, got {short_repr(value)}")
    return int(value)


def _callback_list(callbacks) -> list:
    """``learn``'s callbacks: a Callback, or a list (any iterable) of them (None: none). Objects of a class of one's
    own need the three hooks (a Callback subclass has them all)."""
    if callbacks is None:
        return []
    single = hasattr(callbacks, "on_iteration_end") or not hasattr(callbacks, "__iter__")
    callbacks = [callbacks] if single else list(callbacks)
    for cb in callbacks:
        if isinstance(cb, type):
            raise ConfigError(f"callbacks: {cb.__name__} is a class; pass an instance: {cb.__name__}()")
        missing = [h for h in ("on_training_start", "on_iteration_end", "on_training_end")
                   if not callable(getattr(cb, h, None))]
        if missing:
            raise ConfigError(f"callbacks: {short_repr(cb)} has no {missing[0]} method (subclass "
                              "scalebox_ms.trainers.Callback, whose hooks do nothing until overridden)")
    return callbacks


def _stops(answer) -> bool:
    """Whether a callback's ``on_iteration_end`` answer stops training: False, numpy's False_ included (``return
    np.mean(returns) < 475``); None, True and anything else go on."""
    return isinstance(answer, (bool, np.bool_)) and not answer
