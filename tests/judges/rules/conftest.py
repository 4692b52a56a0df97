"""Fixtures shared by the sandbox tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def outside(tmp_path):
    """A directory outside the sandbox, writable by anyone (so only the sandbox's layers keep code out)."""
    tmp_path.chmod(0o777)
    (tmp_path / "secret.txt").write_text("the parent's secret")
    (tmp_path / "secret.txt").chmod(0o666)
    return tmp_path
