"""Shared bits of the command-line front ends: one-line errors and exit code 2."""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad flags as a single ``error: ...`` line (exit 2) instead of usage + error, naming the
    flag first as every other error does. ``tool``: 'train', 'evaluate', ... (the usage line names the command as
    it was run: ``scalebox-train`` or ``python -m scalebox_ms.train``)."""

    def __init__(self, tool: str, **kwargs):
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        super().__init__(prog=script if script == f"scalebox-{tool}" else f"python -m scalebox_ms.{tool}", **kwargs)

    def error(self, message: str):
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(2)

    def parse_args(self, args=None, namespace=None):
        """SIGTERM/SIGHUP (:func:`stop_at_once_on_termination`) or Ctrl-C while the flags are parsed: "interrupted"
        and 128 + the signal's number, as later on (it was a traceback)."""
        try:
            return super().parse_args(args, namespace)
        except KeyboardInterrupt as exc:
            say("interrupted")
            raise SystemExit(128 + getattr(exc, "signum", signal.SIGINT)) from None


def bars_cleared():
    """A context in which stderr is free of tqdm progress bars (cleared on entry, drawn again on exit); a no-op
    without tqdm (never imported, or a stand-in in sys.modules)."""
    tqdm = sys.modules.get("tqdm")
    try:
        return tqdm.tqdm.external_write_mode(file=sys.stderr)
    except Exception:
        return contextlib.nullcontext()


def say(line: str) -> None:
    """One line to stderr; a closed or broken stderr (``2>&-``, a pipe into ``head``) must not stop a run. A
    progress bar on the terminal is cleared first and drawn again after (the line landed at the bar's end)."""
    try:
        with bars_cleared():
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
    except (OSError, AttributeError, ValueError):  # (AttributeError: sys.stderr is None; ValueError: closed)
        pass


class SayHandler(logging.Handler):
    """The ``scalebox_ms`` logger's lines through :func:`say`."""

    def emit(self, record):
        say(self.format(record))


def say_out(text: str, kept_in: str = "") -> None:
    """``text`` to stdout, as :func:`say` to stderr: for output that is also in a file (train's summary is
    ``summary.json``, ``kept_in``), where a terminal hung up (SIGHUP) or a closed pipe must not turn a finished run
    into an error. A stdout that cannot take it (``> /dev/full``) is a warning line naming the file."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except (OSError, AttributeError, ValueError) as exc:
        if sys.stdout is not None:
            _drop_unwritten_stdout()
        if kept_in:
            why = "is closed" if sys.stdout is None else f": {getattr(exc, 'strerror', None) or type(exc).__name__}"
            say(f"warning: stdout{why}: the summary was not printed; it is in {kept_in}")


def emit(text: str, written: str = "") -> None:
    """``text`` to stdout where it is the command's result (evaluate's scores, doctor's report, export's ``--json``):
    a stdout that cannot take it (closed, ``> /dev/full``, a closed pipe) raises :class:`~.errors.OutputError`
    naming stdout, never a silent success. ``written`` names what the command did write before (export's files)."""
    from .errors import OutputError

    done = f" ({written} written)" if written else ""
    if sys.stdout is None:  # (Python's stdout when file descriptor 1 was closed at start)
        raise OutputError(f"stdout is closed: the result was not printed{done}")
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except (OSError, ValueError) as exc:
        _drop_unwritten_stdout()
        raise OutputError(f"stdout: {getattr(exc, 'strerror', None) or exc}: the result was not printed{done}") from None


def _drop_unwritten_stdout() -> None:
    """Point file descriptor 1 at /dev/null: what could not be written stays in stdout's buffer, and Python's own
    flush at exit would fail again with a second message (``Exception ignored ...``) and exit code 120."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def run_cli(fn) -> int:
    """Call ``fn()``; turn scalebox_ms errors into one stderr line and exit code 2."""
    from .errors import ScaleboxError

    try:
        fn()
    except ScaleboxError as exc:
        say(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        return 2
    except OSError as exc:  # disk full, permission denied, ...: the file and the reason, no traceback
        where = f"{exc.filename}: " if exc.filename else ""
        say(f"error: {where}{exc.strerror or exc}")
        return 2
    except KeyboardInterrupt as exc:  # (scalebox_ms.errors.Interrupted carries the signal's number)
        say("interrupted")
        return 128 + getattr(exc, "signum", 2)
    return 0


def refuse_empty_checkpoint(value) -> None:
    """``--checkpoint ""`` (an unset shell variable) is refused: it read as the current directory or the latest."""
    from .errors import ConfigError

    if value is not None and not value.strip():
        raise ConfigError("--checkpoint: empty (leave the flag out for the run's latest checkpoint)")


def import_mindspore() -> None:
    """Import MindSpore whole: a Ctrl-C during its import (~1.5 s) is held back until the import is done, then
    raised (KeyboardInterrupt). A KeyboardInterrupt inside the import left MindSpore half-initialised, and the
    interpreter then aborted while shutting down (SIGABRT, exit 134, a screen of "Fatal Python error").

    MindSpore's logging is set to errors only (``GLOG_v=3``) unless the environment sets it: its import and first
    context call otherwise print ~10 WARNING lines (the Ascend and GPU plugins it cannot load on a CPU machine,
    deprecated arguments) before every command's own output. An import that fails, or a ``sys.path`` entry that the
    graph compiler cannot take (one that cannot be encoded as UTF-8: a non-ASCII directory name whose bytes did not
    decode in a non-UTF-8 locale), is a one-line ConfigError."""
    import os

    from .errors import ConfigError, first_line, short_repr

    os.environ.setdefault("GLOG_v", "3")  # (read when MindSpore's logger starts: before the import)
    try:
        os.getcwd()
    except FileNotFoundError:  # (MindSpore's import failed on it, then the interpreter aborted: exit 134)
        raise ConfigError("the current directory no longer exists (deleted or moved): cd to another one") from None
    try:
        import_held("mindspore")
    except Exception as exc:  # (a broken install, GLOG_v=abc, ...: doctor names more)
        raise ConfigError(f"mindspore cannot be imported ({type(exc).__name__}: {first_line(exc)}); "
                          "python -m scalebox_ms.doctor checks the installation") from None
    for entry in sys.path:  # MindSpore's graph compiler takes sys.path as UTF-8 strings: every compile failed
        try:
            if isinstance(entry, str):
                entry.encode("utf-8")
        except UnicodeEncodeError:  # (a path the locale could not decode: surrogate escapes)
            raise ConfigError(f"sys.path entry {short_repr(entry)} (the current directory or PYTHONPATH) cannot be "
                              "encoded as UTF-8 (its bytes did not decode in this locale), which MindSpore's graph "
                              "compiler needs: set a UTF-8 locale (LC_ALL=C.UTF-8) or run from another directory") \
                from None


def import_held(*modules: str) -> None:
    """Import ``modules`` with Ctrl-C held back until they are imported, then raised (KeyboardInterrupt). Some
    imports lose a KeyboardInterrupt raised inside them: numpy's (its C extension's initialisation) swallowed a
    Ctrl-C ~0.1 s after ``train`` started, and the run went on to the end."""
    import importlib

    if all(m in sys.modules for m in modules):
        return
    with sigint_held():
        for m in modules:
            importlib.import_module(m)


@contextlib.contextmanager
def sigint_held():
    """Run the block with Ctrl-C held back, then raise it (KeyboardInterrupt) when the block is done; for code that
    mishandles a KeyboardInterrupt raised inside it: MindSpore's graph compiler (``ms.export``) turned one into ~30
    lines of ANALYZER errors and an ``analyze_fail.ir`` dump in the working directory, or lost it and went on.
    Only in the main thread, and for SIGINT only with Python's default handler (ignored, or a handler of yours: the
    block runs as it is); SIGTERM and SIGHUP are held where :func:`stop_at_once_on_termination` set them.

    It yields a function that tells whether a Ctrl-C is held, for a long block to stop early at a safe point
    (``evaluate_policy(..., should_stop=asked)``)."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    # (SIGTERM and SIGHUP too where they stop at once, :func:`stop_at_once_on_termination`, whatever SIGINT's
    # handler is: a command started with `&` has SIGINT ignored, and a SIGTERM raised inside MindSpore's import)
    signums = [signal.SIGINT] if signal.getsignal(signal.SIGINT) is signal.default_int_handler else []
    signums += [s for s in _TERMINATION if signal.getsignal(s) is _stop_at_once]
    if not signums:
        yield lambda: False
        return
    held = []
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in signums}
    try:
        yield lambda: bool(held)
    except BaseException as exc:  # (an error after a Ctrl-C: the Ctrl-C is what was asked for)
        if held:
            raise _interrupt(held[0]) from exc
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if held:
        raise _interrupt(held[0])


