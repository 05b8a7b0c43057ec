"""One error hierarchy for disk and permission errors: every errno the I/O
seams can report (zig/io.zig through zig/status.zig, and src/loaderx/_fs.py)
maps to one class, each an OSError with its errno and a ZrecordError."""

from __future__ import annotations

import errno
import os
import pickle

import numpy as np
import pytest

from loaderx import ArrayStore, StoreFullError, StoreReadOnlyError, Zrecord, ZrecordError
from loaderx._fs import OsFs, _error
from loaderx._native import error_for
from loaderx.arraystore import ArrayStoreIOError
from loaderx.zrecord import StoreOSError

# What zig/status.zig `fromOs` reports for each OS error of the seam: the
# status code and the errno (its Zig test checks the same table).
NATIVE = {
    errno.ENOSPC: (8, StoreFullError),
    errno.EDQUOT: (8, StoreFullError),
    errno.EFBIG: (8, StoreFullError),
    errno.EROFS: (7, StoreReadOnlyError),
    errno.EACCES: (7, StoreReadOnlyError),
    errno.EPERM: (7, StoreReadOnlyError),
    errno.ENAMETOOLONG: (3, StoreOSError),
    errno.EIO: (3, StoreOSError),
    errno.ENOENT: (17, StoreOSError),
    errno.ENOMEM: (9, StoreOSError),
}


@pytest.mark.parametrize("code", sorted(NATIVE), ids=errno.errorcode.get)
def test_every_native_errno_raises_its_class(code):
    """A native failure with an errno is the class the errno names, an
    OSError carrying it and a ZrecordError carrying the status code."""
    status, cls = NATIVE[code]
    exc = error_for(status, "cannot write 'data-1' in 'x': it failed", code)
    assert type(exc) is cls
    assert isinstance(exc, OSError) and isinstance(exc, ZrecordError)
    assert (exc.errno, exc.code, exc.strerror) == (code, status, os.strerror(code))
    assert str(exc) == "cannot write 'data-1' in 'x': it failed"
    again = pickle.loads(pickle.dumps(exc))  # crosses process boundaries whole
    assert (type(again), again.errno, again.code, str(again)) == (cls, code, status, str(exc))


@pytest.mark.parametrize("code", sorted(NATIVE), ids=errno.errorcode.get)
def test_every_python_seam_errno_raises_its_class(code):
    """The Python seam (_fs) maps the same errnos to the same classes; other
    errnos keep their own OSError subclass (FileNotFoundError, ...)."""
    exc = _error(OSError(code, os.strerror(code)), "write '/x/y'")
    expected = NATIVE[code][1]
    if expected is StoreOSError:
        assert type(exc) is type(OSError(code, "")) and not isinstance(exc, ZrecordError)
    else:
        assert type(exc) is expected
    assert exc.errno == code and "cannot write '/x/y'" in str(exc)


def test_a_status_without_an_errno_keeps_its_class():
    """A store error no OS call caused (damage, a locked store) is no OSError."""
    exc = error_for(4, "store 'x' is damaged", 0)
    assert type(exc).__name__ == "CorruptStoreError" and not isinstance(exc, OSError)


@pytest.mark.parametrize(
    "code,cls",
    [
        (errno.ENOSPC, StoreFullError),
        (errno.EDQUOT, StoreFullError),
        (errno.EROFS, StoreReadOnlyError),
        (errno.EACCES, StoreReadOnlyError),
    ],
)
def test_arraystore_io_errors_are_the_store_classes_with_their_outcome(code, cls):
    """ArrayStore's disk errors carry `.outcome` and are the same classes."""
    exc = ArrayStoreIOError(code, "save of 'x' failed, nothing changed", "unchanged")
    assert isinstance(exc, cls) and isinstance(exc, ArrayStoreIOError) and isinstance(exc, OSError)
    assert (exc.errno, exc.outcome) == (code, "unchanged")
    again = pickle.loads(pickle.dumps(exc))
    assert (type(again), again.errno, again.outcome) == (type(exc), code, "unchanged")


def test_a_too_long_name_is_an_oserror_with_enametoolong(tmp_path):
    """A store path with a component past NAME_MAX: an OSError (ENAMETOOLONG),
    not a bare ZrecordError."""
    with pytest.raises(OSError) as info:
        Zrecord(tmp_path / ("x" * 300) / "store")
    assert info.value.errno == errno.ENAMETOOLONG and isinstance(info.value, ZrecordError)


class _FullDisk(OsFs):
    """The real file system, but every new file fails as on a full disk."""

    def write_new(self, path: str, payload: bytes) -> None:
        raise _error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), f"write '{path}'")


def test_an_arraystore_that_cannot_be_created_on_a_full_disk_leaves_nothing(tmp_path):
    """Opening an ArrayStore on a full disk raised ENOSPC but left its new
    (empty) directory, and its new parents, behind."""
    with pytest.raises(StoreFullError) as info:
        ArrayStore(tmp_path / "new" / "arrays", _fs=_FullDisk())
    assert info.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path) == []


def test_a_failed_append_gives_the_disk_back(tmp_path):
    """A failing append's bytes are cut at once: what stays on disk is what is
    committed (an ENOSPC left 3.1 MB for 93 KB live). Simulated by a file-size
    limit (EFBIG from RLIMIT_FSIZE) in a child process."""
    import resource
    import subprocess
    import sys

    script = (
        "import resource, signal, sys, numpy as np\n"
        "from loaderx import Zrecord, StoreFullError\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "store = Zrecord(sys.argv[1], codec='raw')\n"
        "store.append(np.zeros(9000, np.uint8), [0])\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)\n"
        "    store.append(data, [0])\n"
        "except StoreFullError as exc:\n"
        "    print(exc.errno)\n"
        "store.close()\n"
    )
    assert resource.getrlimit(resource.RLIMIT_FSIZE)[1] == resource.RLIM_INFINITY
    path = tmp_path / "s"
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) == errno.EFBIG
    with Zrecord(path) as store:
        assert len(store) == 1 and store.stats()["chunk_bytes"] == 9000
    data = [f for f in os.listdir(path) if f.startswith("data-")]
    assert [os.path.getsize(path / f) for f in data] == [9000]
    assert np.array_equal(np.frombuffer(Zrecord(path).read(0), np.uint8), np.zeros(9000, np.uint8))
