"""``python -m scalebox_ms.doctor [--json] [--workers N]``: is this machine ready to run scalebox_ms?

Checks, each reported as ``ok`` / ``warn`` / ``fail`` with a detail:

* ``python``, ``mindspore``, ``numpy`` (numpy >= 2 with MindSpore 2.10 fails: the wheel is built against
  numpy 1.x), ``gymnasium``;
* ``threads``: CPU count, the CPUs this process may use, ``MS_DEV_HOST_BLOCKING_RUN``;
* ``cxx``: the C++ compiler the kernels of ``scalebox_ms.ops.custom`` build with; without one a warning (the presets'
  ``auto`` kernels fall back to MindSpore's ops);
* ``numpy-blas``: the kernels numpy's OpenBLAS runs on this CPU; a warning when it fell back to its pre-AVX
  (Prescott) ones on a CPU with AVX2/AVX-512, which OpenBLAS 0.3.23 (numpy 1.26's wheels) does for CPU models newer
  than it knows (e.g. Intel Emerald Rapids): numpy matmuls then run ~5x slower, which scalebox_ms feels where it
  computes on the host (DQN's ``host_acting``); the fix is ``OPENBLAS_CORETYPE`` set before Python starts;
* ``backend:<name>`` for each backend MindSpore reports available: in a fresh subprocess (device settings are
  process-global), compile a small Dense layer's forward + gradient with ``@ms.jit`` and compare it with numpy;
* with ``--workers N``, ``collective:<name>`` for each backend: an N-rank msrun job whose ranks join with the
  backend's collective library and check an all-gather and an all-reduce (:func:`collective_check`);
* on GPU: the CUDA version (``nvidia-smi``); on Ascend: driver and CANN versions from their version files and
  ``npu-smi info``, with a warning when one is missing or when the CANN version is not one this MindSpore build
  supports (the list MindSpore's own Ascend checker carries).

Exit code 0 when the CPU backend (at least) passes and nothing fails, 1 otherwise. ``--json`` prints one object
``{"usable": bool, "checks": [{"name", "status", "detail"}, ...]}``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Optional

from .cli_common import OneLineArgumentParser, emit, say
from .errors import OutputError


_TARGETS = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}


def _check(name: str, status: str, detail: str) -> Dict[str, str]:
    return {"name": name, "status": status, "detail": detail}


def numpy_check(numpy_version: str, mindspore_version: Optional[str]) -> Dict[str, str]:
    major = int(numpy_version.split(".")[0])
    if mindspore_version and mindspore_version.startswith("2.10") and major >= 2:
        return _check("numpy", "fail", f"numpy {numpy_version} with mindspore {mindspore_version}: the wheel is built "
                                       "against numpy 1.x (fp16/bf16 ops break); pip install 'numpy>=1.26,<2'")
    return _check("numpy", "ok", numpy_version)


# OpenBLAS's cores without AVX (its fallback for a CPU model it does not know is Prescott)
PRE_AVX_CORES = frozenset({"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "katmai", "coppermine",
                           "northwood", "banias", "opteron", "opteron_sse3", "barcelona"})
AVX512_FLAGS = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")  # what OpenBLAS's SkylakeX kernels use


def openblas_core() -> Optional[str]:
    """The core type numpy's OpenBLAS runs on this CPU (e.g. 'SkylakeX', 'Haswell', 'Prescott'), or None when
    numpy does not use OpenBLAS (or it cannot be asked)."""
    import ctypes

    import numpy  # noqa: F401  (loads its BLAS)

    try:
        with open("/proc/self/maps") as f:  # the loaded libraries: "address perms offset dev inode path"
            paths = {parts[-1] for parts in (line.split() for line in f)
                     if len(parts) >= 6 and "openblas" in os.path.basename(parts[-1]).lower() and ".so" in parts[-1]}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in ("openblas_get_corename64_", "openblas_get_corename", "scipy_openblas_get_corename64_"):
            fn = getattr(lib, symbol, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                name = fn()
                return name.decode().strip() if name else None
    return None


def cpu_flags() -> frozenset:
    """The first CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def blas_check(core: Optional[str], flags: frozenset) -> Dict[str, str]:
    """ok, or a warning with the ``OPENBLAS_CORETYPE`` to set when OpenBLAS runs pre-AVX kernels on an AVX2 CPU."""
    if core is None:
        return _check("numpy-blas", "ok", "numpy does not use OpenBLAS (not checked)")
    if core.lower() not in PRE_AVX_CORES or "avx2" not in flags or "fma" not in flags:
        return _check("numpy-blas", "ok", f"OpenBLAS core {core}")
    best = "SkylakeX" if all(f in flags for f in AVX512_FLAGS) else "Haswell"
    isa = "AVX-512" if best == "SkylakeX" else "AVX2"
    return _check("numpy-blas", "warn", f"numpy's OpenBLAS runs its {core} kernels (no AVX) on this {isa} CPU, whose "
                                        f"model it does not know: numpy matmuls ~5x slower; export "
                                        f"OPENBLAS_CORETYPE={best} before starting Python")


