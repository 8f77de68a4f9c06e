import json
import os
import re
import subprocess
import sys

import pytest

from conftest import run_module
from scalebox_ms.doctor import blas_check, cann_compat, numpy_check, supported_cann_versions


@pytest.mark.integration
def test_doctor_json_reports_a_working_cpu_backend_and_its_collectives():
    r = run_module("doctor", "--json", "--workers", "2")  # (--workers: also a real 2-rank msrun job)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["usable"] is True
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["backend:cpu"]["status"] == "ok" and "match numpy" in checks["backend:cpu"]["detail"]
    check = checks["collective:cpu"]
    assert check["status"] == "ok" and check["detail"].startswith("2 ranks all-gathered and all-reduced over mccl")
    assert checks["numpy"]["status"] == "ok" and checks["numpy"]["detail"].startswith("1.")
    assert {"python", "mindspore", "gymnasium", "threads", "devices", "numpy-blas", "cxx"} <= set(checks)
    assert checks["numpy-blas"]["status"] in ("ok", "warn")
    from scalebox_ms.ops.custom.build import compiler_available, compiler_command

    cxx = " ".join(compiler_command())
    assert checks["cxx"]["status"] == ("ok" if compiler_available() else "warn") and cxx in checks["cxx"]["detail"]


@pytest.mark.integration
def test_a_missing_cpp_compiler_is_a_warning_naming_the_slower_fallback(tmp_path):
    """doctor said 'usable' and nothing else with CXX naming a compiler that does not exist: training then quietly
    ran the presets' auto kernels as MindSpore ops."""
    env = dict(os.environ, CXX=str(tmp_path / "no-such-g++"), SCALEBOX_MS_CUSTOM_OPS_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "scalebox_ms.doctor", "--json"], capture_output=True, text=True,
                       env=env, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    check = next(c for c in report["checks"] if c["name"] == "cxx")
    assert report["usable"] is True and check["status"] == "warn"
    assert check["detail"].startswith(f"C++ compiler '{tmp_path / 'no-such-g++'}' not found or not working: the C++ "
                                      "kernels") and check["detail"].endswith("; install g++ or set CXX")


def test_a_kernel_cache_that_cannot_be_written_is_a_warning(tmp_path, monkeypatch):
    """doctor said 'cxx ok' with a read-only HOME: every auto kernel then fell back to MindSpore's ops at each run."""
    import scalebox_ms.doctor
    import scalebox_ms.ops.custom.build
    from scalebox_ms.doctor import compiler_check

    # (a working compiler, whether this machine has one or not: the cache is what is checked)
    monkeypatch.setattr(scalebox_ms.ops.custom.build, "compiler_command", lambda: ["c++"])
    monkeypatch.setattr(scalebox_ms.doctor, "_run", lambda cmd: "c++ (test) 1.0\n")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SCALEBOX_MS_CUSTOM_OPS_CACHE", str(tmp_path / "file" / "cache"))  # (even as root)
    check = compiler_check()
    assert check["status"] == "warn", check
    cache = tmp_path / "file" / "cache"
    assert f"; but the kernel cache {cache} cannot be written (Not a directory)" in check["detail"]
    assert check["detail"].endswith("; set SCALEBOX_MS_CUSTOM_OPS_CACHE to a writable directory")
    monkeypatch.setenv("SCALEBOX_MS_CUSTOM_OPS_CACHE", str(tmp_path / "new" / "cache"))
    assert compiler_check()["status"] == "ok"  # (made as the kernel build makes it)
    assert os.listdir(tmp_path / "new" / "cache") == []


def test_numpy_2_with_mindspore_2_10_is_a_failure():
    assert numpy_check("2.1.3", "2.10.0")["status"] == "fail"
    assert numpy_check("1.26.4", "2.10.0")["status"] == "ok"
    assert numpy_check("2.1.3", "2.11.0")["status"] == "ok"


def test_a_python_other_than_3_11_is_a_warning():
    """pyproject accepted 3.9, where mindspore 2.10.0 has no wheel; doctor called any version ok."""
    from scalebox_ms.doctor import _python_check

    assert _python_check((3, 11, 7, "final", 0)) == {"name": "python", "status": "ok", "detail": "3.11.7"}
    assert _python_check((3, 10, 14))["status"] == "warn" and "Python 3.11 only" in _python_check((3, 10, 14))["detail"]


