"""The annotation web app (stdlib ``http.server``; one page + a small JSON API).

An annotator logs in once by POSTing the access token (the form on ``/``, which adds the page's
binding, see :mod:`.sessions`); the server answers with a random session id in an HttpOnly,
SameSite=Strict cookie (``__Host-oodeval_session``, Secure, when the page is on a loopback address,
which browsers treat as a secure context; ``oodeval_session`` on a plain-HTTP remote address) and
never puts the token in a cookie. API calls must carry the binding header ``X-Oodeval-Binding``
as well (scripts send ``Authorization: Bearer TOKEN`` instead); ``/image`` and ``/example`` take
the cookie alone (browsers load images without headers). POSTs from another origin are refused
(login CSRF). Routes:

``POST /login``, ``POST /logout``  form fields ``token``, ``binding``; sets / ends the session
``GET /api/me``                    who am I, class names, progress of every annotator
``GET /api/senses?label=L``        the WordNet noun senses of a label (wnid, lemmas, gloss)
``GET /api/queue?stage=1|3``       my queue (``done`` = my verdict given, ``status`` of the image)
``GET /api/item?image=ID``         the image's evidence, example-image URLs for the classes of (D)
                                   and (E), my verdicts, and in Stage 3 all verdicts and what differs
``POST /api/verdict``              JSON ``{image, stage, verdict, ood_label, fine_grained, id_class, note,
                                   submission, base}``; verdict ``withdrawn`` = undo (see ``.protocol``)
``GET /image?image=ID``            the candidate image; ``GET /example?label=C&k=J`` an ID example image

Every response carries a strict Content-Security-Policy (``sandbox`` on images), ``frame-ancestors
'none'`` and ``nosniff``; images are typed from their bytes (:func:`.evidence.image_bytes`), never
from their names (decoded ones cached, :class:`ImageCache`). Every request gets an answer: errors are
JSON ``{"error": ...}`` (400 bad input, text that is not valid Unicode (a lone surrogate escape, naming
the field) or malformed headers, 401 not logged in, 403 foreign origin, 404 unknown, 405, 408 request
too slow, 409 outdated, 411, 413, 415, 431 more than 100 headers or ``MAX_HEADER_BYTES`` of them) and
name no server path; bodies are bounded in size (``MAX_BODY``) and checked for nesting in linear time
before ``json.loads``; each request must arrive, headers and body, within one deadline measured on the
socket. The listen backlog (``LISTEN_BACKLOG``, capped by the kernel's ``somaxconn``) holds a burst of
connections while they are accepted, so annotators are served during one. Each
answered request is one INFO line on the ``oodeval.construct.access`` logger (client, annotator,
method, path without query, status); no header, body or query is logged. A client that
disconnects is one DEBUG line, not a traceback. The server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import errno
import io
import ipaddress
import json
import logging
import os
import re
import socket
import sys
import time
from collections import OrderedDict
from functools import cached_property
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Lock
from urllib.parse import parse_qs, quote, urlparse

from ..errors import InputError
from ..zeroshot.wordnet import noun_sense, noun_senses
from .candidates import Project, load_project
from .evidence import NotAnImageError, image_bytes, load_evidence
from .protocol import Annotator, AuthError, ProtocolError, open_store
from .rules import MAX_LABEL, check_text
from .sessions import SESSION_LIFETIME, Sessions

__all__ = ["AnnotationApp", "ImageCache", "make_server", "bind_warning", "parse_json_object"]

log = logging.getLogger(__name__)
access_log = logging.getLogger("oodeval.construct.access")

STATIC = Path(__file__).with_name("static")
STATIC_FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
                "/static/style.css": ("style.css", "text/css; charset=utf-8")}
COOKIE = "oodeval_session"  # on a plain-HTTP remote address
SECURE_COOKIE = "__Host-oodeval_session"  # on loopback (a secure context for browsers)
BINDING_HEADER = "X-Oodeval-Binding"
BINDING = re.compile(r"[A-Za-z0-9_-]{22,128}")
MAX_BODY = 64 * 1024
MAX_HEADER_BYTES = 64 * 1024  # the whole header block; http.server caps each line at 64 KiB and the count at 100
LISTEN_BACKLOG = 1024  # connections waiting to be accepted (socketserver's default of 5 overflowed under a burst of 200)
MAX_DEPTH = 2  # the verdict is a flat JSON object (a list in it is refused by type)
CONTENT_LENGTH = re.compile(r"[0-9]{1,12}")
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*+"?|[][{}]')  # a string (possessive: linear, an unterminated one too) or a bracket
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
CSP_IMAGE = "default-src 'none'; style-src 'unsafe-inline'; sandbox; frame-ancestors 'none'"
FIELDS = {"image": (str,), "stage": (int,), "verdict": (str,), "ood_label": (str, type(None)), "fine_grained": (bool,),
          "id_class": (int, type(None)), "note": (str, type(None)), "submission": (str,), "base": (int, type(None)),
          "ood_sense": (str, type(None))}
SUBMISSION_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")


class HTTPError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class ImageCache:
    """Served image bytes by file, kept while the file's size and mtime are unchanged; at most
    ``max_bytes`` in all (least recently used dropped first), so a re-encoded image is decoded once."""

    def __init__(self, max_bytes: int = 128 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[tuple[int, int], bytes, str]] = OrderedDict()
        self._size = 0
        self._lock = Lock()

    def get(self, path: Path) -> tuple[bytes, str]:
        """(bytes, MIME type) of :func:`.evidence.image_bytes`, from the cache when the file is unchanged."""
        key = str(path)
        file = path if "#" not in path.name else path.with_name(path.name.split("#", 1)[0])
        try:
            st = os.stat(file)
            stamp = (st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = None
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and hit[0] == stamp:
                self._items.move_to_end(key)
                return hit[1], hit[2]
        data, mime = image_bytes(path)
        if stamp is not None and len(data) <= self.max_bytes:
            with self._lock:
                old = self._items.pop(key, None)
                self._size += len(data) - (len(old[1]) if old else 0)
                self._items[key] = (stamp, data, mime)
                while self._size > self.max_bytes:
                    _, (_, dropped, _) = self._items.popitem(last=False)
                    self._size -= len(dropped)
        return data, mime


class AnnotationApp:
    """The state behind the server: the project, its store, sessions, example images per ID class."""

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
        self.sessions = Sessions()
        self.images = ImageCache()

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
        shown_senses = [v.get("ood_sense") for v in [view["my_stage1"] or {}, *view.get("stage1", []), *view.get("stage3", [])]]
        view["senses"] = {w: s for w in dict.fromkeys(filter(None, shown_senses)) if (s := self.sense(w)) is not None}
        return view

    def sense(self, wnid: str) -> dict | None:
        """``{wnid, lemmas, gloss}`` of a WordNet noun synset, None without WordNet or for no such synset."""
        if self.store.senses is None:
            return None

        s = noun_sense(wnid)
        return None if s is None else {"wnid": s.wnid, "lemmas": list(s.lemmas), "gloss": s.gloss}

    def senses(self, label: str) -> list[dict]:
        """The WordNet noun senses of ``label``, most frequent first ([] without WordNet)."""
        if self.store.senses is None or not label.strip():
            return []

        return [{"wnid": s.wnid, "lemmas": list(s.lemmas), "gloss": s.gloss} for s in noun_senses(label)]


def parse_json_object(text: str, max_depth: int = MAX_DEPTH) -> object:
    """``json.loads(text)`` after a linear-time check that brackets outside strings nest at most ``max_depth``.

    The check is one pass of a regular expression that matches a whole string literal (or an
    unterminated one, to the end) possessively, so no input makes it or the parser super-linear.
    ValueError for nesting deeper than ``max_depth`` or text that is not JSON.
    """
    depth = 0
    for m in _JSON_TOKENS.finditer(text):
        ch = m.group()
        if ch in "[{":
            depth += 1
            if depth > max_depth:
                raise InputError(f"request body is nested deeper than {max_depth} level{'s' if max_depth > 1 else ''}")
        elif ch in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, and integers too long to convert
        raise InputError(f"request body is not JSON: {exc}") from None


def _is_loopback(name: str) -> bool:
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class _DeadlineReader(io.RawIOBase):
    """The request socket read under one deadline for the whole request: each ``recv`` may wait only
    for the time left, so a trickle of bytes (headers or body) cannot hold a connection."""

    def __init__(self, sock: socket.socket, deadline: float, idle_timeout: float) -> None:
        self.sock, self.deadline, self.idle_timeout = sock, deadline, idle_timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request not received in time")
        self.sock.settimeout(left)
        try:
            return self.sock.recv_into(buf)
        finally:
            self.sock.settimeout(self.idle_timeout)  # writing the answer is not bound by the read deadline


class _HeaderBlockTooLarge(Exception):
    pass


class _BoundedLines:
    """The request's reader while http.server parses the headers: ``readline`` stops with
    :class:`_HeaderBlockTooLarge` once the header lines together exceed ``limit`` bytes."""

    def __init__(self, rfile, limit: int) -> None:
        self.rfile, self.left = rfile, limit

    def readline(self, size: int = -1) -> bytes:
        line = self.rfile.readline(size)
        self.left -= len(line)
        if self.left < 0:
            raise _HeaderBlockTooLarge
        return line


class Handler(BaseHTTPRequestHandler):
    server_version = "oodeval-construct"
    error_content_type = "application/json"
    error_message_format = '{"error": "%(code)d %(message)s"}'
    app: AnnotationApp  # set by make_server
    timeout = 30.0  # seconds for the whole request (request line, headers and body) to arrive
    who: str = "-"  # the authenticated annotator, for the access log

    def setup(self) -> None:
        super().setup()
        self.deadline = time.monotonic() + self.timeout  # HTTP/1.0: one request per connection
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self.deadline, self.timeout))

    def parse_request(self) -> bool:
        """http.server's parsing, with the header block bounded to ``MAX_HEADER_BYTES`` in all (431 beyond)."""
        rfile, self.rfile = self.rfile, _BoundedLines(self.rfile, MAX_HEADER_BYTES)
        try:
            return super().parse_request()
        except _HeaderBlockTooLarge:
            self.close_connection = True
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"Request headers over {MAX_HEADER_BYTES} bytes")
            return False
        finally:
            self.rfile = rfile

    def log_message(self, fmt: str, *args) -> None:
        """http.server's own messages (malformed requests): DEBUG, query strings cut (they may hold anything)."""
        log.debug("%s %s", self.client_address[0], re.sub(r"\?\S*", "?...", fmt % args))

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """The access log: client, annotator, method, path (no query), status. No header, cookie or body."""
        path = urlparse(getattr(self, "path", "") or "").path or "-"
        access_log.info("%s %s %s %s %s", self.client_address[0], self.who, getattr(self, "command", None) or "-", path,
                        getattr(code, "value", code))

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
            data, mime = self.app.images.get(path)
        except FileNotFoundError:
            raise HTTPError(HTTPStatus.NOT_FOUND, "the image file is missing or unreadable on the server") from None
        except NotAnImageError as exc:
            raise HTTPError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, str(exc)) from None
        self._send(200, data, mime)

    # -- auth -----------------------------------------------------------------------------------
    @cached_property
    def secure_origin(self) -> bool:
        """The page is on a loopback address: browsers treat it as a secure context (``__Host-`` cookies work)."""
        host = self.headers.get("Host", "")
        return _is_loopback(host.rsplit(":", 1)[0] if not host.endswith("]") else host)

    @property
    def cookie_name(self) -> str:
        return SECURE_COOKIE if self.secure_origin else COOKIE

    def _session_id(self) -> str | None:
        try:
            cookie = SimpleCookie(self.headers.get("Cookie", ""))
        except CookieError:
            return None
        return cookie[self.cookie_name].value if self.cookie_name in cookie else None

    def _who(self, image: bool = False) -> Annotator:
        """The annotator of a Bearer token, or of the session cookie (with the page's binding unless ``image``)."""
        auth = self.headers.get("Authorization", "")
        try:
            if auth.startswith("Bearer "):
                who = self.app.store.authenticate(auth[len("Bearer ") :].strip())
            else:
                sid = self._session_id()
                if sid is None:
                    raise AuthError("not logged in (no session cookie or access token)")
                session = self.app.sessions.get(sid, None if image else self.headers.get(BINDING_HEADER, ""))
                if session is None:
                    raise AuthError("no live session for this page (expired, logged out, or a cookie set by another site); log in again")
                if self.app.store.token_sha256(session.annotator) != session.token_sha256:
                    self.app.sessions.revoke(sid)
                    raise AuthError("the access token of this session was reissued; log in with the new token")
                who = self.app.store.annotator(session.annotator)
        except AuthError as exc:
            raise HTTPError(HTTPStatus.UNAUTHORIZED, str(exc)) from None
        self.who = who.name
        return who

    # -- routing --------------------------------------------------------------------------------
    def _check_host(self) -> None:
        """Bound to any loopback address, answer only requests addressed to loopback (blocks DNS rebinding)."""
        if not _is_loopback(self.server.server_address[0]):
            return
        if not self.secure_origin:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"this app serves only localhost, not Host {self.headers.get('Host', '')!r}")

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
            log.debug("client %s went away during %s %s", self.client_address[0], self.command, self.url.path)
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

    def get_senses(self) -> None:
        self._who()
        label = self.query.get("label", "")
        if len(label) > MAX_LABEL:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"a label has at most {MAX_LABEL} characters")
        self._json({"label": label, "wordnet": self.app.store.senses is not None, "senses": self.app.senses(label)})

    def get_queue(self) -> None:
        who = self._who()
        self._json({"stage": self._stage(), "items": self.app.store.queue(who.name, self._stage())})

    def get_item(self) -> None:
        who = self._who()
        self._json(self.app.item(who, self.query.get("image", "")))

    def get_image(self) -> None:
        self._who(image=True)
        image = self.query.get("image", "")
        if image not in self.app.paths:
            raise HTTPError(HTTPStatus.NOT_FOUND, f"unknown image id {image!r}")
        self._image(self.app.project.manifest.resolve(self.app.paths[image]))

    def get_example(self) -> None:
        self._who(image=True)
        try:
            paths = self.app.by_class[int(self.query.get("label", ""))]
            path = paths[int(self.query.get("k", "0"))]
        except (ValueError, KeyError, IndexError):
            raise HTTPError(HTTPStatus.NOT_FOUND, "no such example image") from None
        self._image(self.app.project.manifest.resolve(path))

    # -- POST -----------------------------------------------------------------------------------
    def _body(self, ctype: str) -> str:
        """The request body as text: declared length, bounded size, UTF-8, read before the request's deadline."""
        if not self.headers.get("Content-Type", "").startswith(ctype):
            raise HTTPError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"send the body as {ctype}")
        if "Transfer-Encoding" in self.headers:
            raise HTTPError(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length, not Transfer-Encoding")
        raw = self.headers.get("Content-Length")
        if raw is None or not CONTENT_LENGTH.fullmatch(raw.strip()):
            self.close_connection = True
            raise HTTPError(HTTPStatus.LENGTH_REQUIRED if raw is None else HTTPStatus.BAD_REQUEST, f"Content-Length must be a byte count, got {raw!r}")
        length = int(raw)
        if length > MAX_BODY:
            self.close_connection = True
            raise HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body must be at most {MAX_BODY} bytes, got {length}")
        try:
            data = self.rfile.read(length)  # under the request's deadline (:class:`_DeadlineReader`)
        except TimeoutError:
            self.close_connection = True
            raise HTTPError(HTTPStatus.REQUEST_TIMEOUT, f"request not received within {self.timeout:g} s") from None
        if len(data) < length:
            self.close_connection = True
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"request body ended after {len(data)} of {length} bytes")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"request body is not UTF-8: {exc}") from None

    def _cookie(self, value: str, max_age: int) -> str:
        return f"{self.cookie_name}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict" + ("; Secure" if self.secure_origin else "")

    def post_login(self) -> None:
        self._check_origin()
        form = parse_qs(self._body("application/x-www-form-urlencoded"))
        token, binding = form.get("token", [""])[-1].strip(), form.get("binding", [""])[-1]
        if not BINDING.fullmatch(binding):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "log in from the page this server serves (its form carries the page's binding)")
        try:
            who = self.app.store.authenticate(token)
        except AuthError:
            self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": "/#login-failed"})
            return
        self.who = who.name
        sid = self.app.sessions.create(who.name, self.app.store.token_sha256(who.name), binding)
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": "/", "Set-Cookie": self._cookie(sid, int(SESSION_LIFETIME))})

    def post_logout(self) -> None:
        self._check_origin()
        self.app.sessions.revoke(self._session_id())
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": "/", "Set-Cookie": self._cookie("", 0)})

    def post_verdict(self) -> None:
        self._check_origin()
        who = self._who()
        try:
            body = parse_json_object(self._body("application/json"))
        except ValueError as exc:
            raise HTTPError(HTTPStatus.BAD_REQUEST, str(exc)) from None
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
        try:
            check_text(**body)
        except InputError as exc:
            raise HTTPError(HTTPStatus.BAD_REQUEST, str(exc)) from None
        if not SUBMISSION_ID.fullmatch(body["submission"]):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "submission must be 8-64 characters of A-Z a-z 0-9 _ -")
        row = self.app.store.submit(
            who.name, body["image"], body["stage"], body["verdict"], body.get("ood_label"), body.get("fine_grained", False),
            body.get("id_class"), body.get("note"), submission=body["submission"], base=body["base"], ood_sense=body.get("ood_sense"),
        )
        self._json({"row": row, "image": body["image"]})

    _GET = dict.fromkeys(STATIC_FILES, get_static) | {
        "/api/me": get_me, "/api/senses": get_senses, "/api/queue": get_queue, "/api/item": get_item, "/image": get_image, "/example": get_example,
    }
    _POST = {"/login": post_login, "/logout": post_logout, "/api/verdict": post_verdict}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def handle_error(self, request, client_address) -> None:
        """A client that went away is one DEBUG line; anything else is logged with its traceback (not printed raw)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("client %s went away: %s", client_address[0], type(exc).__name__)
        else:
            log.error("internal error serving %s", client_address[0], exc_info=exc)


def bind_warning(host: str) -> str | None:
    """The warning for a bind address other than 127.0.0.1, ``::1`` or ``localhost``: beyond loopback tokens
    and session cookies travel as plain HTTP; another loopback address works but is easy to mistype."""
    if host.strip("[]") in ("127.0.0.1", "::1", "localhost"):
        return None
    if _is_loopback(host):
        return (f"--host {host} is a loopback address other than the default 127.0.0.1: open the page (and point SSH tunnels) at "
                f"http://{host}:PORT/ exactly; the app answers only requests naming a loopback address or localhost")
    return (f"--host {host} serves beyond this machine over plain HTTP: access tokens and session cookies can be read "
            "on the network. Prefer the default 127.0.0.1 with an SSH tunnel for remote annotators (docs/construct.md)")


def make_server(work: str | Path, host: str = "127.0.0.1", port: int = 8765, examples: int = 4,
                request_timeout: float = 30.0) -> ThreadingHTTPServer:
    """A ready (not yet serving) threaded server for the work folder; port 0 picks a free port.

    IPv6 addresses (``::1``) work; a port in use or an address this machine lacks is a ValueError.
    request_timeout: seconds for a whole request (request line, headers and body) to arrive; a body
    late is answered 408, headers late close the connection.
    """
    app = AnnotationApp(work, examples)
    handler = type("BoundHandler", (Handler,), {"app": app, "timeout": request_timeout})
    host = host.strip("[]")
    server_class = type("Server", (_Server,), {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
    try:
        return server_class((host, port), handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise InputError(f"port {port} on {host} is in use; pick another with --port (0 = any free port)") from None
        raise InputError(f"cannot serve on {host} port {port}: {exc.strerror or exc}") from None
