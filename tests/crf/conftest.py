"""Fixtures for the dense-CRF tests: one torch thread (helpers live in crf_testlib.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """1 torch thread: tests share 2 cores with other processes (see ENVIRONMENT.md)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
