"""The parts of a run's life around training: which checkpoint a resume continues from, whether the run's config
still matches it, what code and packages each session ran (``environment.json``), and stopping cleanly on
SIGINT/SIGTERM/SIGHUP."""
from __future__ import annotations

import csv
import glob
import io
import json
import os
import re
import signal
import sys
import threading
from typing import Dict, List, Optional

from ..errors import CheckpointError, ConfigError, Interrupted, first_line
from ..fileio import atomic_write_json, atomic_write_text
from .checkpoint import AUTO_NAME, newest_intact, read_sidecar, resolve_checkpoint, verify_checkpoint
from .ppo import Callback

# config keys a resumed run may change: the horizon (run.total_steps extends or shortens the run, and with it the
# linear schedules' horizon) and bookkeeping that does not enter the maths (the launcher's timeouts included)
RESUMABLE_KEYS = ("run.total_steps", "run.progress", "run.checkpoint_every", "run.keep_checkpoints",
                  "run.eval_episodes", "run.eval_every", "run.stop_return", "run.save_replay", "parallel.timeout",
                  "parallel.hang_timeout")


def select_checkpoint(run_dir: str, chosen: Optional[str], check_replay: bool = True) -> Optional[str]:
    """The checkpoint ``--resume run_dir [--checkpoint chosen]`` continues from (verified; the replay buffer's file
    only with ``check_replay``: the run's ``run.save_replay``), or None when the run has none yet. A corrupt latest
    checkpoint is refused, naming the newest intact one."""
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    if chosen is not None:
        prefix = resolve_checkpoint(chosen)
        where, own = os.path.realpath(os.path.dirname(prefix)), os.path.realpath(ckpt_dir)
        if where != own:
            discarded = os.path.join(own, "discarded")
            if os.path.commonpath([where, discarded]) == discarded:
                raise ConfigError(f"--checkpoint {chosen}: a checkpoint an earlier resume moved to discarded/; move "
                                  f"its files back into {ckpt_dir} to continue from it")
            raise ConfigError(f"--checkpoint {chosen}: not one of {run_dir}'s checkpoints (in {ckpt_dir})")
        try:
            verify_checkpoint(prefix, check_replay)
        except CheckpointError:
            if _only_replay_lost(prefix):
                raise CheckpointError(f"--checkpoint {chosen}: {_replay_lost(prefix)}") from None
            raise
        return prefix
    prefix, broken = newest_intact(ckpt_dir, check_replay) if os.path.isdir(ckpt_dir) else (None, {})
    if prefix is None and not broken:
        _refuse_a_trained_run_without_checkpoints(run_dir, ckpt_dir)
    if not broken:
        return prefix
    latest = next(iter(broken))  # (newest_intact fills it newest first)
    if _only_replay_lost(latest):
        older = f"; or go back to the newest intact checkpoint: --checkpoint {prefix}.json" if prefix else ""
        raise CheckpointError(f"--resume {run_dir}: {_replay_lost(latest)}{older}")
    why = broken[latest]
    if prefix is None:
        raise CheckpointError(f"--resume {run_dir}: no intact checkpoint (latest: {why}); start a new run from "
                              f"its config in another directory: --config {os.path.join(run_dir, 'config.yaml')} "
                              "--run-dir <new dir>")
    raise CheckpointError(f"--resume {run_dir}: the latest checkpoint {os.path.basename(latest)} is unusable "
                          f"({why}); the newest intact one is {os.path.basename(prefix)}: continue from it with "
                          f"--checkpoint {prefix}.json")


