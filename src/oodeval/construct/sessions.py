"""Login sessions of the annotation app: random ids, held in the server's memory, never the access token.

A login with the access token creates a session: a random id (256 bits, the cookie's only content)
bound to the annotator, to the SHA-256 of the token it was made with (a ``token reissue`` voids it,
also from another process) and to the browser's *binding*: a random value the page keeps in its
origin's ``localStorage`` and sends as a header. Another origin (a server on another 127.0.0.1
port, which receives and can set this host's cookies) can neither read nor set that value, so a
session cookie it plants or steals does not authenticate API calls. Sessions expire
``SESSION_LIFETIME`` seconds after login, end at logout, and at a server restart. At most
``MAX_SESSIONS`` are kept per annotator (the oldest goes first).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from threading import Lock

__all__ = ["Session", "Sessions", "SESSION_LIFETIME", "MAX_SESSIONS"]

SESSION_LIFETIME = 12 * 3600.0
MAX_SESSIONS = 16


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Session:
    annotator: str
    token_sha256: str  # of the access token the login used
    binding_sha256: str
    expires: float  # time.monotonic() deadline


class Sessions:
    """The server's sessions, keyed by the SHA-256 of their id; safe to share between threads."""

    def __init__(self, lifetime: float = SESSION_LIFETIME, per_annotator: int = MAX_SESSIONS) -> None:
        self.lifetime = lifetime
        self.per_annotator = per_annotator
        self._by_id: dict[str, Session] = {}
        self._lock = Lock()

    def create(self, annotator: str, token_sha256: str, binding: str) -> str:
        """A new session for ``annotator``; returns its id (give it only to that browser)."""
        sid = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            self._by_id = {k: s for k, s in self._by_id.items() if s.expires > now}
            mine = [k for k, s in self._by_id.items() if s.annotator == annotator]
            for k in mine[: max(len(mine) - self.per_annotator + 1, 0)]:  # insertion order: oldest first
                del self._by_id[k]
            self._by_id[_sha(sid)] = Session(annotator, token_sha256, _sha(binding), now + self.lifetime)
        return sid

    def get(self, sid: str | None, binding: str | None) -> Session | None:
        """The live session ``sid`` when ``binding`` is the one it was made with, else None.

        binding None: the binding is not checked (image requests, which browsers send without headers).
        """
        if not sid:
            return None
        with self._lock:
            session = self._by_id.get(_sha(sid))
        if session is None or session.expires <= time.monotonic():
            return None
        if binding is not None and not secrets.compare_digest(session.binding_sha256, _sha(binding)):
            return None
        return session

    def revoke(self, sid: str | None) -> None:
        if sid:
            with self._lock:
                self._by_id.pop(_sha(sid), None)
