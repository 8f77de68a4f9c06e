"""The side-by-side benchmark scripts check their libraries before any run (they ran the first library for tens of
minutes, then the second died with a traceback)."""
import os
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.parametrize("script, args, module, extra", [
    ("compare_sb3.py", [], "stable_baselines3", "bench"),
    ("compare_sb3_offpolicy.py", [], "stable_baselines3", "bench"),
    ("compare_sb3_atari.py", [], "stable_baselines3", "bench"), ("compare_sb3_mujoco.py", [], "mujoco", "mujoco"),
    ("time_to_solve.py", ["--tasks", "cartpole"], "stable_baselines3", "bench")])
def test_a_missing_library_stops_the_script_before_any_run(tmp_path, script, args, module, extra):
    blocked = tmp_path / "blocked" / module  # (a package that cannot be imported, installed or not)
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('blocked by the test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "blocked"), REPO]))
    out = tmp_path / "results.json"
    r = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", script), *args, "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
    assert r.stderr == f'{module} cannot be imported (ImportError: blocked by the test): pip install -e ".[{extra}]"\n'

    assert sorted(os.listdir(tmp_path)) == ["blocked"]


def test_an_extra_is_named_for_its_module(monkeypatch):
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        from bench_args import ATARI, require
    finally:
        sys.path.pop(0)
    monkeypatch.setitem(sys.modules, "cv2", None)
    with pytest.raises(SystemExit, match=r'^cv2 cannot be imported \(ModuleNotFoundError: .*\): '
                                         r'pip install -e "\.\[atari\]"$'):
        require(*ATARI)