def _refuse_a_trained_run_without_checkpoints(run_dir: str, ckpt_dir: str) -> None:
    """A run without checkpoints starts again from step 0 only where it never trained (killed between its
    config.yaml and ckpt_0): a run whose checkpoints/ is gone (deleted, a link to a disk not mounted) was
    restarted from 0, its metrics.csv cut to nothing."""
    rows = read_metrics(os.path.join(run_dir, "metrics.csv")) or []
    trained = len(rows) > 1 or os.path.exists(os.path.join(run_dir, "summary.json"))
    dangling = os.path.islink(ckpt_dir) and not os.path.exists(ckpt_dir)
    if dangling and not trained:
        raise CheckpointError(f"--resume {run_dir}: {ckpt_dir} is a link to a missing directory: restore it (or "
                              "remove the link to start the run again from step 0)")
    if trained:
        what = ("a link to a missing directory" if dangling else "missing" if not os.path.exists(ckpt_dir)
                else "without checkpoints")
        raise CheckpointError(f"--resume {run_dir}: {ckpt_dir} is {what}, but the run has trained (its metrics.csv "
                              "and summary.json): restore its checkpoints, or start a new run from its config in "
                              f"another directory: --config {os.path.join(run_dir, 'config.yaml')} --run-dir <new dir>")


#: the longest path train writes below a run directory: a checkpoint's replay file being staged
LONGEST_RUN_PATH = os.path.join("checkpoints", ".tmp-ckpt_000000000000.replay.npz-xxxxxxxx.npz")


def check_path_length(run_dir: str, flag: str) -> None:
    """A run directory whose files would pass the system's path limit (PATH_MAX) is refused before anything is
    written: it got config.yaml and environment.json, then failed at ckpt_0, and neither --resume nor a fresh start
    into it could continue."""
    try:
        limit = os.pathconf("/", "PC_PATH_MAX")
    except (OSError, ValueError):
        limit = 4096
    longest = len(os.fsencode(os.path.join(os.path.abspath(run_dir), LONGEST_RUN_PATH)))
    if longest >= limit:
        raise ConfigError(f"{flag} {run_dir}: too long a path: the files a run writes below it need up to {longest} "
                          f"bytes, more than the system's limit of {limit - 1}")


def _only_replay_lost(prefix: str) -> bool:
    """Whether the checkpoint is intact but for its replay buffer's file."""
    try:
        verify_checkpoint(prefix, check_replay=False)
    except CheckpointError:
        return False
    return True


def _replay_lost(prefix: str) -> str:
    name = os.path.basename(prefix)
    return (f"{name}.replay.npz (its replay buffer) is missing or corrupt; to continue from {name} with an empty "
            "buffer that refills (not bit-identical), set run.save_replay: false in the run's config.yaml")


def discard_newer(run_dir: str, step: int, log) -> None:
    """Move checkpoint files of steps after ``step`` (a resume from an earlier checkpoint abandons them) into
    ``checkpoints/discarded/``, where neither resume nor pruning looks. Nothing there is overwritten: when an earlier
    resume already put a file of the same name there, this one's files go to ``discarded/2/`` (``3/``, ...)."""
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    later = []
    for path in glob.glob(os.path.join(glob.escape(ckpt_dir), "ckpt_*")):
        name = os.path.basename(path).split(".", 1)[0]
        m = AUTO_NAME.fullmatch(name)  # (the run's own names; a user's ckpt_7 stays)
        if m and int(m.group(1)) > step:
            later.append((path, name))
    if not later:
        return
    target, n = os.path.join(ckpt_dir, "discarded"), 1
    while any(os.path.lexists(os.path.join(target, os.path.basename(path))) for path, _ in later):
        n += 1
        target = os.path.join(ckpt_dir, "discarded", str(n))
    os.makedirs(target, exist_ok=True)
    for path, _ in later:
        os.replace(path, os.path.join(target, os.path.basename(path)))
    log(f"moved the later checkpoint(s) {', '.join(sorted({name for _, name in later}))} to {target}")


#: the files ``train`` writes atomically in a run directory (their temporaries: ``.tmp-<name>-*``)
RUN_FILES = ("config.yaml", "metrics.csv", "summary.json", "environment.json", "learning_curve.png")


