"""The annotation web app (stdlib ``http.server``; one page + a small JSON API).

An annotator logs in once by POSTing the access token (the form on ``/``); it is kept in an
HttpOnly, SameSite=Strict cookie (scripts may send ``Authorization: Bearer TOKEN`` instead).
POSTs from another origin are refused (login CSRF). Routes:

``POST /login``, ``POST /logout``  form field ``token``; sets / clears the cookie
``GET /api/me``                    who am I, class names, progress of every annotator
``GET /api/queue?stage=1|3``       my queue (``done`` = my verdict given, ``status`` of the image)
``GET /api/item?image=ID``         the image's evidence, example-image URLs for the classes of (D)
                                   and (E), my verdicts, and in Stage 3 all verdicts and what differs
``POST /api/verdict``              JSON ``{image, stage, verdict, ood_label, fine_grained, id_class, note,
                                   submission, base}``; verdict ``withdrawn`` = undo (see ``.protocol``)
``GET /image?image=ID``            the candidate image; ``GET /example?label=C&k=J`` an ID example image

Every response carries a strict Content-Security-Policy (``sandbox`` on images), ``frame-ancestors
'none'`` and ``nosniff``; images are typed from their bytes (:func:`.evidence.image_bytes`), never
from their names. Every request gets an answer: errors are JSON ``{"error": ...}`` (400 bad input,
401 token, 403 foreign origin, 404 unknown, 405, 408 body too slow, 409 outdated, 411, 413, 415),
bodies are bounded in size and nesting, and each connection has a time limit.
The server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import re
import socket
import time
from functools import cached_property
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import accumulate
from pathlib import Path
from urllib.parse import parse_qs, quote, urlparse

from .candidates import Project, load_project
from .evidence import NotAnImageError, image_bytes, load_evidence
from .protocol import Annotator, AuthError, ProtocolError, open_store

__all__ = ["AnnotationApp", "make_server", "bind_warning"]

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
STATIC_FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
                "/static/style.css": ("style.css", "text/css; charset=utf-8")}
COOKIE = "oodeval_token"
MAX_BODY = 64 * 1024
MAX_DEPTH = 2  # the verdict is a flat JSON object
LOOPBACK = {"127.0.0.1", "::1"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
CSP_IMAGE = "default-src 'none'; style-src 'unsafe-inline'; sandbox; frame-ancestors 'none'"
FIELDS = {"image": (str,), "stage": (int,), "verdict": (str,), "ood_label": (str, type(None)), "fine_grained": (bool,),
          "id_class": (int, type(None)), "note": (str, type(None)), "submission": (str,), "base": (int, type(None))}
SUBMISSION_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")


class HTTPError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class AnnotationApp:
    """The state behind the server: the project, its store, and example images per ID class."""

    def __init__(self, work: str | Path, examples: int = 4) -> None:
        self.project: Project = load_project(work)
        self.store = open_store(self.project, check_evidence=True)
        self.class_names = [self.project.class_name(i) for i in range(self.project.n_classes)]
        pool = {c.image for c in self.project.candidates}
        self.by_class: dict[int, list[str]] = {}
        for path, label in zip(self.project.manifest.paths, self.project.manifest.labels):
            if path not in pool and len(self.by_class.setdefault(label, [])) < examples:
                self.by_class[label].append(path)
        self.paths = {c.image: c.path for c in self.project.candidates}

    def item(self, who: Annotator, image: str) -> dict:
        """The view of :meth:`ProtocolStore.view` plus evidence and example-image URLs."""
        view = self.store.view(who.name, image)
        ev = load_evidence(self.project.evidence_dir, image)
        view["evidence"] = ev
        view["image_url"] = f"/image?image={quote(image, safe='')}"
        shown: list[int] = [view["original_label"]]
        for key in ("vlm_topk", "confusions"):
            shown += [e["label"] for e in ev.get(key, [])]
        view["examples"] = {
            str(label): [f"/example?label={label}&k={k}" for k in range(len(self.by_class.get(label, [])))]
            for label in dict.fromkeys(shown)
        }
        return view


def json_depth(text: str) -> int:
    """Nesting depth of a JSON text (brackets outside string literals)."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', "", text)
    steps = (1 if ch in "[{" else -1 for ch in bare if ch in "[]{}")
    return max(accumulate(steps, initial=0))