def _version(module: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def _run(cmd: List[str], timeout: float = 60) -> Optional[str]:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def msrun_check() -> Dict[str, str]:
    """msrun, MindSpore's launcher, which ``train --workers`` (data parallelism) starts."""
    from .errors import ConfigError
    from .parallel import launcher

    try:
        return _check("msrun", "ok", f"{launcher.msrun_executable()} (train --workers)")
    except ConfigError:
        return _check("msrun", "warn", "not found next to the Python interpreter or on PATH: train --workers (data "
                                       "parallelism) cannot start")


def collective_check(name: str, workers: int, timeout: float = 180) -> Dict[str, str]:
    """``collective:<name>`` (``doctor --workers N``): an msrun job of ``workers`` ranks on this machine, as ``train
    --workers`` starts it, whose ranks join with ``name``'s collective library and check an all-gather and an
    all-reduce (``scalebox_ms._collective_probe``). A rank that fails stops the job at once (msrun alone would wait
    for the cluster until ``timeout``)."""
    import tempfile
    import threading
    import time

    from .errors import ConfigError
    from .parallel import launcher

    check = f"collective:{name}"
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = launcher.msrun_env(os.environ)
    if os.path.isfile(os.path.join(here, "pyproject.toml")):  # (a checkout, not installed: the probe imports it)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="scalebox-ms-doctor-") as logs:
        try:
            cmd = launcher.msrun_command(workers, launcher.free_port(), logs, timeout,
                                         ["python", "-m", "scalebox_ms._collective_probe", _TARGETS[name]])
        except ConfigError as exc:  # (no msrun)
            return _check(check, "fail", str(exc))
        t0 = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                cwd=logs, env=env, start_new_session=True)
        failed: list = []  # (msrun's report of a rank that exited with an error)
        threading.Thread(target=lambda: failed.extend(line for line in proc.stdout if "exit with exception" in line),
                         daemon=True).start()
        while proc.poll() is None and not failed and time.time() < t0 + timeout + 30:
            time.sleep(0.2)
        running = proc.poll() is None
        if running:
            launcher._stop_job(proc)  # (its ranks and scheduler, each in a session of its own)
        seconds = time.time() - t0
        if running and not failed:
            return _check(check, "fail", f"{workers}-rank msrun job did not finish within {timeout + 30:.0f} s")
        found, error = _probe_reports(logs)
    if sorted(found) != list(range(workers)):
        return _check(check, "fail", f"{workers}-rank msrun job failed after {seconds:.0f} s ({len(found)} rank(s) "
                      f"joined; {error}): train --workers cannot run on this backend")
    backend = found[0]["backend"]
    if not all(r["ok"] for r in found.values()):
        return _check(check, "fail", f"{workers} ranks joined over {backend}, but the all-gather or all-reduce gave "
                      "wrong values")
    return _check(check, "ok", f"{workers} ranks all-gathered and all-reduced over {backend} ({seconds:.1f} s with "
                               "msrun's start and stop)")


def _probe_reports(logs: str) -> tuple:
    """(rank -> the report ``_collective_probe`` printed, for each rank that did; the last line of the first rank's
    log, in rank order, that has no report, or 'no output')."""
    import glob
    import re

    found, error = {}, None
    paths = glob.glob(os.path.join(logs, "worker_*.log"))
    for path in sorted(paths, key=lambda p: int(re.search(r"(\d+)\.log$", p).group(1))):
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
        reports = []
        for line in lines:
            try:
                report = json.loads(line) if line.startswith("{") else None
            except ValueError:
                report = None
            if isinstance(report, dict) and isinstance(report.get("rank"), int):
                reports.append(report)
        for report in reports:
            found[report["rank"]] = report
        if lines and not reports and error is None:
            error = f"{os.path.basename(path)}: {lines[-1][:200]}"
    return found, error or "no output"


