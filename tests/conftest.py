"""Shared test configuration.

Tests marked ``soak`` (long crash/corruption runs) are skipped unless
LOADERX_SOAK=1 is set: ``LOADERX_SOAK=1 python -m pytest -m soak``.
The ``s3`` and ``s3_endpoint`` fixtures (a local S3 server) come from
tests/s3_fixture.py, registered here as a plugin so a test names them as
parameters without importing them.
"""

import os

import pytest

pytest_plugins = ("s3_fixture",)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("LOADERX_SOAK") == "1":
        return
    skip = pytest.mark.skip(reason="soak test: set LOADERX_SOAK=1 to run")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def general_opens(monkeypatch):
    """The paths datasets opened with the general open (``_open_any``)
    rather than the usual one-call open, in order."""
    from loaderx import dataset

    opened = []
    open_any = dataset._Dataset._open_any
    monkeypatch.setattr(
        dataset._Dataset,
        "_open_any",
        lambda self, *args: opened.append(self.path) or open_any(self, *args),
    )
    return opened