class Handler(BaseHTTPRequestHandler):
    server_version = "oodeval-construct"
    error_content_type = "application/json"
    error_message_format = '{"error": "%(code)d %(message)s"}'
    app: AnnotationApp  # set by make_server
    timeout = 30.0  # seconds per read of the request line and headers, and for the whole body

    def log_message(self, fmt: str, *args) -> None:  # route access logs to logging
        log.debug("%s " + fmt, self.address_string(), *args)

    def end_headers(self) -> None:
        """Every response, the http.server error pages included, gets the security headers."""
        image = self.command in ("GET", "HEAD") and urlparse(self.path).path in ("/image", "/example")
        self.send_header("Content-Security-Policy", CSP_IMAGE if image else CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "same-origin")  # "no-referrer" would make browsers send Origin: null
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    @cached_property
    def url(self):
        return urlparse(self.path)

    @cached_property
    def query(self) -> dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(self.url.query).items()}

    # -- responses ------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj: object, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json", headers)

    def _image(self, path: Path) -> None:
        try:
            data, mime = image_bytes(path)
        except FileNotFoundError as exc:
            raise HTTPError(HTTPStatus.NOT_FOUND, str(exc)) from None
        except NotAnImageError as exc:
            raise HTTPError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, str(exc)) from None
        self._send(200, data, mime)

    # -- auth -----------------------------------------------------------------------------------
    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return auth[len("Bearer ") :].strip()
        try:
            cookie = SimpleCookie(self.headers.get("Cookie", ""))
        except CookieError:
            return None
        return cookie[COOKIE].value if COOKIE in cookie else None

    def _who(self) -> Annotator:
        try:
            return self.app.store.authenticate(self._token())
        except AuthError as exc:
            raise HTTPError(HTTPStatus.UNAUTHORIZED, str(exc)) from None

    # -- routing --------------------------------------------------------------------------------
    def _check_host(self) -> None:
        """Bound to loopback, answer only requests addressed to loopback (blocks DNS rebinding)."""
        if self.server.server_address[0] not in LOOPBACK:
            return
        host = self.headers.get("Host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name.strip("[]") not in LOOPBACK | {"localhost"}:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"this app serves only localhost, not Host {host!r}")

    def _check_origin(self) -> None:
        """A browser POST from another page (Origin not this server) is refused: no login CSRF, no forged verdicts."""
        origin = self.headers.get("Origin")
        if origin is not None and urlparse(origin).netloc != self.headers.get("Host", ""):
            raise HTTPError(HTTPStatus.FORBIDDEN, f"POST from origin {origin!r} refused; use the page this server serves")

    def _dispatch(self, routes: dict) -> None:
        try:
            self._check_host()
            handler = routes.get(self.url.path)
            if handler is None:
                others = self._GET if self.command == "POST" else self._POST
                if self.url.path in others:
                    raise HTTPError(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.url.path} does not take {self.command}")
                raise HTTPError(HTTPStatus.NOT_FOUND, f"no route {self.url.path}")
            handler(self)
        except HTTPError as exc:
            self._json({"error": str(exc)}, exc.status)
        except AuthError as exc:
            self._json({"error": str(exc)}, HTTPStatus.UNAUTHORIZED)
        except ProtocolError as exc:
            msg = str(exc)
            status = HTTPStatus.NOT_FOUND if msg.startswith("unknown image") else HTTPStatus.CONFLICT if "changed since" in msg else HTTPStatus.BAD_REQUEST
            self._json({"error": msg}, status)
        except (TimeoutError, ConnectionError):
            self.close_connection = True
        except Exception:  # a bug: answer, log the traceback once, keep serving
            log.exception("internal error on %s %s", self.command, self.url.path)
            self._json({"error": "internal error (logged on the server)"}, HTTPStatus.INTERNAL_SERVER_ERROR)

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._dispatch(self._GET)

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch(self._POST)

    # -- GET ------------------------------------------------------------------------------------
    def get_static(self) -> None:
        name, ctype = STATIC_FILES[self.url.path]
        self._send(200, (STATIC / name).read_bytes(), ctype)

    def get_me(self) -> None:
        who = self._who()
        self._json({"name": who.name, "role": who.role, "classes": self.app.class_names, "progress": self.app.store.progress()})

    def _stage(self) -> int:
        stage = self.query.get("stage", "1")
        if stage not in ("1", "3"):
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"stage must be 1 or 3, got {stage!r}")
        return int(stage)

    def get_queue(self) -> None:
        who = self._who()
        self._json({"stage": self._stage(), "items": self.app.store.queue(who.name, self._stage())})

    def get_item(self) -> None:
        who = self._who()
        self._json(self.app.item(who, self.query.get("image", "")))

    def get_image(self) -> None:
        self._who()
        image = self.query.get("image", "")
        if image not in self.app.paths:
            raise HTTPError(HTTPStatus.NOT_FOUND, f"unknown image id {image!r}")
        self._image(self.app.project.manifest.resolve(self.app.paths[image]))

    def get_example(self) -> None:
        self._who()
        try:
            paths = self.app.by_class[int(self.query.get("label", ""))]
            path = paths[int(self.query.get("k", "0"))]
        except (ValueError, KeyError, IndexError):
            raise HTTPError(HTTPStatus.NOT_FOUND, "no such example image") from None
        self._image(self.app.project.manifest.resolve(path))

    # -- POST -----------------------------------------------------------------------------------
    def _body(self, ctype: str) -> str:
        """The request body as text: declared length, bounded size, UTF-8, read within the time limit."""
        if not self.headers.get("Content-Type", "").startswith(ctype):
            raise HTTPError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"send the body as {ctype}")
        if "Transfer-Encoding" in self.headers:
            raise HTTPError(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length, not Transfer-Encoding")
        raw = self.headers.get("Content-Length")
        if raw is None or not raw.strip().isdigit():
            self.close_connection = True
            raise HTTPError(HTTPStatus.LENGTH_REQUIRED if raw is None else HTTPStatus.BAD_REQUEST, f"Content-Length must be a byte count, got {raw!r}")
        length = int(raw)
        if length > MAX_BODY:
            self.close_connection = True
            raise HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body must be at most {MAX_BODY} bytes, got {length}")
        deadline = time.monotonic() + self.timeout  # for the whole body, not per read (a trickle cannot hold a thread)
        data = b""
        try:
            while len(data) < length:
                self.connection.settimeout(max(deadline - time.monotonic(), 1e-3))
                chunk = self.rfile.read1(length - len(data))
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            self.close_connection = True
            raise HTTPError(HTTPStatus.REQUEST_TIMEOUT, f"request body not received within {self.timeout:g} s") from None
        finally:
            self.connection.settimeout(self.timeout)
        if len(data) < length:
            self.close_connection = True
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"request body ended after {len(data)} of {length} bytes")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"request body is not UTF-8: {exc}") from None

    def post_login(self) -> None:
        self._check_origin()
        token = parse_qs(self._body("application/x-www-form-urlencoded")).get("token", [""])[-1].strip()
        try:
            self.app.store.authenticate(token)
        except AuthError:
            self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": "/#login-failed"})
            return
        cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": "/", "Set-Cookie": cookie})

    def post_logout(self) -> None:
        self._check_origin()
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain",
                   {"Location": "/", "Set-Cookie": f"{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"})

    def post_verdict(self) -> None:
        self._check_origin()
        who = self._who()
        text = self._body("application/json")
        if json_depth(text) > MAX_DEPTH:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"request body is nested deeper than {MAX_DEPTH} levels")
        try:
            body = json.loads(text)
        except ValueError as exc:  # JSONDecodeError, and integers too long to convert
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"request body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "request body must be a JSON object")
        unknown = set(body) - set(FIELDS)
        if unknown:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"unknown field(s) {', '.join(sorted(unknown))}")
        missing = {"image", "stage", "verdict", "submission", "base"} - set(body)
        if missing:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"missing field(s) {', '.join(sorted(missing))}")
        wrong = [k for k, t in FIELDS.items() if k in body and not isinstance(body[k], t)]
        wrong += [k for k in ("stage", "id_class", "base") if isinstance(body.get(k), bool)]
        if wrong:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"field(s) of the wrong type: {', '.join(sorted(set(wrong)))}")
        if not SUBMISSION_ID.fullmatch(body["submission"]):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "submission must be 8-64 characters of A-Z a-z 0-9 _ -")
        row = self.app.store.submit(
            who.name, body["image"], body["stage"], body["verdict"], body.get("ood_label"), body.get("fine_grained", False),
            body.get("id_class"), body.get("note"), submission=body["submission"], base=body["base"],
        )
        self._json({"row": row, "image": body["image"]})

    _GET = dict.fromkeys(STATIC_FILES, get_static) | {
        "/api/me": get_me, "/api/queue": get_queue, "/api/item": get_item, "/image": get_image, "/example": get_example,
    }
    _POST = {"/login": post_login, "/logout": post_logout, "/api/verdict": post_verdict}


