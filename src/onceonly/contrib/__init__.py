# SPDX-License-Identifier: MIT
"""Integrations with frameworks that own their configuration (Django) or the schema
(Alembic)."""
