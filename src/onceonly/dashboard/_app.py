# SPDX-License-Identifier: MIT
"""The dashboard's ASGI application: server-rendered pages and the JSON API behind them.

Routing reads the raw (still percent-encoded) path relative to the ASGI ``root_path``,
so a scope or key holding ``/`` or ``%`` reaches its record, and every link is built
from ``root_path``: the app works mounted at any sub-path.

Every write is one of :class:`~onceonly.AsyncAdmin`'s fenced operations (the CLI's) or
the outbox's redrive, and is refused (401/403, nothing changed) unless
:class:`~onceonly.dashboard._auth.Auth` lets it through.

A store that cannot serve (not migrated, refused, unreachable, too slow) answers 503
with what to do, as JSON for the API and as a page for the rest. Reads wait at most
``store_timeout``; after the store was unreachable, requests for the next
:data:`_DOWN_SECONDS` answer 503 at once, and writes never start then (a write is never
cut off half way: its outcome is always known).

A value holding NUL is refused (400) before it reaches a store. A filtered redrive
redrives only what its dry run counted: records last written at or before the count's
time, and only when as many still match (409 otherwise).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import Receive, Scope, Send

from onceonly._core.lateness import BIN_LABELS, DUPLICATE_BINS, HALF_TTL, NEAR_TTL, UNKNOWN
from onceonly._core.state import State
from onceonly.admin import AsyncAdmin, LatenessReport
from onceonly.dashboard import _views
from onceonly.dashboard._auth import COOKIE, SESSION_SECONDS, Auth, Verdict
from onceonly.errors import (
    ConfigurationError,
    NotMigrated,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
)

__all__ = ["Dashboard"]

log = logging.getLogger(__name__)

_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';"
        " frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
_MAX_FORM = 64 * 1024
_WINDOWS = {"1h": 3600.0, "6h": 6 * 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}
_DONE = {
    "redrive": "Redriven: the next delivery runs the handler again.",
    "release": "Released: the claim is failed; the next delivery runs it.",
    "delete": "Deleted.",
    "outbox": "Outbox rows put back to pending.",
    "login": "Logged in.",
    "logout": "Logged out.",
}
_NOTICE_SECONDS = 300  # a notice link shows its notice for this long
_DOWN_SECONDS = 5.0  # after the store was unreachable: answer 503 at once this long
_UNAVAILABLE = {
    NotMigrated: (
        "not-migrated",
        "The store's tables do not exist: run `onceonly migrate --url …` (or"
        " store.migrate()) once, then reload.",
    ),
    StoreMisconfigured: (
        "store-misconfigured",
        "The database refused this configuration (the database does not exist, or the"
        " login was refused): fix the store URL or the credentials, or create the"
        " database, then reload.",
    ),
    StoreUnavailable: (
        "store-unreachable",
        "The store cannot be reached right now (connection refused, lost or timed out):"
        " check the database, then reload in a few seconds.",
    ),
    TimeoutError: (
        "store-timeout",
        "The store did not answer in time (unreachable, or overloaded): check the"
        " database, then reload in a few seconds.",
    ),
    StoreError: ("store-error", "The store failed: check the database, then reload."),
}
Handler = Callable[[Request, list[str]], Awaitable[Response]]


def _q(text: str) -> str:
    return urllib.parse.quote(text, safe="")


class Dashboard:
    """The dashboard as an ASGI application (build it with :func:`onceonly.dashboard.app`)."""

    def __init__(
        self,
        store: Any,
        *,
        token: str | None,
        title: str,
        outbox: bool,
        outbox_table: str | None,
        page_size: int,
        store_timeout: float,
    ) -> None:
        self.store = store
        self.store_timeout = store_timeout
        self._down_until = 0.0  # monotonic
        self._down: tuple[str, str] = ("", "")
        self._notice_key = secrets.token_bytes(32)
        self.admin = AsyncAdmin(store)
        self.auth = Auth(token)
        self.title = title
        self.outbox = outbox
        self.outbox_table = outbox_table
        self.page_size = page_size
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("onceonly.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.css = (
            resources.files("onceonly.dashboard").joinpath("static/dashboard.css").read_bytes()
        )

    # -- ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # nothing to start: the store is the caller's
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        response = await self._guarded(request)
        for name, value in _HEADERS.items():
            response.headers.setdefault(name, value)
        await response(scope, receive, send)

    async def _guarded(self, request: Request) -> Response:
        """:meth:`_dispatch`, with a store that cannot serve answered by a 503 that says
        what to do (and every other failure by a 500 page, logged)."""
        request.scope["onceonly.api"] = _is_api(self._segments(request))
        if time.monotonic() < self._down_until:
            return self._unavailable(request, *self._down)
        try:
            if request.method in ("GET", "HEAD"):  # a read may be cut off; a write never
                return await asyncio.wait_for(self._dispatch(request), self.store_timeout)
            return await self._dispatch(request)
        except Exception as exc:
            known = [v for kind, v in _UNAVAILABLE.items() if isinstance(exc, kind)]
            if not known:
                log.exception("onceonly dashboard: %s %s failed", request.method, request.url.path)
                return self._error(request, 500, "internal error; the server's log says why")
            code, text = known[0]
            log.warning("onceonly dashboard: %s: %s", code, exc)
            if code in ("store-unreachable", "store-timeout"):
                self._down_until = time.monotonic() + _DOWN_SECONDS
                self._down = (code, text)
            return self._unavailable(request, code, text)

    def _unavailable(self, request: Request, code: str, text: str) -> Response:
        headers = {"Retry-After": str(int(_DOWN_SECONDS))}
        if _wants_json(request):
            return JSONResponse({"error": text, "code": code}, status_code=503, headers=headers)
        response = self.render(
            request, "error.html", status=503, status_code=503, message=text, link=""
        )
        response.headers.update(headers)
        return response

    def _segments(self, request: Request) -> list[str]:
        """The path below ``root_path`` as decoded segments (split before decoding)."""
        root = request.scope.get("root_path", "")
        raw = request.scope.get("raw_path")
        path = raw.decode("latin-1") if raw else urllib.parse.quote(request.scope["path"])
        path = path.split("?", 1)[0]
        quoted_root = urllib.parse.quote(root)
        if root and path.startswith(quoted_root):
            path = path[len(quoted_root) :]
        elif root and path.startswith(root):
            path = path[len(root) :]
        return [urllib.parse.unquote(p) for p in path.strip("/").split("/") if p != ""]

    async def _dispatch(self, request: Request) -> Response:
        parts = self._segments(request)
        if any("\x00" in p for p in parts):
            return self._error(request, 400, "the path holds a NUL character")
        nul = _views.nul_in(request.query_params)
        if nul is not None:
            return self._error(request, 400, f"{nul} holds a NUL character")
        method = request.method
        routes: dict[tuple[str, str], Handler] = {
            ("GET", ""): self.page_overview,
            ("GET", "records"): self.page_records,
            ("GET", "record"): self.page_record,
            ("POST", "record-action"): self.form_record_action,
            ("GET", "redrive"): self.page_redrive,
            ("POST", "redrive"): self.form_redrive,
            ("GET", "outbox"): self.page_outbox,
            ("POST", "outbox"): self.form_outbox,
            ("GET", "login"): self.page_login,
            ("POST", "login"): self.form_login,
            ("POST", "logout"): self.form_logout,
            ("GET", "static"): self.static,
            ("GET", "api-summary"): self.api_summary,
            ("GET", "api-records"): self.api_records,
            ("GET", "api-record"): self.api_record,
            ("POST", "api-record-action"): self.api_record_action,
            ("POST", "api-redrive"): self.api_redrive,
            ("GET", "api-outbox"): self.api_outbox,
            ("POST", "api-outbox-redrive"): self.api_outbox_redrive,
        }
        name, args = _route(parts)
        handler = routes.get((method if method != "HEAD" else "GET", name))
        if handler is None:
            if any(n == name for _, n in routes):
                return self._error(request, 405, "method not allowed")
            return self._error(request, 404, "not found")
        return await handler(request, args)

    # -- helpers
    def url(self, request: Request, path: str, params: dict[str, str] | None = None) -> str:
        root = urllib.parse.quote(request.scope.get("root_path", "").rstrip("/"))
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        return f"{root}/{path.lstrip('/')}{query}"

    def record_url(self, request: Request, scope: str, key: str, action: str = "") -> str:
        return self.url(
            request, f"records/{_q(scope)}/{_q(key)}" + (f"/{action}" if action else "")
        )

    def _session(self, request: Request) -> str | None:
        return self.auth.session(request.cookies.get(COOKIE))

    def _notice_sig(self, done: str, n: str, issued: str) -> str:
        text = f"{done}\0{n}\0{issued}".encode()
        return hmac.new(self._notice_key, text, hashlib.sha256).hexdigest()[:32]

    def notice(self, done: str, n: int | None = None) -> dict[str, str]:
        """The query parameters of a notice a redirect carries, signed with this
        process's key so that a link made elsewhere shows none."""
        count = "" if n is None else str(n)
        issued = str(int(time.time()))
        out = {"done": done, "n": count, "t": issued}
        out["sig"] = self._notice_sig(done, count, issued)
        return {k: v for k, v in out.items() if v}

    def _notice_of(self, request: Request) -> tuple[str, str]:
        """The notice and its count, when the query carries a valid, recent one."""
        p = request.query_params
        done, n, issued = p.get("done", ""), p.get("n", ""), p.get("t", "")
        if done not in _DONE or not issued.isdigit():
            return "", ""
        if not hmac.compare_digest(p.get("sig", ""), self._notice_sig(done, n, issued)):
            return "", ""
        if not 0 <= time.time() - int(issued) <= _NOTICE_SECONDS:
            return "", ""
        return _DONE[done], n

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        session = self._session(request)
        notice, notice_count = self._notice_of(request)
        page = self.env.get_template(template).render(
            title=self.title,
            url=lambda path, **p: self.url(request, path, p or None),
            record_url=lambda scope, key, action="": self.record_url(request, scope, key, action),
            writable=self.auth.enabled,
            logged_in=session is not None,
            csrf=self.auth.csrf(session) if session is not None else "",
            notice=notice,
            notice_count=notice_count,
            age=_age,
            iso=_views.iso,
            here=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            **context,
        )
        return HTMLResponse(page, status_code=status)

    def _error(self, request: Request, status: int, message: str, link: str = "") -> Response:
        if _wants_json(request):
            return JSONResponse({"error": message}, status_code=status)
        return self.render(
            request, "error.html", status=status, status_code=status, message=message, link=link
        )

    async def _form(self, request: Request) -> dict[str, str] | Response:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_FORM:
                return self._error(request, 413, "the form is too large")
        pairs = dict(
            urllib.parse.parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        )
        nul = _views.nul_in(pairs)
        if nul is not None:
            return self._error(request, 400, f"{nul} holds a NUL character")
        return pairs

    def _refused(self, request: Request, form: dict[str, str] | None) -> Response | None:
        verdict: Verdict = self.auth.check(
            request.headers.get("authorization"),
            request.cookies.get(COOKIE),
            None if form is None else form.get("csrf"),
        )
        if verdict.status == 0:
            return None
        response = self._error(request, verdict.status, verdict.reason)
        if verdict.status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="onceonly dashboard"'
        return response

    # -- pages
    async def page_overview(self, request: Request, args: list[str]) -> Response:
        window_name = request.query_params.get("window", "1h")
        if window_name not in _WINDOWS:
            return self._error(request, 400, _bad_window(window_name))
        window = _WINDOWS[window_name]
        data = await self._summary(window)
        return self.render(
            request,
            "overview.html",
            s=data,
            states=[s.value for s in State],
            chart=_rate_chart(data),
            lateness=_lateness_chart(data.lateness),
            windows=list(_WINDOWS),
            window_name=window_name if window_name in _WINDOWS else "1h",
        )

    async def page_records(self, request: Request, args: list[str]) -> Response:
        filters = _views.Filters.parse(request.query_params)
        if "limit" not in request.query_params:
            filters = _replace_limit(filters, self.page_size)
        records, cursor = await self._page(filters)
        next_url = self.url(request, "records", filters.params(after=cursor)) if cursor else ""
        first_url = self.url(request, "records", filters.params(after="")) if filters.after else ""
        return self.render(
            request,
            "records.html",
            f=filters,
            records=records,
            next_url=next_url,
            first_url=first_url,
            states=[s.value for s in State],
            now=time.time(),
            redrive_url=(
                self.url(request, "redrive", filters.params(after=""))
                if filters.state in ("dead", "failed")
                else ""
            ),
        )

    async def page_record(self, request: Request, args: list[str]) -> Response:
        scope, key = args
        record = await self.admin.show(scope, key)
        if record is None:
            return self._error(request, 404, "no such record (deleted, or never stored)")
        fields = _views.record_json(record, full=True)
        now = await self.admin.clock()
        lapsed = record.state is State.IN_PROGRESS and (
            record.lease_until is None or record.lease_until <= now
        )
        # a redrive writes failed with zero attempts; a failed run counts one
        redriven = record.state is State.FAILED and record.attempts == 0
        return self.render(
            request,
            "record.html",
            r=record,
            fields=fields,
            redriven=redriven,
            can_redrive=record.state in (State.DEAD, State.FAILED) and not redriven,
            can_release=lapsed,
            lease_live=record.state is State.IN_PROGRESS and not lapsed,
        )

    async def form_record_action(self, request: Request, args: list[str]) -> Response:
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        refused = self._refused(request, form)
        if refused is not None:
            return refused
        scope, key, action = args
        if action == "delete" and form.get("confirm") != "yes":
            return self._error(request, 400, "tick the confirmation box to delete a record")
        done = await self._act(scope, key, action)
        if done is None:
            return self._error(request, 404, f"unknown action {action!r}")
        if not done:
            return self._error(
                request,
                409,
                f"not {action}d: the record is absent, not in a state that allows it, or a"
                " worker changed it meanwhile. Reload the record and try again.",
            )
        target = (
            self.url(request, "records", {"scope": scope})
            if action == "delete"
            else self.record_url(request, scope, key)
        )
        sep = "&" if "?" in target else "?"
        return _see_other(target + sep + urllib.parse.urlencode(self.notice(action)))

    async def page_redrive(self, request: Request, args: list[str]) -> Response:
        filters = _views.Filters.parse(request.query_params)
        if filters.errors:
            return self._error(request, 400, "; ".join(filters.errors))
        if filters.state not in ("dead", "failed"):
            return self._error(request, 400, "a filtered redrive needs state dead or failed")
        before = await self._bound(filters)
        count = await self._count(filters, before)
        return self.render(
            request,
            "redrive.html",
            f=filters,
            count=count,
            before=repr(before),
            back=self.url(request, "records", filters.params(after="")),
        )

    async def form_redrive(self, request: Request, args: list[str]) -> Response:
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        refused = self._refused(request, form)
        if refused is not None:
            return refused
        filters = _views.Filters.parse(form)
        if filters.errors:
            return self._error(request, 400, "; ".join(filters.errors))
        if filters.state not in ("dead", "failed"):
            return self._error(request, 400, "a filtered redrive needs state dead or failed")
        if form.get("confirm") != "yes":
            return self._error(request, 400, "confirm the redrive on the confirmation page")
        try:
            before, expect = float(form.get("before", "")), int(form.get("count", ""))
        except ValueError:
            return self._error(
                request, 400, "the form carries no dry-run count: redrive from the count page"
            )
        n = await self._redrive_counted(filters, before, expect)
        if n is None:
            return self._error(request, 409, _changed(expect), link=self._recount(request, filters))
        params = {**filters.params(after="", state="failed"), **self.notice("redrive", n)}
        return _see_other(self.url(request, "records", params))

    async def page_outbox(self, request: Request, args: list[str]) -> Response:
        box = await _views.outbox_summary(self.store, self.outbox_table) if self.outbox else None
        rows = []
        if box is not None:
            from onceonly.outbox import AsyncOutbox

            rows = await AsyncOutbox(self.store, table=self.outbox_table).rows("dead", 200)
        return self.render(request, "outbox.html", box=box, rows=rows)

    async def form_outbox(self, request: Request, args: list[str]) -> Response:
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        refused = self._refused(request, form)
        if refused is not None:
            return refused
        n = await self._outbox_redrive(form.get("id") or None)
        if n is None:
            return self._error(request, 404, "this store has no outbox")
        return _see_other(self.url(request, "outbox", self.notice("outbox", n)))

    async def page_login(self, request: Request, args: list[str]) -> Response:
        return self.render(
            request,
            "login.html",
            next=_safe_next(request, request.query_params.get("next", "")),
            failed=False,
        )

    async def form_login(self, request: Request, args: list[str]) -> Response:
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        target = _safe_next(request, form.get("next", ""))
        if not self.auth.enabled:
            return self._error(request, 403, "read-only: no token is configured")
        if not self.auth.token_matches(form.get("token", "")):
            return self.render(request, "login.html", status=403, next=target, failed=True)
        response = _see_other(target or self.url(request, "", self.notice("login")))
        response.set_cookie(
            COOKIE,
            self.auth.new_session(),
            max_age=SESSION_SECONDS,
            path=(request.scope.get("root_path", "").rstrip("/") or "") + "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def form_logout(self, request: Request, args: list[str]) -> Response:
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        session = self._session(request)
        if session is not None:  # a live session ends only by its own form (CSRF)
            csrf = form.get("csrf", "")
            if not hmac.compare_digest(csrf.encode(), self.auth.csrf(session).encode()):
                return self._error(
                    request, 403, "the form's CSRF token is missing or wrong; reload the page"
                )
            self.auth.end_session(session)
        response = _see_other(self.url(request, "", self.notice("logout")))
        response.delete_cookie(
            COOKIE, path=(request.scope.get("root_path", "").rstrip("/") or "") + "/"
        )
        return response

    async def static(self, request: Request, args: list[str]) -> Response:
        if args != ["dashboard.css"]:
            return self._error(request, 404, "not found")
        return Response(
            self.css,
            media_type="text/css",
            headers={"Cache-Control": "public, max-age=3600"},
        )

    # -- the JSON API
    async def api_summary(self, request: Request, args: list[str]) -> Response:
        window_name = request.query_params.get("window", "1h")
        if window_name not in _WINDOWS:
            return JSONResponse({"error": _bad_window(window_name)}, status_code=400)
        return JSONResponse((await self._summary(_WINDOWS[window_name])).json())

    async def api_records(self, request: Request, args: list[str]) -> Response:
        filters = _views.Filters.parse(request.query_params)
        if filters.errors:
            return JSONResponse({"error": "; ".join(filters.errors)}, status_code=400)
        records, cursor = await self._page(filters)
        return JSONResponse(
            {"records": [_views.record_json(r) for r in records], "next": cursor or None}
        )

    async def api_record(self, request: Request, args: list[str]) -> Response:
        record = await self.admin.show(*args)
        if record is None:
            return JSONResponse({"error": "no such record"}, status_code=404)
        return JSONResponse(_views.record_json(record, full=True))

    async def api_record_action(self, request: Request, args: list[str]) -> Response:
        refused = self._refused(request, None)
        if refused is not None:
            return refused
        scope, key, action = args
        done = await self._act(scope, key, action)
        if done is None:
            return JSONResponse({"error": f"unknown action {action!r}"}, status_code=404)
        record = await self.admin.show(scope, key)
        body = {
            "done": done,
            "action": action,
            "record": None if record is None else _views.record_json(record, full=True),
        }
        return JSONResponse(body, status_code=200 if done else 409)

    async def api_redrive(self, request: Request, args: list[str]) -> Response:
        refused = self._refused(request, None)
        if refused is not None:
            return refused
        params = request.query_params
        filters = _views.Filters.parse(params)
        errors = list(filters.errors)
        try:
            dry_run = _views.parse_bool("dry_run", params.get("dry_run", "0"))
        except ValueError as exc:
            errors.append(str(exc))
        before = expect = None
        try:
            if "before" in params:
                before = float(params["before"])
            if "expect" in params:
                expect = int(params["expect"])
        except ValueError:
            errors.append("before is epoch seconds and expect a whole number (from a dry run)")
        if (before is None) != (expect is None):
            errors.append("before and expect go together (both from a dry run)")
        if not errors and filters.state not in ("dead", "failed"):
            errors.append("state=dead or state=failed is required")
        if errors:
            return JSONResponse({"error": "; ".join(errors)}, status_code=400)
        if dry_run:
            bound = await self._bound(filters)
            n = await self._count(filters, bound)
            return JSONResponse({"dry_run": True, "matched": n, "before": bound, "expect": n})
        if before is None or expect is None:
            n = await self.admin.redrive_matching(filters.query(limit=500))
            return JSONResponse({"dry_run": False, "redriven": n})
        done = await self._redrive_counted(filters, before, expect)
        if done is None:
            return JSONResponse({"error": _changed(expect), "redriven": 0}, status_code=409)
        return JSONResponse({"dry_run": False, "redriven": done})

    async def api_outbox(self, request: Request, args: list[str]) -> Response:
        state = request.query_params.get("state", "dead")
        if state not in ("dead", "pending"):
            return JSONResponse({"error": "state is dead or pending"}, status_code=400)
        box = await _views.outbox_summary(self.store, self.outbox_table) if self.outbox else None
        if box is None:
            return JSONResponse({"error": "this store has no outbox"}, status_code=404)
        from onceonly.outbox import AsyncOutbox

        try:
            limit = _views.parse_limit(request.query_params.get("limit", "100"))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        rows = await AsyncOutbox(self.store, table=self.outbox_table).rows(state, limit)
        return JSONResponse(
            {
                **box,
                "rows": [
                    {
                        "id": r.message.id,
                        "topic": r.message.topic,
                        "key": r.message.key,
                        "attempts": r.message.attempts,
                        "created_at": _views.iso(r.message.created_at),
                        "last_error": r.last_error,
                        "payload": r.message.payload,
                    }
                    for r in rows
                ],
            }
        )

    async def api_outbox_redrive(self, request: Request, args: list[str]) -> Response:
        refused = self._refused(request, None)
        if refused is not None:
            return refused
        n = await self._outbox_redrive(args[0] if args else None)
        if n is None:
            return JSONResponse({"error": "this store has no outbox"}, status_code=404)
        return JSONResponse({"redriven": n}, status_code=200 if n or not args else 409)

    # -- shared reads and writes
    async def _summary(self, window: float) -> _views.Summary:
        return await _views.summary(
            self.admin, window=window, points=12, outbox_table=self.outbox_table, outbox=self.outbox
        )

    async def _page(self, filters: _views.Filters) -> tuple[list[Any], str]:
        # one more than a page tells whether a next page exists
        records = (await self.admin.records.scan(filters.query(limit=filters.limit + 1)))[0]
        page = records[: filters.limit]
        more = len(records) > filters.limit
        cursor = _views.encode_cursor((page[-1].scope, page[-1].key)) if more and page else ""
        return page, cursor

    async def _bound(self, filters: _views.Filters) -> float:
        """The newest ``updated_at`` a filtered redrive counted now takes: the store's
        clock now, less the filters' age (so the set cannot grow as time passes)."""
        age = _views.parse_age(filters.age) if filters.age else 0.0
        return await self.admin.clock() - age

    async def _count(self, filters: _views.Filters, before: float) -> int:
        """The records of a filtered redrive's set: matching now, last written at or
        before ``before`` (records that died since are not in it)."""
        return await self.admin.redrive_matching(
            filters.query(limit=500), dry_run=True, before=before
        )

    async def _redrive_counted(
        self, filters: _views.Filters, before: float, expect: int
    ) -> int | None:
        """Redrive the set a dry run counted (``expect`` records up to ``before``), each
        write fenced on the version read; ``None`` (nothing written) when the set is not
        that size any more (:meth:`~onceonly.AsyncAdmin.redrive_matching`)."""
        return await self.admin.redrive_matching(
            filters.query(limit=500), before=before, expect=expect
        )

    def _recount(self, request: Request, filters: _views.Filters) -> str:
        return self.url(request, "redrive", filters.params(after=""))

    async def _act(self, scope: str, key: str, action: str) -> bool | None:
        """Run one fenced record action; ``None`` for an unknown action."""
        if action == "redrive":
            return await self.admin.redrive(scope, key) is not None
        if action == "release":
            return await self.admin.release(scope, key) is not None
        if action == "delete":
            return await self.admin.delete(scope, key)
        return None

    async def _outbox_redrive(self, message_id: str | None) -> int | None:
        if not self.outbox or await _views.outbox_summary(self.store, self.outbox_table) is None:
            return None
        from onceonly.outbox import AsyncOutbox

        return await AsyncOutbox(self.store, table=self.outbox_table).redrive(message_id)


def _route(parts: list[str]) -> tuple[str, list[str]]:
    """The route name and its arguments for the path's segments."""
    api = bool(parts) and parts[0] == "api"
    rest = parts[1:] if api else parts
    prefix = "api-" if api else ""
    if not rest:
        return ("" if not api else "api-"), []
    head = rest[0]
    if head == "records" and len(rest) == 3:
        return prefix + "record", rest[1:]
    if head == "records" and len(rest) == 4:
        return prefix + "record-action", rest[1:]
    if head == "outbox" and api and len(rest) == 2 and rest[1] == "redrive":
        return "api-outbox-redrive", []
    if head == "outbox" and api and len(rest) == 3 and rest[2] == "redrive":
        return "api-outbox-redrive", [rest[1]]
    if head in ("records", "outbox", "redrive", "summary", "login", "logout") and len(rest) == 1:
        return prefix + head, []
    if head == "static" and not api:
        return "static", rest[1:]
    return prefix + "?" + head, []


def _bad_window(name: str) -> str:
    return f"window {name!r} is not one of {', '.join(_WINDOWS)}"


def _changed(expect: int) -> str:
    return (
        f"nothing redriven: the set changed since its dry run counted {expect} (a worker or"
        " another operator wrote some of them). Count again and confirm the new count."
    )


def _is_api(parts: list[str]) -> bool:
    return bool(parts) and parts[0] == "api"


def _see_other(url: str) -> Response:
    return RedirectResponse(url, status_code=303)


def _wants_json(request: Request) -> bool:
    return bool(request.scope.get("onceonly.api")) or "application/json" in request.headers.get(
        "accept", ""
    )


def _safe_next(request: Request, target: str) -> str:
    """Only a path of this dashboard (under the ASGI ``root_path`` when mounted): never
    ``//host``, ``https://…``, another part of the site, nor one a browser would turn into
    either (it drops tabs and newlines and reads ``\\`` as ``/``)."""
    if any(ord(c) < 0x21 or c in "\\\x7f" for c in target):
        return ""
    if not target.startswith("/") or target.startswith("//"):
        return ""
    root = urllib.parse.quote(request.scope.get("root_path", "").rstrip("/"))
    path = urllib.parse.unquote(target.split("?", 1)[0])
    if "/../" in path + "/" or "/./" in path + "/":
        return ""  # a browser would resolve these, perhaps out of the root
    if root and not (target == root or target.startswith(root + "/")):
        return ""
    return target


def _replace_limit(filters: _views.Filters, limit: int) -> _views.Filters:
    import dataclasses

    return dataclasses.replace(filters, limit=limit)


def _age(seconds: float | None) -> str:
    """A short human duration (``42s``, ``7m``, ``3h 5m``, ``2d 4h``)."""
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _rate_chart(s: _views.Summary) -> dict[str, Any]:
    """Bars of the duplicate rate per scope and interval, for the SVG."""
    scopes = sorted({name for p in s.duplicates for name in p.counts})
    rows: list[dict[str, Any]] = []
    every_bar: list[dict[str, Any]] = []
    for name in scopes:
        bars: list[dict[str, Any]] = []
        for i, p in enumerate(s.duplicates):
            claims, replays = p.counts.get(name, (0, 0))
            bars.append(
                {
                    "i": i,
                    "rate": p.rate(name),
                    "claims": claims,
                    "replays": replays,
                    "start": _views.iso(p.start),
                }
            )
        every_bar += bars
        total_claims = sum(p.counts.get(name, (0, 0))[0] for p in s.duplicates)
        total_replays = sum(p.counts.get(name, (0, 0))[1] for p in s.duplicates)
        rows.append(
            {
                "scope": name,
                "bars": bars,
                "claims": total_claims,
                "replays": total_replays,
                "rate": total_replays / total_claims if total_claims else None,
            }
        )
    top = max((b["rate"] or 0.0 for b in every_bar), default=0.0)
    scale = next(x for x in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0) if top <= x)
    for b in every_bar:  # bar heights in pixels, the largest rate near the top
        b["height"] = None if b["rate"] is None else round(b["rate"] / scale * 46, 1)
    return {"rows": rows, "points": len(s.duplicates), "scale": scale}


