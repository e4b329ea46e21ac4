"""The annotation app under a hostile annotator or a hostile local service: bounded request cost, a
whole-request deadline, malformed headers, sessions that are not the token, logs without secrets."""

import io
import json
import logging
import os
import selectors
import socket
import struct
import sys
import threading
import time
import urllib.parse

import pytest
from PIL import Image

import oodeval.construct.app as app_module
from oodeval.construct.app import bind_warning
from oodeval.construct.protocol import ProtocolError, ProtocolStore
from oodeval.errors import InputError
from test_construct_app import call, make_project, raw_exchange, request, start, verdict

BINDING_A, BINDING_B = "a" * 32, "b" * 32


@pytest.fixture
def served(tmp_path):
    project, store, tokens = make_project(tmp_path)
    server, base = start(project, request_timeout=1.0)
    yield base, store, tokens, project, server
    server.shutdown()
    server.server_close()


def login(base, token, binding):
    """The Set-Cookie of a login from the page (its Origin, its binding) and the session cookie pair."""
    form = urllib.parse.urlencode({"token": token, "binding": binding}).encode()
    status, headers, _ = request(base, "/login", body=form, ctype="application/x-www-form-urlencoded", headers={"Origin": base})
    assert status == 303 and headers["Location"] == "/"
    set_cookie = headers["Set-Cookie"]
    return set_cookie, set_cookie.split(";")[0]


def me(base, cookie, binding):
    status, _, payload = request(base, "/api/me", headers={"Cookie": cookie, "X-Oodeval-Binding": binding})
    return status, json.loads(payload)