def compiler_check() -> Dict[str, str]:
    """``cxx``: the C++ compiler the kernels build with (``$CXX``, else ``g++``). Without one, the presets' ``auto``
    kernels fall back to MindSpore's ops (logged at each run's start, easy to miss): a warning, not a failure."""
    import glob

    from .ops.custom.build import CACHE_ENV, cache_dir, compiler_command

    cmd = compiler_command()
    out = _run([*cmd, "--version"]) if cmd else None
    cached = len(glob.glob(os.path.join(glob.escape(cache_dir()), "*.so")))
    if out is not None:
        found = f"{' '.join(cmd)}: {(out.strip().splitlines() or ['?'])[0]}"
        unwritable = _unwritable(cache_dir())
        if unwritable:  # (each kernel not built yet falls back, logged only at the run's start)
            return _check("cxx", "warn", f"{found}; but the kernel cache {cache_dir()} cannot be written "
                          f"({unwritable}): the C++ kernels not built there yet fall back to MindSpore's ops, several "
                          "times slower on CPU" + (f" ({cached} kernel libraries cached there still load)" if cached
                                                   else "") + f"; set {CACHE_ENV} to a writable directory")
        return _check("cxx", "ok", found)
    return _check("cxx", "warn", f"C++ compiler {' '.join(cmd) or '(empty CXX)'!r} not found or not working: the C++ "
                  "kernels (policy.act_kernel, ppo.update_kernel and <algo>.optimizer_kernel auto) fall back to "
                  "MindSpore's ops, several times slower on CPU"
                  + (f" ({cached} kernel libraries cached in {cache_dir()} still load)" if cached else "")
                  + "; install g++ or set CXX")


def _unwritable(directory: str) -> str:
    """Why a file cannot be created in ``directory`` (made if missing, as the kernel build does), or ""."""
    import tempfile

    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".doctor-"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