def remove_stale_temporaries(run_dir: str, log=None) -> None:
    """Delete the ``.tmp-*`` files a killed train left, and the files of checkpoints without their sidecar (a
    process killed between a checkpoint's files, or while pruning one, sidecar first: never a checkpoint, and an
    off-policy one's replay file may be gigabytes; only the run's own names, ``ckpt_<12 digits>``, are looked at,
    and ``log`` names them). Call with the run's lock held: no other train is active. ``export`` writes into the
    run directory without that lock: its graph's temporaries (``.tmp-export-<pid>-*``) are removed only once that
    process is gone (a resume deleted a running export's file, which then failed), its sidecar's (a few kB, no pid
    in the name) never."""
    from .checkpoint import AUTO_NAME, EXTENSIONS

    ckpt_dir = os.path.join(run_dir, "checkpoints")
    stale = glob.glob(os.path.join(glob.escape(ckpt_dir), ".tmp-*"))
    for name in RUN_FILES:
        stale += glob.glob(os.path.join(glob.escape(run_dir), glob.escape(f".tmp-{name}-") + "*"))
    from ..runlock import _running

    for path in glob.glob(os.path.join(glob.escape(run_dir), ".tmp-export-*")):
        pid = re.fullmatch(r"\.tmp-export-([0-9]{1,9})-.*", os.path.basename(path), re.ASCII | re.DOTALL)
        if pid and not _running(int(pid.group(1))):
            stale.append(path)
    orphans = []
    for path in glob.glob(os.path.join(glob.escape(ckpt_dir), "ckpt_*")):
        name = os.path.basename(path)
        for ext in EXTENSIONS[1:]:
            if name.endswith(ext) and AUTO_NAME.fullmatch(name[: -len(ext)]) and \
                    not os.path.exists(path[: -len(ext)] + ".json"):
                orphans.append(path)
    if orphans and log is not None:
        log(f"removed {', '.join(sorted(os.path.basename(p) for p in orphans))}: files of checkpoint(s) without "
            "their sidecar (a process killed while writing or pruning them)")
    for path in stale + orphans:
        try:
            os.unlink(path)
        except OSError:
            pass


def code_record(package_dir: Optional[str] = None) -> dict:
    """The scalebox_ms code that runs: its version, the directory it is imported from and, when that directory is at
    the top of a git checkout (a clone installed with ``-e`` or put on PYTHONPATH), the commit and whether the
    package's files differ from it, new ones included (the version number alone does not tell two checkouts
    apart). git runs without taking the index lock and without the caller's ``GIT_*`` variables (a git hook's
    ``GIT_DIR`` would point it at another repository)."""
    import subprocess

    import scalebox_ms

    package_dir = package_dir or os.path.dirname(os.path.abspath(scalebox_ms.__file__))
    record = {"version": scalebox_ms.__version__, "path": package_dir, "git_commit": None, "git_modified": None}
    root = os.path.dirname(package_dir)
    if os.path.exists(os.path.join(root, ".git")):  # (not a site-packages inside some other checkout)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        try:
            def git(*args):
                return subprocess.run(["git", "--no-optional-locks", "-C", root, *args], capture_output=True,
                                      text=True, timeout=5, check=True, env=env).stdout.strip()

            record["git_commit"] = git("rev-parse", "HEAD")
            record["git_modified"] = bool(git("status", "--porcelain", "--", os.path.basename(package_dir)))
        except (OSError, subprocess.SubprocessError):  # (no git, a checkout git refuses to read, ...)
            pass
    return record


