"""The annotation web app (stdlib ``http.server``; one page + a small JSON API).

Each annotator opens ``/login?token=TOKEN`` once; the token is kept in an HttpOnly cookie
(scripts may send ``Authorization: Bearer TOKEN`` instead). Routes:

``GET /api/me``                  who am I, class names, progress of every annotator
``GET /api/queue?stage=1|3``     my queue (Stage 1: every image, ``done`` = my verdict given)
``GET /api/item?image=ID``       the image's evidence, example-image URLs for the classes of (D)
                                 and (E), my Stage-1 verdict, and in Stage 3 all verdicts
``POST /api/verdict``            JSON ``{image, stage, verdict, ood_label, fine_grained, id_class, note}``
``GET /image?image=ID``          the candidate image; ``GET /example?label=C&k=J`` an ID example image

Errors are JSON ``{"error": ...}`` with 400 (bad input), 401 (token), 404 (unknown image).
The server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import logging
import mimetypes
from functools import cached_property
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlparse

from .candidates import Project, load_project
from .evidence import image_bytes, load_evidence
from .protocol import Annotator, AuthError, ProtocolError, ProtocolStore

__all__ = ["AnnotationApp", "make_server"]

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
STATIC_FILES = {"/": "index.html", "/static/app.js": "app.js", "/static/style.css": "style.css"}
COOKIE = "oodeval_token"
MAX_BODY = 64 * 1024
LOOPBACK = {"127.0.0.1", "::1"}


class HTTPError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class AnnotationApp:
    """The state behind the server: the project, its store, and example images per ID class."""

    def __init__(self, work: str | Path, examples: int = 4) -> None:
        self.project: Project = load_project(work)
        self.store = ProtocolStore(self.project.db_path)
        n = self.project.n_classes or (max(self.project.manifest.labels) + 1)
        self.class_names = [self.project.class_name(i) for i in range(n)]
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


class Handler(BaseHTTPRequestHandler):
    server_version = "oodeval-construct"
    app: AnnotationApp  # set by make_server

    def log_message(self, fmt: str, *args) -> None:  # route access logs to logging
        log.debug("%s " + fmt, self.address_string(), *args)

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
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj: object, status: int = 200) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _file(self, path: Path) -> None:
        if not path.is_file():
            raise HTTPError(HTTPStatus.NOT_FOUND, f"file {path.name} is missing on the server")
        self._send(200, path.read_bytes(), mimetypes.guess_type(path.name)[0] or "application/octet-stream")

    def _image(self, path: Path) -> None:
        try:
            data, mime = image_bytes(path)
        except FileNotFoundError as exc:
            raise HTTPError(HTTPStatus.NOT_FOUND, str(exc)) from None
        self._send(200, data, mime)

    # -- auth -----------------------------------------------------------------------------------
    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return auth[len("Bearer ") :].strip()
        cookie = SimpleCookie(self.headers.get("Cookie", ""))
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

    def _dispatch(self, routes: dict) -> None:
        try:
            self._check_host()
            handler = routes.get(self.url.path)
            if handler is None:
                raise HTTPError(HTTPStatus.NOT_FOUND, f"no route {self.url.path}")
            handler()
        except HTTPError as exc:
            self._json({"error": str(exc)}, exc.status)
        except AuthError as exc:
            self._json({"error": str(exc)}, HTTPStatus.UNAUTHORIZED)
        except ProtocolError as exc:
            status = HTTPStatus.NOT_FOUND if str(exc).startswith("unknown image") else HTTPStatus.BAD_REQUEST
            self._json({"error": str(exc)}, status)

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        routes = {p: (lambda name=name: self._file(STATIC / name)) for p, name in STATIC_FILES.items()}
        routes.update({
            "/login": self.get_login, "/logout": self.get_logout, "/api/me": self.get_me,
            "/api/queue": self.get_queue, "/api/item": self.get_item,
            "/image": self.get_image, "/example": self.get_example,
        })
        self._dispatch(routes)

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch({"/api/verdict": self.post_verdict})

    # -- GET ------------------------------------------------------------------------------------
    def get_login(self) -> None:
        token = self.query.get("token", "")
        try:
            self.app.store.authenticate(token)
        except AuthError as exc:
            raise HTTPError(HTTPStatus.UNAUTHORIZED, f"{exc}; use the link printed by `oodeval construct init`") from None
        cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": "/", "Set-Cookie": cookie})

    def get_logout(self) -> None:
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": "/", "Set-Cookie": f"{COOKIE}=; Path=/; Max-Age=0"})

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
    def post_verdict(self) -> None:
        who = self._who()
        if not self.headers.get("Content-Type", "").startswith("application/json"):
            raise HTTPError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send the verdict as application/json")
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"request body must be 1..{MAX_BODY} bytes, got {length}")
        try:
            body = json.loads(self.rfile.read(length))
        except json.JSONDecodeError as exc:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"request body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "request body must be a JSON object")
        unknown = set(body) - {"image", "stage", "verdict", "ood_label", "fine_grained", "id_class", "note"}
        if unknown:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"unknown field(s) {', '.join(sorted(unknown))}")
        types = {"image": (str,), "stage": (int,), "verdict": (str,), "ood_label": (str, type(None)),
                 "fine_grained": (bool,), "id_class": (int, type(None)), "note": (str, type(None))}
        wrong = [k for k, t in types.items() if k in body and not isinstance(body[k], t)]
        wrong += [k for k in ("stage", "id_class") if isinstance(body.get(k), bool)]
        if wrong:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"field(s) of the wrong type: {', '.join(sorted(set(wrong)))}")
        row = self.app.store.submit(
            who.name, body.get("image", ""), body.get("stage", 1), body.get("verdict", ""),
            body.get("ood_label"), body.get("fine_grained", False), body.get("id_class"), body.get("note"),
        )
        self._json({"row": row, "image": body.get("image")})


def make_server(work: str | Path, host: str = "127.0.0.1", port: int = 8765, examples: int = 4) -> ThreadingHTTPServer:
    """A ready (not yet serving) threaded server for the work folder; port 0 picks a free port."""
    app = AnnotationApp(work, examples)
    handler = type("BoundHandler", (Handler,), {"app": app})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server
