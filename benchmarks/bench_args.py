"""argparse types the benchmark scripts share: a value out of range is argparse's own one-line error (exit 2),
not a traceback (a median of no calls, a division by a zero size) or a results file of empty rows."""
from __future__ import annotations

import argparse
import os


def at_least(low, kind=int):
    """A number (``kind``) >= ``low``."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if not value >= low:  # (also NaN)
            raise argparse.ArgumentTypeError(f"must be >= {low:g}, got {text}")
        return value
    return parse


def above(low: float):
    """A float > ``low``."""
    def parse(text: str):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > low:
            raise argparse.ArgumentTypeError(f"must be > {low:g}, got {text}")
        return value
    return parse


def results_to_plot(ap: argparse.ArgumentParser, path: str) -> str:
    """``--plot-only``'s results file, which must exist."""
    if not os.path.isfile(path):
        ap.error(f"--plot-only: no results file {path} (give the run's --out)")
    return path


def plot_path(plot, out: str, default_out: str, default_plot: str) -> str:
    """Where a script draws its figure: ``--plot`` if given; else the docs' figure (``default_plot``) for a run
    written to its default results file (the command the docs quote), or a ``.png`` next to another ``--out``, so a
    trial run elsewhere never replaces a figure of the docs."""
    if plot:
        return plot
    if os.path.abspath(out) == os.path.abspath(default_out):
        return default_plot
    return os.path.splitext(out)[0] + ".png"


#: what each library of a side-by-side run imports, with the extra that installs it
SB3 = (("stable_baselines3", "bench"), ("torch", "bench"))
MUJOCO = (("mujoco", "mujoco"),)
ATARI = (("ale_py", "atari"), ("cv2", "atari"))


def require(*needs) -> None:
    """Stop with one line naming the first module of ``needs`` ((module, extra) pairs) that cannot be imported and
    the extra that installs it, before any run: a side-by-side script ran its first library for tens of minutes and
    then its second one died with a traceback."""
    import importlib

    for module, extra in dict.fromkeys(needs):
        try:
            importlib.import_module(module)
        except Exception as exc:  # (ImportError, or a broken install)
            from scalebox_ms.errors import first_line

            raise SystemExit(f"{module} cannot be imported ({type(exc).__name__}: {first_line(exc)}): "
                             f'pip install -e ".[{extra}]"') from None