def _interrupt(signum: int) -> KeyboardInterrupt:
    from .errors import Interrupted

    return KeyboardInterrupt() if signum == signal.SIGINT else Interrupted(signum)


_TERMINATION = (signal.SIGTERM, signal.SIGHUP)


def _stop_at_once(signum, frame):
    from .errors import Interrupted

    raise Interrupted(signum)


def stop_at_once_on_termination() -> None:
    """SIGTERM, and SIGHUP unless it is ignored (``nohup``), stop the command as Ctrl-C does (``interrupted``, exit
    128 + the signal's number; held back by :func:`sigint_held` like Ctrl-C) instead of killing it without a word
    (exit 143 while ``train`` started up, before its run's own handlers). For the CLIs' own processes (main thread
    only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in _TERMINATION:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _stop_at_once)


_routed = False  # route_sigint_around_mindspore ran: SIGINT is to stay blocked in the main thread


@contextlib.contextmanager
def sigint_routing_kept():
    """Around starting a ``multiprocessing`` process: the first one starts multiprocessing's resource tracker, which
    unblocks SIGINT in the calling thread when it is done, undoing :func:`route_sigint_around_mindspore` (a Ctrl-C
    then reached MindSpore's handler and ended the run as SIGTERM, exit 143). Blocks it again afterwards."""
    try:
        yield
    finally:
        if _routed and threading.current_thread() is threading.main_thread():
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def route_sigint_around_mindspore() -> None:
    """Deliver Ctrl-C to the main thread's Python handler as SIGINT, whatever MindSpore does with it.

    While it runs a graph, MindSpore 2.10 installs its own C handler for SIGINT, which sends the process SIGTERM
    instead. Call this before anything starts threads (numpy, MindSpore): SIGINT is then blocked in every thread
    (threads and child processes inherit the mask), and a thread of ours waits for it and hands it to the main
    thread with ``_thread.interrupt_main(SIGINT)``, which runs Python's SIGINT handler there (KeyboardInterrupt by
    default, or the run's own handler).
    """
    import _thread

    global _routed
    if threading.current_thread() is not threading.main_thread() or threading.active_count() > 1:
        return  # other threads already run with SIGINT unblocked: routing would not be reliable
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    _routed = True

    def wait():
        while True:
            signal.sigwait({signal.SIGINT})
            # (not once the main thread is done: the command's work is over, and a KeyboardInterrupt raised into
            # Python's exit, MindSpore's clean-up in atexit, printed a traceback after "wrote ...")
            if threading.main_thread().is_alive():
                _thread.interrupt_main(signal.SIGINT)

    threading.Thread(target=wait, name="scalebox-sigint", daemon=True).start()