def _lateness_chart(report: LatenessReport | None) -> dict[str, Any] | None:
    """Bars of the duplicate-lateness histogram (duplicates per bin, the ttl bins last)
    and a row per scope, for the SVG; ``None`` when nothing was recorded."""
    if report is None:
        return None
    top = max(report.bins[b] for b in DUPLICATE_BINS) or 1
    bars = []
    for i, b in enumerate(DUPLICATE_BINS):
        n = report.bins[b]
        height = round(n / top * 120, 1)
        kind = "near" if b == NEAR_TTL else "half" if b == HALF_TTL else "bar"
        bars.append(
            {"bin": b, "i": i, "label": BIN_LABELS[b], "n": n, "height": height, "kind": kind}
        )
    ttls = sorted({t for t in report.ttl.values() if t is not None})
    rows = []
    for scope, counts in sorted(report.by_scope.items()):
        total = sum(counts.values())
        late = counts[HALF_TTL] + counts[NEAR_TTL]
        rows.append(
            {
                "scope": scope,
                "total": total,
                "half": counts[HALF_TTL],
                "near": counts[NEAR_TTL],
                "late_share": late / total if total else None,
                "ttl": _age(report.ttl[scope]) if report.ttl.get(scope) is not None else "none",
            }
        )
    return {
        "bars": bars,
        "ttl": ", ".join(_age(t) for t in ttls) if ttls else None,
        "total": report.duplicates,
        "unknown": report.bins[UNKNOWN],
        "rows": rows,
        "width": len(bars) * 60 + 40,
    }


def build(
    store: Any,
    *,
    token: str | None,
    title: str,
    outbox: bool,
    outbox_table: str | None,
    page_size: int,
    store_timeout: float,
) -> Dashboard:
    """Validate the options and build the app (see :func:`onceonly.dashboard.app`)."""
    if page_size < 1 or page_size > _views.MAX_LIMIT:
        raise ConfigurationError(f"page_size must be between 1 and {_views.MAX_LIMIT}")
    if not 0 < store_timeout < float("inf"):
        raise ConfigurationError("store_timeout must be a positive number of seconds")
    return Dashboard(
        store, token=token, title=title, outbox=outbox, outbox_table=outbox_table,
        page_size=page_size, store_timeout=store_timeout,
    )  # fmt: skip