def environment_record(cfg, trainer) -> dict:
    """What a reproduction needs: the code and package versions, platform, config hash, the sandbox and the envs'
    isolation, and when the session started."""
    import platform
    import time
    from importlib.metadata import PackageNotFoundError, version

    def v(name):
        try:
            return version(name)
        except PackageNotFoundError:  # (a source tree on PYTHONPATH)
            return None

    return {"python": platform.python_version(), "platform": platform.platform(), "code": code_record(),
            "packages": {n: v(n) for n in ("scalebox_ms", "mindspore", "numpy", "gymnasium", "pyyaml")},
            "config_sha256": cfg.hash(), "sandbox": repr(trainer.sandbox),
            "isolation_level": cfg.sandbox.isolation_level,  # (the config's, whatever a given Sandbox says)
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def record_session(run_dir: str, cfg, trainer, log) -> None:
    """Add a resumed session to ``environment.json``'s ``resumed`` list (its step and :func:`environment_record`),
    so that a run continued by another version of the code or its packages says so. A missing or damaged file is
    written again with this session only (a warning)."""
    path = os.path.join(run_dir, "environment.json")
    try:
        with open(path, "r", encoding="utf-8") as f:
            record = json.load(f)
        if not isinstance(record, dict) or not isinstance(record.get("resumed", []), list):
            raise ValueError
    except (OSError, ValueError) as exc:
        why = "missing" if isinstance(exc, FileNotFoundError) else "unreadable"
        log(f"warning: {path} was {why}: it records this session only")
        record = {}
    record.setdefault("resumed", []).append({"step": trainer.global_step, **environment_record(cfg, trainer)})
    atomic_write_json(path, record)


def failed_summary(cfg, run_dir: str, ckpt_dir: str, exc: Exception) -> None:
    """summary.json of a run an error stopped: ``status`` 'failed', the error's line and the step of the checkpoint
    ``--resume`` continues from (its newest intact one). Nothing here may replace the error being reported, nor
    re-create a run directory moved or deleted while it trained (its config.yaml is gone: nothing is written)."""
    if not os.path.isfile(os.path.join(run_dir, "config.yaml")):
        return
    try:
        prefix, _ = newest_intact(ckpt_dir, cfg.run.save_replay)
        summary = {"status": "failed", "error": first_line(exc), "env_id": cfg.env.id, "algo": cfg.algo,
                   "seed": cfg.run.seed, "total_steps": cfg.run.total_steps,
                   "resume_step": int(read_sidecar(prefix)["global_step"]) if prefix else None}
        atomic_write_json(os.path.join(run_dir, "summary.json"), summary)
    except Exception:  # (a full disk, no memory left: the error that stopped the run is the one to report)
        pass


def _flatten(d: dict, prefix: str = "") -> Dict[str, object]:
    """``section.key`` -> value; ``env.kwargs`` one level further (``env.kwargs.<name>``), so a changed kwarg is named
    alone (the whole dict on each side was cut by the error's length cap just where it differed)."""
    out: Dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict) and (prefix == "" or (prefix == "env." and k == "kwargs")):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + str(k)] = v
    return out


def _with_defaults(trained: dict) -> dict:
    """A checkpoint's config as this version reads it: keys added since it was written take their defaults (configs
    before ``algo`` existed: ppo); one this version cannot read is compared as written."""
    from ..config import Config

    written = {"algo": "ppo", **trained}
    try:
        return Config.from_dict(written).to_dict()
    except (ConfigError, TypeError, ValueError):
        return written


def config_changes(trained: dict, current: dict, free=RESUMABLE_KEYS) -> List[str]:
    """``key=old -> new`` for every key but ``free`` whose value differs between a checkpoint's config and a run's."""
    # (as JSON has them: a config built in Python may hold tuples where the sidecar's JSON has lists)
    old, new = (_flatten(json.loads(json.dumps(d, default=str))) for d in (_with_defaults(trained), current))
    return [f"{k}={old.get(k, '(absent)')} -> {new.get(k, '(absent)')}"
            for k in sorted(set(old) | set(new)) if k not in free and old.get(k) != new.get(k)]


# also editable in a run's config.yaml before --resume (not on a built trainer's config: its Sandbox holds it): a run
# stopped by its memory limit continues with a higher one
RESUME_ONLY_KEYS = ("sandbox.memory_limit",)


def check_config_unchanged(run_dir: str, prefix: str, trained: dict, current: dict) -> None:
    """Refuse a config.yaml edited since the checkpoint was written (except :data:`RESUMABLE_KEYS` and
    :data:`RESUME_ONLY_KEYS`)."""
    free = RESUMABLE_KEYS + RESUME_ONLY_KEYS
    changed = config_changes(trained, current, free=free)
    if changed:
        raise ConfigError(f"--resume {run_dir}: config.yaml differs from the config {os.path.basename(prefix)} was "
                          f"trained with: {', '.join(changed)} (checkpoint -> config.yaml); only "
                          f"{', '.join(free)} may change on resume")


