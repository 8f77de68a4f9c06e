"""Shared bits of the command-line front ends: one-line errors and exit code 2."""
from __future__ import annotations

import argparse
import sys


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad flags as a single ``error: ...`` line (exit 2) instead of usage + error."""

    def error(self, message: str):
        sys.stderr.write(f"error: {self.prog}: {message}\n")
        raise SystemExit(2)


def run_cli(fn) -> int:
    """Call ``fn()``; turn scalebox_ms errors into one stderr line and exit code 2."""
    from .errors import ScaleboxError

    try:
        fn()
    except ScaleboxError as exc:
        sys.stderr.write(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    return 0
