# SPDX-License-Identifier: MIT
"""Django: an installable app (``"onceonly.contrib.django"`` in ``INSTALLED_APPS``).

* ``python manage.py migrate`` creates the records table (migration ``0001``).
* ``"onceonly.contrib.django.middleware.IdempotencyMiddleware"`` in ``MIDDLEWARE``
  honours the ``Idempotency-Key`` header (docs/http.md), leased mode by default.
* ``@idempotent_view("required", atomic=True)`` (``onceonly.contrib.django.views``)
  marks a view; an atomic view's ORM writes, the claim and the stored response commit in
  one ``transaction.atomic()`` on the default database.

Settings, all optional except ``PRINCIPAL``::

    ONCEONLY_HTTP = {
        "PRINCIPAL": "myapp.auth.principal",  # callable(request) -> str | int | None, or path
        "STORE_URL": None,       # default: the default database (PostgreSQL or SQLite)
        "TABLE": "onceonly_records",
        "ROUTES": {},            # {"/orders/<int:id>": "required", ...} (Django route syntax)
        "DEFAULT": "optional",
        "POLICY": None,          # an onceonly.http.HttpPolicy
        "TTL": 86400, "LEASE": 30, "MAX_ATTEMPTS": 5,
        "LISTENERS": [],         # event listeners (onceonly.events), labelled by route
    }

``"onceonly.contrib.django.principals.user_principal"`` is a ``PRINCIPAL`` that returns
``None`` for anonymous visitors (``rest_framework_principal`` for DRF's authentication).

Needs the ``django`` extra.

The faces are the modules ``apps``, ``middleware``, ``views`` and ``principals``: Django
loads them by the dotted paths above, so this package re-exports nothing (listing the app
in ``INSTALLED_APPS`` imports no more than Django asks for).
"""

__all__: list[str] = []