def read_metrics(path: str) -> Optional[list]:
    """metrics.csv's rows (None: no file or an empty one); a file a resume cannot cut back is a CheckpointError. A
    resume reads it before it moves any checkpoint (a damaged file refused after that had discarded them)."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise CheckpointError(f"{path}: not a metrics file scalebox_ms can read ({type(exc).__name__}); move it "
                              "aside to resume (the checkpoints do not need it)") from None
    if not rows:
        return None
    if "global_step" not in rows[0]:
        raise CheckpointError(f"{path}: its header has no global_step column (damaged); move it aside to resume "
                              "(the checkpoints do not need it)")
    return rows


def truncate_metrics(path: str, global_step: int, rows: Optional[list] = None) -> None:
    """Drop rows logged after the checkpoint a run resumes from (they will be produced again); ``rows``: the file's
    as :func:`read_metrics` read them."""
    rows = read_metrics(path) if rows is None else rows
    if not rows:
        return
    header, body = rows[0], rows[1:]
    col = header.index("global_step")
    kept = [r for r in body if len(r) == len(header) and r[col].isdigit() and int(r[col]) <= global_step]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(kept)
    atomic_write_text(path, buf.getvalue())


class StopOnSignal(Callback):
    """SIGINT/SIGTERM/SIGHUP ask the run to stop at the next iteration boundary (checkpoint + summary); a second one
    aborts at once. ``install()``/``restore()`` put and take back the handlers (main thread only). SIGHUP (the
    terminal closed, an ssh session dropped) stays ignored where it is (``nohup``).

    In a script of your own: ``with StopOnSignal() as stop: trainer.learn(callbacks=[stop])`` returns at an
    iteration boundary after a Ctrl-C (``stop.signum`` says which signal), where ``save`` can checkpoint.

    Data parallel (``dist=trainer.dist`` with several ranks): the ranks train in lockstep, so one rank must not stop
    alone. At each iteration's end the ranks share whether a signal came (one small all-gather) and all stop if any
    rank got one, ``signum`` set on each to the first rank's signal. Give every rank one, at the same place in its
    callbacks relative to other callbacks with collectives (an evaluation's)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, log=print, after: str = "", dist=None):
        self.log = log
        self.after = after  # what the stop brings, for the log line (the CLI: " (checkpoint + summary)")
        self.dist = dist
        self.signum: Optional[int] = None
        self._received = False  # this process got a signal (a second one aborts; another rank's does not count)
        self._previous: Dict[int, object] = {}

    @property
    def name(self) -> Optional[str]:
        return None if self.signum is None else signal.Signals(self.signum).name

    def install(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                if s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN:
                    continue
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def restore(self, ignore: bool = False) -> None:
        """The handlers from before :meth:`install`; with ``ignore`` SIG_IGN instead (a process about to exit whose
        run is over: a late signal must not make it look killed)."""
        for s, handler in self._previous.items():
            signal.signal(s, signal.SIG_IGN if ignore else handler)
        self._previous = {}

    def __enter__(self) -> "StopOnSignal":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.restore()

    def _handle(self, signum, frame):
        if self._received:
            raise Interrupted(signum)
        self._received = True
        if self.signum is None:
            self.signum = signum
        try:  # (after SIGHUP the terminal may be gone: writing to it fails)
            self.log(f"{signal.Signals(signum).name}: stopping at the end of this iteration{self.after}; "
                     "send it again to abort at once")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def on_iteration_end(self, trainer, metrics):
        if self.dist is None or not self.dist.distributed:
            return False if self.signum is not None else None
        import numpy as np

        # the answer comes from the gathered values alone: a signal arriving on this rank after its contribution
        # must not stop it an iteration before the others
        asked = self.dist.all_gather(np.array([self.signum or 0], np.float32))[:, 0]
        if not asked.any():
            return None
        if self.signum is None:
            self.signum = int(asked[asked > 0][0])
        return False