def backend_check(name: str, timeout: float = 180) -> Dict[str, str]:
    """Compile and run a Dense forward + gradient on ``name`` in a fresh process; compare with numpy."""
    target = _TARGETS[name]
    env = dict(os.environ, GLOG_v="3")
    try:
        out = subprocess.run([sys.executable, "-m", "scalebox_ms._backend_probe", target], capture_output=True,
                             text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return _check(f"backend:{name}", "fail", f"probe did not finish within {timeout:.0f} s")
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return _check(f"backend:{name}", "fail", f"probe crashed: {last[:200]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if not res["ok"]:
        return _check(f"backend:{name}", "fail", "compiled forward/gradient differ from numpy")
    return _check(f"backend:{name}", "ok", f"jit forward + gradient match numpy ({res['seconds']:.1f} s incl. compile)")


def _import_error(module: str) -> Optional[str]:
    """None if ``module`` imports, else the error's type and first line."""
    import importlib

    try:
        importlib.import_module(module)
    except Exception as exc:
        return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
    return None


def available_backends() -> List[str]:
    import mindspore as ms

    found = ["cpu"]
    for name in ("gpu", "ascend"):
        try:
            if ms.hal.is_available(_TARGETS[name]):
                found.append(name)
        except Exception:
            pass
    return found


def supported_cann_versions() -> List[str]:
    """CANN major.minor versions this MindSpore build supports (read from MindSpore's own Ascend checker)."""
    try:
        from mindspore.run_check._check_version import AscendEnvChecker

        return list(AscendEnvChecker(None).version)
    except Exception:
        return []


def cann_compat(version_line: str, supported: List[str]) -> Dict[str, str]:
    """Compare a CANN version line ('Version=8.3.RC1', 'version=8.5.0') with MindSpore's supported list."""
    text = version_line.split("=", 1)[-1].strip()
    major_minor = ".".join(text.split(".")[:2])
    if not supported:
        return _check("cann-match", "warn", f"CANN {text}: this MindSpore build lists no supported versions")
    if major_minor in supported:
        return _check("cann-match", "ok", f"CANN {text} is supported by this MindSpore ({', '.join(supported)})")
    return _check("cann-match", "warn", f"CANN {text} does not match this MindSpore build (supports "
                                        f"{', '.join(supported)}): install a matching CANN or MindSpore")


def ascend_checks() -> List[Dict[str, str]]:
    checks = []
    driver = "/usr/local/Ascend/driver/version.info"
    home = os.environ.get("ASCEND_HOME_PATH", "/usr/local/Ascend/ascend-toolkit/latest")
    cann_candidates = [os.path.join(home, "compiler", "version.info")]  # where MindSpore's own checker reads it
    for label, paths in (("ascend-driver", [driver]), ("cann", cann_candidates)):
        found = next((p for p in paths if os.path.exists(p)), None)
        if found is None:
            checks.append(_check(label, "warn", f"version file not found ({', '.join(paths)})"))
            continue
        with open(found, encoding="utf-8", errors="replace") as f:  # the "Version=8.3.RC1" line, not comments
            line = next((l.strip() for l in f if l.strip().lower().startswith("version=")), "unknown")
        checks.append(_check(label, "ok", f"{line} ({found})"))
        if label == "cann":
            checks.append(cann_compat(line, supported_cann_versions()))
    smi = _run(["npu-smi", "info"])
    checks.append(_check("npu-smi", "ok" if smi else "warn",
                         (smi.strip().splitlines()[1][:200] if smi and len(smi.splitlines()) > 1 else "npu-smi info failed")))
    return checks


def gpu_checks() -> List[Dict[str, str]]:
    out = _run(["nvidia-smi"])
    if not out:
        return [_check("cuda", "warn", "nvidia-smi not found or failed")]
    line = next((l for l in out.splitlines() if "CUDA Version" in l), "")
    cuda = line.split("CUDA Version:")[-1].strip(" |") if line else "unknown"
    return [_check("cuda", "ok", f"CUDA {cuda} (driver's nvidia-smi)")]


def _python_check(version: tuple) -> Dict:
    """Python 3.11: what the package installs on (pyproject's requires-python) and is tested with; another version
    (a source checkout on PYTHONPATH) is a warning."""
    text = ".".join(str(v) for v in version[:3])
    if tuple(version[:2]) == (3, 11):
        return _check("python", "ok", text)
    return _check("python", "warn", f"{text}: scalebox_ms is tested with Python 3.11 only (mindspore 2.10.0 and "
                                    "envpool 1.2.x wheels; pyproject.toml's requires-python)")


def diagnose(workers: int = 0) -> Dict:
    checks = [_python_check(sys.version_info)]
    ms_version = _version("mindspore")
    if ms_version is None:
        checks.append(_check("mindspore", "fail", "not installed: pip install mindspore==2.10.0"))
        return {"usable": False, "checks": checks}
    broken = _import_error("mindspore")  # (installed is not importable: a missing library, a broken wheel)
    if broken:
        checks.append(_check("mindspore", "fail", f"{ms_version} is installed but its import fails: {broken}"))
        return {"usable": False, "checks": checks}
    checks.append(_check("mindspore", "ok", ms_version))
    import numpy

    checks.append(numpy_check(numpy.__version__, ms_version))
    gym = _version("gymnasium")
    broken = _import_error("gymnasium") if gym else None
    checks.append(_check("gymnasium", "fail" if broken or not gym else "ok",
                         f"{gym} is installed but its import fails: {broken}" if broken else gym or "not installed"))
    try:
        usable_cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable_cpus = os.cpu_count()
    blocking = os.environ.get("MS_DEV_HOST_BLOCKING_RUN", "unset (scalebox_ms sets 1)")
    checks.append(_check("threads", "ok", f"{os.cpu_count()} CPUs, {usable_cpus} usable; "
                                          f"MS_DEV_HOST_BLOCKING_RUN={blocking}"))
    checks.append(blas_check(openblas_core(), cpu_flags()))
    checks.append(compiler_check())
    checks.append(msrun_check())
    backends = available_backends()
    checks.append(_check("devices", "ok", "available backends: " + ", ".join(backends)))
    for name in backends:
        checks.append(backend_check(name))
        if workers > 1 and checks[-1]["status"] == "ok":  # (a backend that cannot compile cannot train either)
            checks.append(collective_check(name, workers))
    if "gpu" in backends:
        checks += gpu_checks()
    if "ascend" in backends:
        checks += ascend_checks()
    cpu_ok = any(c["name"] == "backend:cpu" and c["status"] == "ok" for c in checks)
    usable = cpu_ok and not any(c["status"] == "fail" for c in checks)
    return {"usable": usable, "checks": checks}


def main(argv=None) -> int:
    p = OneLineArgumentParser("doctor", description="Check this machine for scalebox_ms.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="also start an N-rank msrun job on each backend and check its collectives, as train "
                        "--workers uses them (~10-20 s)")
    args = p.parse_args(argv)
    if args.workers == 1 or args.workers < 0:
        p.error(f"--workers: must be >= 2 (ranks of the msrun job), got {args.workers}")
    os.environ.setdefault("GLOG_v", "3")
    report = diagnose(args.workers)
    if args.json:
        text = json.dumps(report)
    else:
        text = "\n".join([f"[{c['status']:>4s}] {c['name']:<14s} {c['detail']}" for c in report["checks"]]
                         + ["usable" if report["usable"] else "NOT usable"])
    try:
        emit(text)
    except OutputError as exc:
        say(f"error: {exc}")
        return 2
    return 0 if report["usable"] else 1


if __name__ == "__main__":
    sys.exit(main())
