"""Shared test configuration.

Tests marked ``soak`` (long crash/corruption runs) are skipped unless
LOADERX_SOAK=1 is set: ``LOADERX_SOAK=1 python -m pytest -m soak``.
"""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("LOADERX_SOAK") == "1":
        return
    skip = pytest.mark.skip(reason="soak test: set LOADERX_SOAK=1 to run")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
