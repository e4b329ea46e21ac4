"""A client for any OpenAI-compatible chat-completions endpoint, with an on-disk replay cache.

Every raw response is stored as JSON under ``cache_dir``, keyed by a hash of (endpoint, model,
messages, parameters), so a later run replays offline and two endpoints serving a model of the same
name never answer for each other. The API key is read from an environment variable
and never logged or cached. Transient failures (HTTP 429 / 5xx, connection errors) are retried
with exponential backoff.

Written over the standard library (``urllib.request``) rather than the ``openai`` SDK, which
would add two packages and a much slower import (figures in docs/performance.md, "Measurements
moved out of docstrings"), while the part this module exists for, the replay cache and offline mode that make vocabularies and evidence reproducible,
would still be ours: we send one request shape (chat completions) and read one field.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit
from pathlib import Path

from ._io import hash_json, write_json_atomic
from .errors import InputError, OodevalError

__all__ = ["ChatClient", "LLMError"]

log = logging.getLogger(__name__)


class LLMError(OodevalError, RuntimeError):
    """The endpoint failed or answered with something that is not a chat completion."""


class ChatClient:
    """``ChatClient(base_url, model).complete(messages) -> str``.

    base_url: e.g. ``https://api.openai.com/v1`` (``/chat/completions`` is appended).
    api_key_env: name of the environment variable holding the key (may be unset for local servers).
    cache_dir: where raw responses are kept; ``offline=True`` answers only from the cache.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        cache_dir: str | Path | None = None,
        max_retries: int = 5,
        backoff: float = 1.0,
        timeout: float = 120.0,
        offline: bool = False,
    ) -> None:
        try:
            url = urlsplit(base_url)
            url.port  # noqa: B018 - a port that is not a number raises here
        except ValueError as exc:
            raise InputError(f"LLM endpoint {base_url!r} is not a URL: {exc}") from None
        if url.scheme not in ("http", "https") or not url.hostname:
            raise InputError(f"LLM endpoint {base_url!r} must be an http:// or https:// URL with a host, e.g. https://api.openai.com/v1")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.max_retries = max_retries
        self.backoff = backoff
        self.timeout = timeout
        self.offline = offline

    def __repr__(self) -> str:  # never shows the key
        return f"ChatClient(base_url={self.base_url!r}, model={self.model!r}, key from ${self.api_key_env})"

    def _cache_file(self, payload: dict) -> Path | None:
        return self.cache_dir / f"{hash_json({'endpoint': self.base_url, **payload})}.json" if self.cache_dir else None

    def request(self, messages: list[dict], **params) -> dict:
        """The raw JSON response for ``messages`` (from the cache when present)."""
        payload = {"model": self.model, "messages": messages, **params}
        cache = self._cache_file(payload)
        if cache is not None and cache.is_file():
            return json.loads(cache.read_text())["response"]
        if self.offline:
            raise LLMError(f"offline and no cached response for this prompt in {self.cache_dir}")
        response = self._post(payload)
        if cache is not None:
            write_json_atomic(cache, {"request": payload, "response": response})
        return response

    def complete(self, messages: list[dict] | str, **params) -> str:
        """The text of the first choice. A plain string is sent as one user message."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        response = self.request(messages, **params)
        try:
            return response["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise LLMError(f"response has no choices[0].message.content: {str(response)[:200]}") from exc

    def _post(self, payload: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        body = json.dumps(payload).encode()
        url = f"{self.base_url}/chat/completions"
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            try:
                req = urllib.request.Request(url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read().decode())
            except urllib.error.HTTPError as exc:
                if exc.code != 429 and exc.code < 500:
                    raise LLMError(f"{url} answered HTTP {exc.code}: {exc.read()[:200]!r}") from exc
                last = exc
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                last = exc
            except json.JSONDecodeError as exc:
                raise LLMError(f"{url} answered with invalid JSON") from exc
            if attempt < self.max_retries:
                delay = self.backoff * 2**attempt
                log.warning("LLM request failed (%s); retry %d in %.1fs", last, attempt + 1, delay)
                time.sleep(delay)
        raise LLMError(f"{url} failed after {self.max_retries + 1} attempts: {last}")
