# SPDX-License-Identifier: MIT
"""Integrations with frameworks that own their configuration (Django), the schema
(Alembic) or the task queue (Celery).

Each is a face of its own, behind its extra: :mod:`onceonly.contrib.alembic`,
:mod:`onceonly.contrib.celery`, :mod:`onceonly.contrib.django`. This package imports
none of them.
"""

__all__: list[str] = []
