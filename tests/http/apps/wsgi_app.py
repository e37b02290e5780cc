# SPDX-License-Identifier: MIT
"""A Flask app behind the WSGI middleware, for the real-server tests (waitress).

Configured like :mod:`tests.http.apps.asgi_app`.
"""

from __future__ import annotations

import os
import time
from typing import Any

from flask import Flask, jsonify, request

import onceonly
from onceonly.http.flask import OnceOnly, current_tx, idempotency

options = {"table": os.environ["ONCEONLY_TABLE"]} if os.environ.get("ONCEONLY_TABLE") else {}
store = onceonly.open_store(os.environ["ONCEONLY_URL"], migrate=True, **options)
EFFECTS = os.environ["EFFECTS"]
ORDERS = (os.environ.get("ONCEONLY_TABLE") or "t") + "_orders"
with store.transaction() as s:
    s.execute(f"CREATE TABLE IF NOT EXISTS {ORDERS} (item TEXT)")

app = Flask(__name__)


def effect() -> int:
    with open(EFFECTS, "a") as f:
        f.write("run\n")
    with open(EFFECTS) as f:
        return len(f.readlines())


@app.post("/orders")
@idempotency("required")
def create() -> Any:
    body = request.get_json()
    n = effect()
    time.sleep(float(request.headers.get("x-sleep", 0)))
    resp = jsonify({"order": n, "item": body.get("item")})
    resp.status_code = 201
    resp.headers["Location"] = f"/orders/{n}"
    return resp


@app.post("/atomic")
@idempotency("required", atomic=True)
def atomic() -> Any:
    body = request.get_json()
    current_tx().execute(f"INSERT INTO {ORDERS} (item) VALUES (?)", (body.get("item"),))
    effect()
    time.sleep(float(request.headers.get("x-sleep", 0)))
    return {"item": body.get("item")}, 201


OnceOnly(
    app,
    store=store,
    principal=lambda r: r.headers.get("x-user"),
    lease=float(os.environ.get("LEASE", "30")),
)
