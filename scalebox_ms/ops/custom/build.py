"""Compile the C++ kernels of :mod:`scalebox_ms.ops.custom` on first use, into a content-keyed cache.

* Cache directory: ``$SCALEBOX_MS_CUSTOM_OPS_CACHE``, else ``~/.cache/scalebox_ms/custom_ops/``.
* Compiler: ``$CXX`` (may carry arguments, e.g. ``"ccache g++"``), else ``g++``.
* Key: SHA-256 of the kernel source and every header next to it (names and contents), the compiler command, the
  flags and the CPU identity (the flags include ``-march=native``, so a shared home directory on different CPUs
  gets one library per CPU model). A cached library is used without looking for a compiler; a changed source,
  header or flag set builds a new file.
* Atomic: the compiler writes a temporary file in the cache directory which ``os.replace`` moves into place,
  so concurrent processes and crashes never leave a half-written ``.so`` under the final name.
* No compiler, a failed compile, or a cache outside ``MS_CUSTOM_AOT_WHITE_LIST`` (MindSpore's allow-list of
  aot library paths, when set) raise :class:`scalebox_ms.errors.CustomOpError` with a one-line message.
"""
from __future__ import annotations

import glob
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile

from ...errors import CustomOpError

HERE = os.path.dirname(os.path.abspath(__file__))

#: kernel name -> (C++ source file in this package, exported symbol)
KERNELS: dict[str, tuple[str, str]] = {
    "fused_actor_mlp": ("fused_actor_mlp.cc", "FusedActorMLP"),
}
#: kernel name -> the config setting that selects it (named in errors that suggest the builtin implementation)
SETTINGS: dict[str, str] = {"fused_actor_mlp": "policy.act_kernel"}
#: kernel name -> a function returning the extra compiler arguments it links with (e.g. a library's path); they are
#: part of the cache key, and the function raises CustomOpError when the library is missing
LINK_ARGS: dict = {}
CXX_FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-std=c++17", "-shared", "-fPIC")
CACHE_ENV = "SCALEBOX_MS_CUSTOM_OPS_CACHE"

#: counters for this process: libraries compiled, and cache hits (tests use them to prove reuse)
stats = {"compiles": 0, "cache_hits": 0}


def cache_dir() -> str:
    return os.path.expanduser(os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "scalebox_ms", "custom_ops"))


def compiler_command() -> list:
    return shlex.split(os.environ.get("CXX") or "g++")


def compiler_available() -> bool:
    cmd = compiler_command()
    return bool(cmd) and shutil.which(cmd[0]) is not None


def _cpu_identity() -> str:
    ident = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    ident += "|" + line.strip()
                if line.strip() == "":  # first processor only
                    break
    except OSError:
        pass
    return ident


def source_path(name: str) -> str:
    if name not in KERNELS:
        raise CustomOpError(f"custom op {name!r}: unknown kernel (known: {', '.join(sorted(KERNELS))})")
    return os.path.join(HERE, KERNELS[name][0])


def headers() -> list:
    """The C++ headers next to the kernels (``simd.h``, ``mlp.h``, ``layout.h``, ...), sorted: all of them are
    hashed into every kernel's cache key and shipped as package data (``ops/custom/*.h``)."""
    return sorted(glob.glob(os.path.join(HERE, "*.h")))


def library_path(name: str, build: bool = True) -> str:
    """Path of the compiled ``.so`` for kernel ``name``; compiles it into the cache if missing (``build``)."""
    src = source_path(name)
    try:
        with open(src, "rb") as f:
            source = f.read()
    except OSError as exc:
        raise CustomOpError(f"custom op {name!r}: kernel source {src} is missing ({exc.strerror})") from None
    for header in headers():  # every header (shared or kernel-specific) is part of every kernel's key
        with open(header, "rb") as f:
            source += b"\0" + os.path.basename(header).encode() + b"\0" + f.read()
    cmd = compiler_command()
    link = list(LINK_ARGS[name]()) if name in LINK_ARGS else []
    key = hashlib.sha256(b"\0".join([source, " ".join(cmd).encode(), " ".join(CXX_FLAGS + tuple(link)).encode(),
                                     _cpu_identity().encode()])).hexdigest()[:20]
    directory = cache_dir()
    so = os.path.join(directory, f"{name}-{key}.so")
    _check_white_list(so)
    if os.path.isfile(so):
        stats["cache_hits"] += 1
        return so
    if not build:
        return so
    exe = shutil.which(cmd[0]) if cmd else None
    if exe is None:
        raise CustomOpError(f"custom op {name!r}: C++ compiler {' '.join(cmd) or '(empty CXX)'!r} not found; "
                            f"install g++ or set CXX, or use the builtin implementation "
                            f"({SETTINGS.get(name, 'the kernel setting')}: builtin)")
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=directory)
        os.close(fd)
    except OSError as exc:
        raise CustomOpError(f"custom op {name!r}: cannot write the cache directory {directory} ({exc.strerror}); "
                            f"set {CACHE_ENV}") from None
    try:
        proc = subprocess.run([exe, *cmd[1:], *CXX_FLAGS, "-o", tmp, src, *link], capture_output=True, text=True,
                              timeout=600, check=False)
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if "error" in ln] or \
                (proc.stderr or proc.stdout or "no output").splitlines() or ["no output"]
            raise CustomOpError(f"custom op {name!r}: {' '.join(cmd)} failed (exit {proc.returncode}): "
                                f"{lines[0].strip()}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, so)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    stats["compiles"] += 1
    return so


def probe_command(output: str, tile_rows: int | None = None) -> list:
    """The compiler command that builds ``gemm_probe.cc`` (a stand-alone program around mlp.h's GEMM, not a
    MindSpore op) into ``output`` with the kernels' flags; ``tile_rows`` overrides the micro-tile's rows
    (``SBX_TILE_ROWS``). For the tests and ``benchmarks/gemm_tiles.py``."""
    flags = [f for f in CXX_FLAGS if f not in ("-shared", "-fPIC")]
    defines = [] if tile_rows is None else [f"-DSBX_TILE_ROWS={int(tile_rows)}"]
    return [*compiler_command(), *flags, *defines, "-o", output, os.path.join(HERE, "gemm_probe.cc")]


def _check_white_list(so: str) -> None:
    allowed = os.environ.get("MS_CUSTOM_AOT_WHITE_LIST")
    if allowed:
        legal = os.path.realpath(allowed)
        if os.path.commonpath([os.path.realpath(so), legal]) != legal:
            raise CustomOpError(f"custom ops cache {os.path.dirname(so)} is outside MS_CUSTOM_AOT_WHITE_LIST "
                                f"({legal}); set {CACHE_ENV} to a directory under it")


def func_spec(name: str) -> str:
    """The ``"path/to/lib.so:Symbol"`` string ``ops.Custom(func_type="aot")`` takes."""
    return f"{library_path(name)}:{KERNELS[name][1]}"
