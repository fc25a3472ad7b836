"""Shared fixtures: one fixture parametrises the backend (the CUDA backend joins it later)."""

from __future__ import annotations

import pytest

import tapegrad as tg

BACKENDS = {"cpu": tg.CPU}


@pytest.fixture(params=sorted(BACKENDS), scope="session")
def backend(request):
    """Every backend available here (``tg.CPU()`` always)."""
    return BACKENDS[request.param]()
