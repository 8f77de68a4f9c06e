import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_config(**sections):
    """A CartPole config that trains in a second or two, with the presets' ``ppo.update_kernel: auto`` (the C++
    update kernel here; the library's default, ``builtin``, compiles the update graph: ~5 s per trainer on a slow
    CPU). Tests of the compiled update graph set ``builtin`` themselves."""
    from scalebox_ms import Config

    data = {
        "env": {"id": "CartPole-v1", "num_envs": 4},
        "ppo": {"n_steps": 16, "batch_size": 32, "n_epochs": 2, "learning_rate": 1e-3, "lr_schedule": "linear",
                "clip_schedule": "linear", "gamma": 0.98, "gae_lambda": 0.8, "update_kernel": "auto"},
        "run": {"seed": 3, "total_steps": 256, "progress": False},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return Config.from_dict(data)


def as_from_a_terminal():
    """``preexec_fn`` for a child that is sent SIGINT: Ctrl-C as from a terminal. pytest started in the background by
    a non-interactive shell (``cmd &`` in a script, as CI runners may do) has SIGINT ignored, as POSIX shells do
    for background jobs without job control; its workers and their children inherit that across exec and then
    rightly ignore Ctrl-C (Python's ``interrupt_main`` does nothing). SIGHUP as from a terminal too (a suite run
    under ``nohup`` has it ignored)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def run_module(module, *args, cwd=None, timeout=300):
    """Run ``python -m scalebox_ms.<module> args`` in a fresh process, in the test's (temporary) working directory
    unless ``cwd`` is given: MindSpore writes kernel_meta/ and similar into the current directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", f"scalebox_ms.{module}", *map(str, args)], cwd=cwd or os.getcwd(),
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="session", autouse=True)
def _session_in_temporary_directory(tmp_path_factory):
    """Module- and session-scoped fixtures (set up before the per-test directory) run in a temporary directory too."""
    old = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(old)


@pytest.fixture(autouse=True)
def _in_temporary_directory(tmp_path, monkeypatch):
    """Every test runs in its own temporary working directory, so nothing MindSpore (akg_kernel_meta/,
    kernel_meta/, kernel_build_tmp.key), MuJoCo (MUJOCO_LOG.TXT) or a run (runs/) writes lands in the checkout."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def small_cfg():
    return small_config()


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    """A fresh C++ kernel cache directory for one test module (the first test there compiles, ~1-2 s)."""
    old = os.environ.get("SCALEBOX_MS_CUSTOM_OPS_CACHE")
    os.environ["SCALEBOX_MS_CUSTOM_OPS_CACHE"] = str(tmp_path_factory.mktemp("custom_ops"))
    yield os.environ["SCALEBOX_MS_CUSTOM_OPS_CACHE"]
    if old is None:
        os.environ.pop("SCALEBOX_MS_CUSTOM_OPS_CACHE", None)
    else:
        os.environ["SCALEBOX_MS_CUSTOM_OPS_CACHE"] = old
