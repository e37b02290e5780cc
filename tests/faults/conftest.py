# SPDX-License-Identifier: MIT
"""``pg_cluster``: a private PostgreSQL cluster per test, which the test may restart,
crash or cut the connections of (the shared server on 5432 is never touched).

A machine without the PostgreSQL server binaries skips these tests locally and fails
them in CI, like any other missing service.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import unavailable
from tests.faults.pgcluster import PgCluster, Unavailable


@pytest.fixture
def pg_cluster() -> Iterator[PgCluster]:
    """A started private cluster; stopped and deleted after the test."""
    try:
        cluster = PgCluster()
    except Unavailable as exc:
        unavailable(f"a private PostgreSQL cluster ({exc})")
    with cluster:
        yield cluster
