"""Small durable file writes shared by the Python layer."""

from __future__ import annotations

import contextlib
import os


def fsync_dir(path) -> None:
    """Makes a directory's entries (new, renamed, deleted files) durable."""
    descriptor = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_file_atomic(path, payload: bytes) -> None:
    """Writes a small file atomically and durably: a temporary file, fsync,
    rename over ``path``, then fsync of its directory. A crash leaves the old
    file or the new one, never a mix."""
    path = os.fspath(path)
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temporary, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    fsync_dir(os.path.dirname(path) or ".")
