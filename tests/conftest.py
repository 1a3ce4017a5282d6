"""Fixtures for every test directory."""

from __future__ import annotations

import pytest

from tests.build.kernel_cache import BuiltKernel, built_kernel_store, missing


@pytest.fixture(scope="session")
def built_kernel() -> BuiltKernel:
    """The real test kernel (tests/build/kernel_cache.py): its store, release and compiler text,
    built once per machine. Skips, naming what is missing, where it cannot be built."""
    lacking = missing()
    if lacking:
        pytest.skip(f"the real kernel build needs {', '.join(lacking)}")
    return built_kernel_store()
