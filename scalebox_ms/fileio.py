"""Atomic file writes and content hashes.

Every artefact scalebox_ms writes goes through a temporary file in the same directory followed by
``os.replace``, so a reader (or a crash) never sees a half-written file.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` atomically."""
    with staged_path(path) as tmp:
        yield tmp
    try:
        os.replace(tmp, path)
    except BaseException:
        remove_temporaries(tmp)
        raise


@contextmanager
def staged_path(path: str) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success it is on disk (fsynced, the umask's permissions) for the
    caller to ``os.replace`` onto ``path`` when it chooses (several files committed together); on failure it is
    removed."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    name = os.path.basename(path)
    # the extension, also of a name that is only an extension ('.ckpt': splitext sees none; MindSpore's writer then
    # appends its own and the temporary file stays empty)
    suffix = name[name.rfind("."):] if "." in name else ""
    # (the name's start only: a name near the file system's 255-byte limit is legal, its temporary one would not be)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-" + name[:100] + "-", suffix=suffix, dir=directory)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 (and MindSpore 0400) files
    except BaseException:
        remove_temporaries(tmp)
        raise


def remove_temporaries(tmp: str) -> None:
    """Remove ``tmp`` and what a writer derived from its unique stem (MindSpore writes ``<stem>.tmp`` first)."""
    stem = os.path.splitext(tmp)[0]
    for path in glob.glob(glob.escape(stem) + "*"):
        try:
            os.unlink(path)
        except OSError:
            pass


def umask() -> int:
    """The process's umask (read without changing it for longer than a call)."""
    return _umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str, data: bytes) -> None:
    with errors_named(path), atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


@contextmanager
def errors_named(path: str) -> Iterator[None]:
    """An OSError of the block that names no file (a write, flush or fsync error: a full disk would read only "No
    space left"), or that names the temporary file (``.tmp-...`` beside ``path``) that was to replace it
    (``os.replace`` onto a directory: "Is a directory" named a file that no longer exists), is raised again naming
    ``path``."""
    try:
        yield
    except OSError as exc:
        named = exc.filename
        temporary = isinstance(named, str) and os.path.basename(named).startswith(".tmp-") and \
            os.path.dirname(os.path.abspath(named)) == os.path.dirname(os.path.abspath(path))
        if named is None or temporary:
            raise OSError(exc.errno, exc.strerror, path) from None
        raise


def atomic_write_text(path: str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str, obj) -> None:
    atomic_write_text(path, json_text(obj))


def json_text(obj) -> str:
    """The JSON form of the files scalebox_ms writes (indented, sorted keys)."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def sidecar_digest(sidecar: dict) -> str:
    """SHA-256 of a sidecar's canonical JSON without its ``sidecar_sha256`` key (checkpoint and MindIR sidecars)."""
    body = {k: v for k, v in sidecar.items() if k != "sidecar_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
