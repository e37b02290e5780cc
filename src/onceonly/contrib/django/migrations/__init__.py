# SPDX-License-Identifier: MIT
"""The Django migrations of the records table (Django finds them; nothing to import)."""

__all__: list[str] = []
