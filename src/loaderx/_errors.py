"""The exceptions of loaderx's stores: one hierarchy for the native core
(``_native.check``) and the Python file-system seam (``_fs``).

Every store error is a ``ZrecordError``. One that an OS call caused is also
an ``OSError`` carrying its ``errno``: ``StoreFullError`` (no space, quota,
file too large), ``StoreReadOnlyError`` (read-only file system, permission
denied) and, from the native core, ``StoreOSError`` for every other errno
(the Python seam, ``_fs``, keeps the standard ``OSError`` subclass of those).
``class_for_errno`` is the one place that picks the class an errno gets.
"""

from __future__ import annotations

import errno as errno_codes
import os


class ZrecordError(RuntimeError):
    """A zrecord store operation failed; ``code`` is the native status code."""

    #: The status code an error of this class carries when none is given:
    #: ``_native`` sets it from the one table of codes (0: none).
    status = 0

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = type(self).status if code is None else code


class StoreOSError(ZrecordError, OSError):
    """A store operation failed on an OS error: an ``OSError`` with ``errno``
    (and ``strerror``), and a ``ZrecordError`` with the native ``code``.
    ``str()`` is the message, which names the call and the path."""

    default_errno = errno_codes.EIO

    def __init__(self, message: str, code: int | None = None, errno: int | None = None):
        ZrecordError.__init__(self, message, code)
        self.errno = self.default_errno if errno is None else errno
        self.strerror = os.strerror(self.errno)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[type, tuple[str, int, int | None]]:
        return (type(self), (str(self), self.code, self.errno))


class StoreReadOnlyError(StoreOSError):
    """The store's directory or files cannot be written (EROFS, EACCES,
    EPERM): open it for reading, or write it where you may."""

    default_errno = errno_codes.EROFS


class StoreFullError(StoreOSError):
    """The disk, a quota or a file-size limit ran out while writing (ENOSPC,
    EDQUOT, EFBIG); the store keeps its committed data: free space, retry."""

    default_errno = errno_codes.ENOSPC


_FULL = frozenset({errno_codes.ENOSPC, errno_codes.EDQUOT, errno_codes.EFBIG})
_READ_ONLY = frozenset({errno_codes.EROFS, errno_codes.EACCES, errno_codes.EPERM})


def class_for_errno(value: int | None) -> type[StoreOSError] | None:
    """The store error class of an errno: StoreFullError, StoreReadOnlyError,
    or None for every other errno (which keeps its own OSError class)."""
    if value in _FULL:
        return StoreFullError
    if value in _READ_ONLY:
        return StoreReadOnlyError
    return None