def bind_warning(host: str) -> str | None:
    """The warning for a bind address other than loopback (tokens and cookies travel as plain HTTP)."""
    try:
        if ipaddress.ip_address(host.strip("[]")).is_loopback:
            return None
    except ValueError:
        if host == "localhost":
            return None
    return (f"--host {host} serves beyond this machine over plain HTTP: access tokens and session cookies can be read "
            "on the network. Prefer the default 127.0.0.1 with an SSH tunnel for remote annotators (docs/construct.md)")


def make_server(work: str | Path, host: str = "127.0.0.1", port: int = 8765, examples: int = 4,
                request_timeout: float = 30.0) -> ThreadingHTTPServer:
    """A ready (not yet serving) threaded server for the work folder; port 0 picks a free port.

    IPv6 addresses (``::1``) work; a port in use or an address this machine lacks is a ValueError.
    request_timeout: seconds a connection may wait on each read before it is answered 408 / closed.
    """
    app = AnnotationApp(work, examples)
    handler = type("BoundHandler", (Handler,), {"app": app, "timeout": request_timeout})
    host = host.strip("[]")
    server_class = type("Server", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET,
                                                           "daemon_threads": True})
    try:
        return server_class((host, port), handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ValueError(f"port {port} on {host} is in use; pick another with --port (0 = any free port)") from None
        raise ValueError(f"cannot serve on {host} port {port}: {exc.strerror or exc}") from None
