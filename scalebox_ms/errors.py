"""Exceptions with one-line messages that name the culprit.

The CLIs turn these into ``error: <message>`` on stderr and exit code 2.
"""


class ScaleboxError(Exception):
    """Base class for user-facing errors of scalebox_ms."""


class ConfigError(ScaleboxError, ValueError):
    """A config key, value, env id or space that scalebox_ms cannot use."""


class CheckpointError(ScaleboxError):
    """A checkpoint that is missing, corrupt, or does not match the run."""


class CustomOpError(ScaleboxError):
    """A custom (C++ aot) operator that cannot be built or used here: no compiler, a failed compile, a backend
    the kernel does not support, or a use that needs gradients of an inference-only kernel."""
