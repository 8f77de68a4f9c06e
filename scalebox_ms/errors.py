"""Exceptions with one-line messages that name the culprit.

The CLIs turn these into ``error: <message>`` on stderr and exit code 2. A message never exceeds
:data:`MAX_MESSAGE` characters (longer ones are cut in the middle, with their length noted: the end of a
message says what to do), and messages that quote a user's
value quote it through :func:`short_repr`, so a hostile or mistaken value cannot make an error line huge.
"""
from __future__ import annotations

import reprlib
import signal

#: longest error message, in characters
MAX_MESSAGE = 500
#: characters of a message's end kept when it is cut (:func:`cap_message`)
KEPT_END = 200

_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdeque = 8
_REPR.maxlong = _REPR.maxother = 100


class Interrupted(KeyboardInterrupt):
    """A signal that stops at once: a second SIGINT/SIGTERM/SIGHUP during a run, or SIGTERM/SIGHUP to the
    ``--workers`` launcher. The CLIs exit 128 + ``signum``."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


#: exception messages that say nothing on their own -> what they mean where scalebox_ms meets them
_OPAQUE = {
    # numpy, inside gymnasium's vector envs batching the sub-envs' observations (np.stack(..., out=))
    "Output array is the wrong shape": "an observation whose shape differs from the env's observation_space",
}


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name when empty), explained where the message alone is
    opaque (:data:`_OPAQUE`)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return f"{line} ({_OPAQUE[line]})" if line in _OPAQUE else line


def import_failure(module: str) -> str:
    """Import ``module``: "" when it imports, else why not in words: "not installed", or "installed but its import
    fails (<type>: <first line>)" for a package whose own import raises (built for another numpy) or misses a
    library of its own (OpenCV's libGL.so.1), which reinstalling may mend."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as exc:
        if exc.name == module:
            return "not installed"
        reason = exc
    except Exception as exc:
        reason = exc
    else:
        return ""
    return f"installed but its import fails ({type(reason).__name__}: {first_line(reason)})"


def short_repr(value, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, with an ellipsis and the original length when cut.

    ``short_repr("x" * 10**6, 8)`` is ``'xxxxxxx... (1000000 chars)``; containers show their first items and
    their size (``[0, 1, 2, 3, 4, 5, 6, 7, ...]... (list of 1000 items)``). Time and memory do not grow with the
    value's size.
    """
    if isinstance(value, (str, bytes, bytearray)):
        text = repr(value[: limit + 1])
        size = f"{len(value)} {'chars' if isinstance(value, str) else 'bytes'}"
        if len(value) <= limit and len(text) <= limit:
            return text
    elif isinstance(value, int):
        try:
            text = repr(value)
        except ValueError:  # beyond Python's int-to-text digit limit
            return "an integer too long to print"
        size = f"{len(text)} chars"
        if len(text) <= limit:
            return text
    else:
        text = _REPR.repr(value)
        try:
            size = f"{type(value).__name__} of {len(value)} items"
            cut = len(value) > _REPR.maxlist
        except Exception:  # no len(): only the text's length is known
            size, cut = f"{len(text)} chars", False
        if len(text) <= limit and not cut:
            return text
    return f"{text[:limit]}... ({size})"


def cap_message(message: str) -> str:
    """``message`` cut to :data:`MAX_MESSAGE` characters when longer: its start and its last
    :data:`KEPT_END` characters (what to do about it, where most messages say so), its original length noted
    between them."""
    if len(message) <= MAX_MESSAGE:
        return message
    note = f" ... ({len(message)} chars) ... "
    return message[: MAX_MESSAGE - len(note) - KEPT_END] + note + message[-KEPT_END:]


class ScaleboxError(Exception):
    """Base class for user-facing errors of scalebox_ms; the message is capped at :data:`MAX_MESSAGE` characters."""

    def __init__(self, *args):
        if args and isinstance(args[0], str):
            args = (cap_message(args[0]),) + args[1:]
        super().__init__(*args)


class ConfigError(ScaleboxError, ValueError):
    """A config key, value, env id or space that scalebox_ms cannot use."""


def images_in_one_process(key: str, env_id: str = "") -> ConfigError:
    """PPO's refusal of image observations (NatureCNN) under AMP or data parallelism, from the trainer and from
    ``train --workers`` before msrun starts (which never imports MindSpore)."""
    of = f", the observations of {env_id!r}" if env_id else ""
    return ConfigError(f"{key}: image observations (NatureCNN{of}) train in float32 in one process only for now")


class CheckpointError(ScaleboxError):
    """A checkpoint that is missing, corrupt, or does not match the run."""


class OutputError(ScaleboxError):
    """A command's result could not be written to stdout (closed, a full disk, a closed pipe)."""


class CustomOpError(ScaleboxError):
    """A custom (C++ aot) operator that cannot be built or used here: no compiler, a failed compile, a backend
    the kernel does not support, or a use that needs gradients of an inference-only kernel."""


class TrainingError(ScaleboxError):
    """Training cannot go on: an env returned non-finite observations or rewards or raised an exception, or the
    loss stayed non-finite."""


def user_code_origin(exc: BaseException) -> str:
    """' (file.py:line in func)' of the innermost frame of the user's code (outside the standard library,
    site-packages and scalebox_ms: the env's own ``step``), or ''."""
    import os
    import sysconfig
    import traceback

    skip = (os.path.dirname(os.path.abspath(__file__)) + os.sep, sysconfig.get_paths()["stdlib"] + os.sep, "<")
    packages = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
    own = [f for f in traceback.extract_tb(exc.__traceback__)
           if not any(p in f.filename for p in packages) and not f.filename.startswith(skip)]
    return f" ({os.path.basename(own[-1].filename)}:{own[-1].lineno} in {own[-1].name})" if own else ""
