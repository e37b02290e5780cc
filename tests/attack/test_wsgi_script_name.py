"""WSGI identity: the concrete path must include SCRIPT_NAME (the mount point).

Two WSGI apps mounted under /a and /b (werkzeug's DispatcherMiddleware, or any server
mounting an app under a prefix) share one store. The same key sent to POST /b/orders
after POST /a/orders is another path, so it must be 422 key-mismatch, never a replay of
app A's response to app B's client.
"""

import json

import pytest

import onceonly
from onceonly.http.wsgi import IdempotencyMiddleware

werkzeug_test = pytest.importorskip("werkzeug.test")


def _app(tag, effects):
    def app(environ, start_response):
        environ["wsgi.input"].read()
        effects.append(tag)
        body = json.dumps({"tag": tag}).encode()
        start_response("201 Created", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def test_same_key_under_another_script_name_is_a_mismatch_not_a_replay(tmp_path):
    store = onceonly.open_store(f"sqlite:///{tmp_path}/s.db", migrate=True)
    try:
        effects = []
        a = IdempotencyMiddleware(_app("A", effects), store, principal=lambda r: "client-1")
        b = IdempotencyMiddleware(_app("B", effects), store, principal=lambda r: "client-1")
        from werkzeug.middleware.dispatcher import DispatcherMiddleware

        def root(environ, start_response):
            start_response("404 Not Found", [("Content-Length", "0")])
            return [b""]

        client = werkzeug_test.Client(DispatcherMiddleware(root, {"/a": a, "/b": b}))
        headers = {"Idempotency-Key": "k-1"}
        r1 = client.post("/a/orders", json={"n": 1}, headers=headers)
        assert r1.status_code == 201 and r1.get_json() == {"tag": "A"}
        r2 = client.post("/b/orders", json={"n": 1}, headers=headers)
        # today: 201 {"tag": "A"} with Idempotent-Replayed: true, app B never ran
        assert r2.headers.get("Idempotent-Replayed") is None
        assert r2.get_json() != {"tag": "A"}
        assert r2.status_code == 422
    finally:
        store.close()