def test_cann_version_is_checked_against_mindspores_supported_list():
    supported = supported_cann_versions()
    assert supported, "MindSpore 2.10 carries its supported CANN versions"
    assert cann_compat(f"Version={supported[0]}.RC1", supported)["status"] == "ok"
    assert cann_compat("Version=6.0.RC1", supported)["status"] == "warn"


def test_cann_version_is_read_from_the_version_line_not_comments(tmp_path, monkeypatch):
    from scalebox_ms import doctor

    (tmp_path / "compiler").mkdir()
    (tmp_path / "compiler" / "version.info").write_text("# version: 1.0\nVersion=6.0.RC1\n")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path))
    checks = {c["name"]: c for c in doctor.ascend_checks()}
    assert checks["cann"]["detail"].startswith("Version=6.0.RC1")
    assert checks["cann-match"]["status"] == "warn" and "6.0.RC1" in checks["cann-match"]["detail"]
    assert checks["ascend-driver"]["status"] == "warn"  # no driver on this machine


def test_a_pre_avx_openblas_core_on_an_avx_cpu_is_a_warning_with_the_fix():
    avx512 = frozenset({"avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})
    warn = blas_check("Prescott", avx512)
    assert warn["status"] == "warn" and "export OPENBLAS_CORETYPE=SkylakeX" in warn["detail"]
    assert "OPENBLAS_CORETYPE=Haswell" in blas_check("Prescott", frozenset({"avx2", "fma"}))["detail"]
    assert blas_check("Prescott", frozenset({"sse3"}))["status"] == "ok"  # (nothing faster to ask for)
    assert blas_check("SkylakeX", avx512) == {"name": "numpy-blas", "status": "ok", "detail": "OpenBLAS core SkylakeX"}
    assert blas_check(None, avx512)["status"] == "ok"


@pytest.mark.parametrize("core", ["Haswell", "Prescott"])
def test_the_openblas_core_is_read_from_the_loaded_library(core):
    """numpy 1.26's wheels bundle OpenBLAS; what it runs follows OPENBLAS_CORETYPE, so the check reads the library
    in the process, not a guess from the CPU."""
    code = "from scalebox_ms.doctor import openblas_core; print(openblas_core())"
    env = {**os.environ, "OPENBLAS_CORETYPE": core}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == core


@pytest.mark.integration
@pytest.mark.parametrize("module", ["mindspore", "gymnasium"])
def test_an_installed_package_whose_import_fails_is_a_failure(tmp_path, module):
    """doctor read the packages' metadata only: a broken gymnasium was '[ok]' and 'usable' while train died on its
    import, and a broken mindspore made doctor itself end in a traceback."""
    shadow = tmp_path / module
    shadow.mkdir()
    (shadow / "__init__.py").write_text('raise ImportError("libfoo.so: cannot open shared object file")\n')
    from conftest import REPO

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    r = subprocess.run([sys.executable, "-m", "scalebox_ms.doctor", "--json"], capture_output=True, text=True,
                       env=env, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 1, r.stderr[-2000:]
    report = json.loads(r.stdout)
    check = next(c for c in report["checks"] if c["name"] == module)
    assert report["usable"] is False and check["status"] == "fail"
    assert check["detail"].endswith("is installed but its import fails: ImportError: libfoo.so: cannot open shared "
                                    "object file")


@pytest.mark.parametrize("stdout", ["full", "closed"])
def test_a_report_stdout_cannot_take_is_an_error_naming_stdout(monkeypatch, capsys, stdout):
    """``doctor > /dev/full`` ended in a traceback, ``doctor >&-`` exited 0 having printed nothing."""
    import scalebox_ms.doctor as doctor

    monkeypatch.setattr(doctor, "diagnose", lambda workers=0: {"usable": True, "checks": [
        {"name": "python", "status": "ok", "detail": "3.11"}]})
    if stdout == "closed":
        monkeypatch.setattr(sys, "stdout", None)
        assert doctor.main([]) == 2
        assert capsys.readouterr().err == "error: stdout is closed: the result was not printed\n"
        return
    with open("/dev/full", "w") as full:
        monkeypatch.setattr(sys, "stdout", full)
        assert doctor.main(["--json"]) == 2
    assert capsys.readouterr().err == "error: stdout: No space left on device: the result was not printed\n"


def test_msrun_for_data_parallelism_is_checked(monkeypatch):
    """doctor said "usable" without a word on train --workers, which needs MindSpore's msrun."""
    from scalebox_ms import doctor
    from scalebox_ms.errors import ConfigError
    from scalebox_ms.parallel import launcher

    found = doctor.msrun_check()
    assert found["status"] == "ok" and found["detail"].endswith("msrun (train --workers)")

    def missing():
        raise ConfigError("parallel.workers: msrun was not found")

    monkeypatch.setattr(launcher, "msrun_executable", missing)
    assert doctor.msrun_check() == {"name": "msrun", "status": "warn", "detail": "not found next to the Python "
                                    "interpreter or on PATH: train --workers (data parallelism) cannot start"}


def _fake_msrun(tmp_path, monkeypatch, log_lines, then=""):
    """An msrun that writes ``log_lines`` (rank -> lines) into its --log_dir's worker logs, then runs ``then``."""
    from scalebox_ms.parallel import launcher

    script = tmp_path / "msrun"
    script.write_text(f"#!{sys.executable}\n" + "import os, sys, time\n"
                      "logs = next(a.split('=', 1)[1] for a in sys.argv if a.startswith('--log_dir='))\n"
                      f"for rank, lines in {log_lines!r}.items():\n"
                      "    with open(os.path.join(logs, f'worker_{rank}.log'), 'w') as f:\n"
                      "        f.write(''.join(line + '\\n' for line in lines))\n" + then)
    script.chmod(0o755)
    monkeypatch.setattr(launcher, "msrun_executable", lambda: str(script))


@pytest.mark.parametrize("logs, status, words", [
    ({0: ['{"rank": 0, "world_size": 2, "backend": "mccl", "ok": true, "seconds": 1.0}'],
      1: ["{not json", "RuntimeError: Failed to initialize distributed job cluster"]},
     "fail", r"2-rank msrun job failed after \d+ s \(1 rank\(s\) joined; worker_1.log: RuntimeError: Failed to "
             r"initialize distributed job cluster\): train --workers cannot run on this backend$"),
    ({r: [f'{{"rank": {r}, "world_size": 12, "backend": "mccl", "ok": true, "seconds": 1.0}}'] if r < 2 else
      [f"ModuleNotFoundError: rank {r}"] for r in range(12)}, "fail",  # (the first failing rank's: 2, not 10)
     r"12-rank msrun job failed after \d+ s \(2 rank\(s\) joined; worker_2.log: ModuleNotFoundError: rank 2\)"),
    ({r: [f'{{"rank": {r}, "world_size": 2, "backend": "mccl", "ok": {str(r == 0).lower()}, "seconds": 1.0}}']
      for r in (0, 1)}, "fail", "2 ranks joined over mccl, but the all-gather or all-reduce gave wrong values$"),
    ({r: [f'{{"rank": {r}, "world_size": 2, "backend": "mccl", "ok": true, "seconds": 1.0}}'] for r in (0, 1)},
     "ok", r"2 ranks all-gathered and all-reduced over mccl \(\d+\.\d s with msrun's start and stop\)$"),
])
def test_the_collective_check_reads_every_ranks_report(tmp_path, monkeypatch, logs, status, words):
    from scalebox_ms import doctor

    _fake_msrun(tmp_path, monkeypatch, logs)
    check = doctor.collective_check("cpu", len(logs))
    assert check["name"] == "collective:cpu" and check["status"] == status and re.match(words, check["detail"]), check


def test_a_rank_that_fails_stops_the_collective_check_at_once(tmp_path, monkeypatch):
    """msrun waits for the cluster until its timeout (180 s) when a rank fails before joining."""
    import time

    from scalebox_ms import doctor

    _fake_msrun(tmp_path, monkeypatch, {0: ["ImportError: no module"]},
                then="print('Worker process 4242 exit with exception.', flush=True)\ntime.sleep(600)\n")
    t0 = time.time()
    check = doctor.collective_check("cpu", 2)
    assert check["status"] == "fail" and "worker_0.log: ImportError: no module" in check["detail"]
    assert time.time() - t0 < 60


def test_doctor_workers_needs_at_least_two_ranks(capsys):
    from scalebox_ms import doctor

    with pytest.raises(SystemExit) as exc:
        doctor.main(["--workers", "1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == ("error: --workers: must be >= 2 (ranks of the "
                                       "msrun job), got 1\n")
