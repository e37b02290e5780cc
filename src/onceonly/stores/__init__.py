# SPDX-License-Identifier: MIT
"""The stores: where records (and outbox rows) live.

``open_store``/``open_async_store`` pick one from a URL. ``sqlite`` and ``memory`` need
nothing else; the PostgreSQL modules import psycopg, from the ``postgres`` extra. This
package imports none of them.
"""