def post_raw(base, token, body: bytes):
    head = (f"POST /api/verdict HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return raw_exchange(base, head + body)


HOSTILE = [
    b'{"image": "' + b'\\"' * (32 * 1024 - 6),  # one unterminated string of escaped quotes: > 10 s of CPU in the old nesting check
    b'{"image": "' + b"a" * (64 * 1024 - 11),
    b'{"image": "' + b"\\\\" * (32 * 1024 - 6),  # escapes, unterminated
    b'["' * (32 * 1024),  # a bracket and a quote, repeated
    b"[" * (64 * 1024),  # deep nesting
    b"[]" * (32 * 1024),  # flat but long
]


def test_hostile_bodies_cost_little_cpu_while_another_annotator_is_served(served):
    base, store, tokens, project, _ = served
    images = [c.image for c in project.candidates]

    def cpu(fn):
        t = time.process_time()  # all threads of this process: the server's and the client's
        fn()
        return time.process_time() - t

    def normal():
        for image in images[:5]:
            assert call(base, "/api/verdict", tokens["alice"], verdict(image, verdict="ambiguous"))[0] == 200

    def hostile():
        for body in HOSTILE:
            assert len(body) <= 64 * 1024
            answer = post_raw(base, tokens["alice"], body)
            assert answer.startswith(b"HTTP/1.0 400"), answer[:200]

    normal_cpu, hostile_cpu = cpu(normal), cpu(hostile)
    # five hostile requests against five ordinary submissions (each a SQLite transaction): the old
    # quadratic check took > 10 s of CPU for the first body alone
    assert hostile_cpu < 1.0 and hostile_cpu < 20 * normal_cpu + 0.05, (hostile_cpu, normal_cpu)
    answers = []
    attack = threading.Thread(target=lambda: [answers.append(post_raw(base, tokens["alice"], b)) for b in HOSTILE * 2])
    attack.start()
    served_meanwhile = [me_bearer[0] for me_bearer in (call(base, "/api/me", tokens["bob"]) for _ in range(5))]
    attack.join()
    assert served_meanwhile == [200] * 5 and all(a.startswith(b"HTTP/1.0 400") for a in answers)
    assert len(store.rows()) == 5


def test_malformed_content_length_is_400_without_a_traceback(served, caplog):
    base, store, tokens, _, _ = served
    head = (f"POST /api/verdict HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {tokens['bob']}\r\n"
            "Content-Type: application/json\r\nContent-Length: ").encode()
    for value in [b"\xb2", "\u0663".encode(), b"1e3", b"-1", b"0x10", b" 12 34", b"9" * 20]:  # \xb2 is "²": str.isdigit() said yes
        with caplog.at_level(logging.DEBUG):
            answer = raw_exchange(base, head + value + b"\r\n\r\n{}")
        assert answer.startswith(b"HTTP/1.0 400") and b"Content-Length must be a byte count" in answer, (value, answer[:200])
    answer = raw_exchange(base, head + b"9" * 12 + b"\r\n\r\n{}")
    assert answer.startswith(b"HTTP/1.0 413")
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert store.rows() == []


def test_the_deadline_covers_the_headers(served):
    base, _, _, _, _ = served
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /api/me HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sent = 0
        try:
            for sent in range(1, 31):  # one header line each 0.3 s: every read gets bytes well within 1 s
                time.sleep(0.3)
                s.sendall(f"X-Trickle-{sent}: x\r\n".encode())
                s.settimeout(0.01)
                try:
                    if s.recv(1) == b"":
                        break
                except TimeoutError:
                    pass
                s.settimeout(10)
        except (BrokenPipeError, ConnectionResetError):
            pass
    # a per-read limit would keep it open for all 30 lines (9 s); the 1 s deadline closes it after about 3
    assert sent < 15, sent


def test_sessions_are_random_ids_bound_to_the_page_never_the_token(served):
    base, store, tokens, project, _ = served
    set_cookie, alice = login(base, tokens["alice"], BINDING_A)
    assert tokens["alice"] not in set_cookie and set_cookie.startswith("__Host-oodeval_session=")
    assert all(a in set_cookie for a in ("Secure", "HttpOnly", "SameSite=Strict", "Path=/", "Max-Age="))
    assert "Domain" not in set_cookie  # a __Host- cookie must have none
    assert me(base, alice, BINDING_A) == (200, me(base, alice, BINDING_A)[1]) and me(base, alice, BINDING_A)[1]["name"] == "alice"
    # the token is no session: as a cookie value it logs nobody in
    assert me(base, f"__Host-oodeval_session={tokens['alice']}", BINDING_A)[0] == 401
    # a cookie another origin (a server on another 127.0.0.1 port) sets cannot switch alice to bob:
    # bob's session is bound to bob's page, and alice's page sends her binding
    _, bob = login(base, tokens["bob"], BINDING_B)
    status, err = me(base, bob, BINDING_A)
    assert status == 401 and "log in again" in err["error"]
    body = verdict(project.candidates[0].image, verdict="ambiguous")
    status, _, _ = request(base, "/api/verdict", body=body, headers={"Cookie": bob, "X-Oodeval-Binding": BINDING_A, "Origin": base})
    assert status == 401 and store.rows() == []
    # a stolen cookie alone (no binding: another origin cannot read localStorage) reaches no API
    assert me(base, alice, "")[0] == 401
    status, _, _ = request(base, "/api/verdict", body=body, headers={"Cookie": alice, "Origin": base})
    assert status == 401 and store.rows() == []
    # logout revokes the session on the server, not only in the browser
    status, headers, _ = request(base, "/logout", body=b"", ctype="application/x-www-form-urlencoded",
                                 headers={"Cookie": alice, "Origin": base})
    assert status == 303 and "Max-Age=0" in headers["Set-Cookie"] and tokens["alice"] not in headers["Set-Cookie"]
    assert me(base, alice, BINDING_A)[0] == 401
    # reissuing bob's token (another process: a second store object) voids his sessions
    assert me(base, bob, BINDING_B)[0] == 200
    new = ProtocolStore(store.path).reissue("bob")
    status, err = me(base, bob, BINDING_B)
    assert status == 401 and "reissued" in err["error"]
    assert call(base, "/api/me", new)[1]["name"] == "bob"  # scripts: the Bearer token
    # a login without the page's binding (a bare form or a script) makes no session
    form = urllib.parse.urlencode({"token": new}).encode()
    status, headers, _ = request(base, "/login", body=form, ctype="application/x-www-form-urlencoded", headers={"Origin": base})
    assert status == 400 and "Set-Cookie" not in headers


def test_every_loopback_address_checks_host_and_other_binds_warn(tmp_path):
    project, _, tokens = make_project(tmp_path)
    server, base = start(project, host="127.0.0.2")
    try:
        _, headers, payload = request(base, "/api/me", tokens["bob"], headers={"Host": "evil.example"})
        assert "serves only localhost" in json.loads(payload)["error"]  # DNS rebinding
        assert call(base, "/api/me", tokens["bob"])[1]["name"] == "bob"
    finally:
        server.shutdown()
        server.server_close()
    assert "loopback address other than the default 127.0.0.1" in bind_warning("127.0.0.2")
    assert bind_warning("127.0.0.1") is None and "plain HTTP" in bind_warning("0.0.0.0")


def test_access_log_has_no_secrets_and_disconnects_leave_no_traceback(served, caplog, capsys):
    base, _, tokens, _, server = served
    with caplog.at_level(logging.DEBUG):
        set_cookie, alice = login(base, tokens["alice"], BINDING_A)
        me(base, alice, BINDING_A)
        call(base, "/api/me", tokens["bob"])
        request(base, f"/login?token={tokens['carol']}")  # a token in a query string (refused, 405)
        raw_exchange(base, f"GET /?token={tokens['carol']} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        raw_exchange(base, f"BREW /?token={tokens['carol']} HTTP/1.1\r\n\r\n".encode())  # http.server's own error path
        try:
            raise BrokenPipeError(32, "Broken pipe")
        except BrokenPipeError:
            server.handle_error(None, ("127.0.0.1", 1))  # what socketserver calls when a client went away
    access = [r.getMessage() for r in caplog.records if r.name == "oodeval.construct.access"]
    assert len(access) >= 6 and any(" alice POST /login 303" in a for a in access) and any(" bob GET /api/me 200" in a for a in access)
    secrets = [*tokens.values(), alice.split("=", 1)[1], BINDING_A]
    text = "\n".join(r.getMessage() for r in caplog.records) + capsys.readouterr().err
    assert not [s for s in secrets if s in text]
    assert "Traceback" not in text and not [r for r in caplog.records if r.exc_info]


def test_errors_name_no_server_path_and_decoded_images_are_cached(served, monkeypatch):
    base, _, tokens, project, _ = served
    cand = project.candidates[0]
    path = project.manifest.resolve(cand.path)
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(buf, format="TIFF")  # not served as is: re-encoded as PNG
    path.write_bytes(buf.getvalue())
    calls = []
    real = app_module.image_bytes
    monkeypatch.setattr(app_module, "image_bytes", lambda p: calls.append(p) or real(p))
    url = f"/image?image={urllib.parse.quote(cand.image)}"
    answers = [request(base, url, tokens["bob"]) for _ in range(3)]
    assert [a[0] for a in answers] == [200] * 3 and answers[0][1]["Content-Type"] == "image/png" and len(calls) == 1
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # a changed file is decoded again
    assert request(base, url, tokens["bob"])[0] == 200 and len(calls) == 2
    big = io.BytesIO()
    Image.new("1", (8000, 6000)).save(big, format="TIFF", compression="group4")  # 48 MP in a few kB
    path.write_bytes(big.getvalue())
    status, _, payload = request(base, url, tokens["bob"])
    assert status == 415 and "more than the 40,000,000" in json.loads(payload)["error"]
    path.unlink()
    status, _, payload = request(base, url, tokens["bob"])
    assert status == 404 and str(project.folder.parent) not in payload.decode() and "/" not in json.loads(payload)["error"]


def test_notes_and_revisions_are_bounded(served):
    base, store, tokens, project, _ = served
    image = project.candidates[1].image
    status, err = call(base, "/api/verdict", tokens["alice"], verdict(image, verdict="ambiguous", note="x" * 1001))
    assert status == 400 and "at most 1000 characters" in err["error"]
    base_row = None
    for k in range(20):
        status, res = call(base, "/api/verdict", tokens["alice"], {**verdict(image, verdict="ambiguous", note=f"{k}"), "base": base_row})
        assert status == 200
        base_row = res["row"]
    status, err = call(base, "/api/verdict", tokens["alice"], {**verdict(image, verdict="ambiguous"), "base": base_row})
    assert status == 400 and "20 Stage-1 submissions" in err["error"]
    assert len(store.rows()) == 20


def test_sessions_expire_and_are_bounded_per_annotator():
    from oodeval.construct.sessions import Sessions

    expired = Sessions(lifetime=-1.0)  # already past its lifetime when made
    assert expired.get(expired.create("alice", "h", BINDING_A), BINDING_A) is None
    sessions = Sessions(per_annotator=3)
    ids = [sessions.create("alice", "h", BINDING_A) for _ in range(5)]
    other = sessions.create("bob", "h", BINDING_B)
    assert [sessions.get(i, BINDING_A) is not None for i in ids] == [False, False, True, True, True]  # the oldest went
    assert sessions.get(other, BINDING_B).annotator == "bob" and sessions.get(other, BINDING_A) is None
    assert sessions.get(other, None) is not None  # images: no binding checked
    assert len(set(ids)) == 5 and all(len(i) >= 43 for i in ids)  # 256 random bits each


def _listen_backlog(sock: socket.socket) -> int | None:
    """The kernel's accept-queue limit of a listening socket (Linux: ``tcpi_sacked`` of TCP_INFO), None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return struct.unpack_from("I", info, 28)[0]  # 8 one-byte fields, then rto, ato, snd_mss, rcv_mss, unacked, sacked


def _burst(base: str, token: str, n: int, bound: float) -> dict[int, float]:
    """Open ``n`` connections to 127.0.0.1 at once, each sending one annotator request; return
    connection -> seconds until its whole answer arrived (those not answered within ``bound`` absent)."""
    port = int(base.rsplit(":", 1)[1])
    request = f"GET /api/me HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    sel = selectors.DefaultSelector()
    t0 = time.monotonic()
    socks = []
    for k in range(n):  # every connect issued before any answer is read
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
        sel.register(s, selectors.EVENT_WRITE, (k, bytearray()))
    done: dict[int, float] = {}
    try:
        while len(done) < n and time.monotonic() - t0 < bound:
            for key, events in sel.select(timeout=0.5):
                k, got = key.data
                s = key.fileobj
                if events & selectors.EVENT_WRITE:
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                        s.sendall(request)
                        sel.modify(s, selectors.EVENT_READ, key.data)
                    continue
                try:
                    chunk = s.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except ConnectionError:
                    chunk = b""
                got += chunk
                if not chunk:  # HTTP/1.0 answer: the server closes after it
                    sel.unregister(s)
                    if got.startswith(b"HTTP/1.0 200"):
                        done[k] = time.monotonic() - t0
    finally:
        sel.close()
        for s in socks:
            s.close()
    return done


def test_annotators_are_served_during_a_burst_of_connections(tmp_path):
    project, _, tokens = make_project(tmp_path)
    server, base = start(project)  # the default 30 s request deadline: 200 threads on a loaded machine may wait their turn
    try:
        _check_burst(server, base, tokens)
    finally:
        server.shutdown()
        server.server_close()


def _check_burst(server, base, tokens) -> None:
    backlog = _listen_backlog(server.socket)
    if backlog is not None:  # the kernel caps the backlog at net.core.somaxconn
        somaxconn = int(open("/proc/sys/net/core/somaxconn").read())
        assert backlog == min(app_module.LISTEN_BACKLOG, somaxconn) and backlog >= 200, backlog
    assert server.request_queue_size == app_module.LISTEN_BACKLOG >= 200
    # 200 connections at once, each an annotator's request: with socketserver's backlog of 5 the
    # accept queue overflowed and a quarter had no answer after 70 s (SYN retries back off to 64 s)
    answered = _burst(base, tokens["alice"], 200, bound=40.0)
    assert len(answered) == 200, f"{200 - len(answered)} of 200 requests unanswered within 40 s"
    assert call(base, "/api/me", tokens["bob"])[0] == 200


def _send_all_then_read(base: str, data: bytes) -> bytes:
    """Send ``data`` in 64 KiB pieces (a server that answers early and closes stops the sending) and read the answer."""
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            for at in range(0, len(data), 64 * 1024):
                s.sendall(data[at : at + 64 * 1024])
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except (ConnectionResetError, TimeoutError):  # a reset may drop the answer: the access log below still shows it
            pass
    return got


def test_a_header_block_over_the_cap_is_431_and_under_it_is_served(served, caplog):
    base, _, tokens, _, _ = served
    head = f"GET /api/me HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {tokens['alice']}\r\n".encode()
    line = b"X-Pad: " + b"p" * 1000 + b"\r\n"
    fits = (app_module.MAX_HEADER_BYTES - len(head) - 2) // len(line)  # header lines that still fit, with the blank line
    answer = raw_exchange(base, head + line * fits + b"\r\n")
    assert answer.startswith(b"HTTP/1.0 200"), answer[:200]
    # one line too many; and 64 lines of 64 KiB each (below the 100-header and the 64 KiB-per-line caps): 4 MiB in all
    big = b"X-Pad: " + b"p" * (64 * 1024 - 10) + b"\r\n"
    for block in (head + line * (fits + 1) + b"\r\n", head + big * 64 + b"\r\n"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="oodeval.construct.access"):
            answer = _send_all_then_read(base, block)
            deadline = time.monotonic() + 10
            while not caplog.records and time.monotonic() < deadline:  # the server thread logs after it answers
                time.sleep(0.01)
        assert [r.getMessage().split()[-1] for r in caplog.records] == ["431"], [r.getMessage() for r in caplog.records]
        assert answer == b"" or (answer.startswith(b"HTTP/1.0 431") and b"Request headers over" in answer), answer[:200]
    assert call(base, "/api/me", tokens["bob"])[0] == 200


@pytest.mark.parametrize("field", ["image", "verdict", "ood_label", "note", "submission", "ood_sense"])
def test_a_lone_surrogate_in_any_text_field_is_400_naming_it(served, field, caplog):
    base, store, tokens, project, _ = served
    image = project.candidates[2].image
    body = verdict(image, verdict="ood", ood_label="zebra", note="fine")
    body[field] = body.get(field, "") + "\ud800"  # json.dumps writes the "\ud800" escape that json.loads turns back into it
    with caplog.at_level(logging.ERROR):
        status, err = call(base, "/api/verdict", tokens["alice"], body)
    assert status == 400 and f"{field}: not Unicode text" in err["error"], (status, err)
    assert not [r for r in caplog.records if r.exc_info]
    assert store.rows() == []
    raw = json.dumps(verdict(image, verdict="ood", ood_label="x\udfff")).encode()  # a low surrogate alone, too
    assert post_raw(base, tokens["alice"], raw).startswith(b"HTTP/1.0 400")
    status, res = call(base, "/api/verdict", tokens["alice"], verdict(image, verdict="ood", ood_label="zebra \U0001f993"))
    assert status == 200 and store.rows()[-1].ood_label == "zebra \U0001f993"  # a real astral character is fine


def test_lone_surrogates_reach_no_store_through_the_library_or_the_query(served):
    base, store, tokens, project, _ = served
    image = project.candidates[3].image
    with pytest.raises(ProtocolError, match="note: not Unicode text"):
        store.submit("alice", image, 1, "ambiguous", note="a\udc80")
    with pytest.raises(InputError, match="annotator name 'x\\\\udcff'"):
        ProtocolStore.create(project.folder / "other.sqlite", project.candidates, ("x\udcff", "bob"), "carol", 5)
    for label in ("%ED%A0%80", "%FF", "\\ud800"):  # the bytes of a surrogate, not UTF-8, an escape as text: decoded with U+FFFD or kept literal
        status, _, _ = request(base, f"/api/senses?label={label}", token=tokens["alice"])
        assert status == 200
    assert store.rows() == []
