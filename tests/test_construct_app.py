"""The annotation web app: sessions, headers, images typed from their bytes, malformed requests, binding."""

import json
import select
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import numpy as np
import pytest

from oodeval.cli import main
from oodeval.construct.app import CSP, bind_warning, make_server
from oodeval.construct.candidates import write_project
from oodeval.construct.evidence import build_evidence
from oodeval.construct.protocol import ProtocolStore
from oodeval.construct.synthetic import make_synthetic_dataset
from oodeval.errors import InputError

SVG = """<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40"><rect width="40" height="40" fill="red"/>
<script>fetch('/api/me').then(r => r.json()).then(me => { document.title = 'ran as ' + me.name;
  return fetch('/api/verdict', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(
    {image: '%s', stage: 1, verdict: 'ambiguous', submission: 'svg-attack-1', base: null})}); });</script></svg>"""
HTML = b"<!doctype html><title>x</title><script>document.title = 'ran';</script>"


def make_project(tmp_path, svg=False, long_names=False):
    """A 5-class synthetic project with evidence and a store; ``svg``: the first candidate is an SVG with a
    script (``.svg``) and the first ID example of class 0 an HTML page named ``.png``."""
    d = make_synthetic_dataset(tmp_path / "data", n_classes=5, per_class=6, seed=3)
    if svg:
        first = next(line.split(",")[0] for line in d.reannotation.read_text().splitlines()[1:] if ",," in line)
        evil = first.replace(".png", ".svg")
        for f in (d.manifest, d.reannotation):
            f.write_text(f.read_text().replace(first, evil))
        (d.folder / evil).write_text(SVG % evil)
    if long_names:
        d.classes.write_text("".join(f"class {i} " + "with an extraordinarily long descriptive name " * 4 + "\n" for i in range(5)))
    project = write_project(tmp_path / "work", d.manifest, d.reannotation, d.classes)
    if svg:
        assert project.candidates[0].image == evil
        pool = {c.path for c in project.candidates}
        example = next(p for p, lab in zip(project.manifest.paths, project.manifest.labels) if lab == 0 and p not in pool)
        project.manifest.resolve(example).write_bytes(HTML)
    build_evidence(project, np.load(d.image_embeddings), np.load(d.text_embeddings), top_k=3,
                   image_url_template="https://example.org/{path}", progress=False)
    store, tokens = ProtocolStore.create(project.db_path, project.candidates, ("alice", "bob"), "carol", 5)
    return project, store, tokens


def start(project, host="127.0.0.1", request_timeout=30.0):
    server = make_server(project.folder, host=host, port=0, examples=2, request_timeout=request_timeout)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    name = f"[{host}]" if ":" in host else host
    return server, f"http://{name}:{server.server_address[1]}"


@pytest.fixture
def served(tmp_path):
    project, store, tokens = make_project(tmp_path, svg=True)
    server, base = start(project, request_timeout=1.0)
    yield base, store, tokens, project
    server.shutdown()
    server.server_close()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def request(base, path, token=None, body=None, ctype="application/json", headers=None):
    """(status, headers, raw body) of one request; dict bodies are sent as JSON."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method="POST" if data is not None else "GET", headers=headers or {})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", ctype)
    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=20) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def call(base, path, token=None, body=None, ctype="application/json"):
    status, _, payload = request(base, path, token, body, ctype)
    return status, json.loads(payload) if payload else None


def verdict(image, stage=1, **fields):
    return {"image": image, "stage": stage, "submission": uuid.uuid4().hex, "base": None, **fields}


def raw_exchange(base, data, wait=10.0):
    """Send raw bytes, return the raw answer (read until the server closes or ``wait`` passes)."""
    host, port = urllib.parse.urlsplit(base).hostname, urllib.parse.urlsplit(base).port
    with socket.create_connection((host, port), timeout=wait) as s:
        s.sendall(data)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            pass
    return b"".join(chunks)


def test_login_is_post_only_from_this_origin(served):
    base, store, tokens, _ = served
    assert call(base, "/api/me") == (401, {"error": "not logged in (no session cookie or access token)"})
    assert call(base, "/api/me", "forged") == (401, {"error": "unknown access token"})
    status, me = call(base, "/api/me", tokens["bob"])
    assert status == 200 and (me["name"], me["role"]) == ("bob", "stage1") and me["classes"][0] == "class a"
    status, headers, _ = request(base, f"/login?token={tokens['carol']}")  # login CSRF by a link
    assert status == 405 and "Set-Cookie" not in headers
    binding = "b" * 32  # the page's value in its origin's localStorage
    form = urllib.parse.urlencode({"token": tokens["carol"], "binding": binding}).encode()
    status, headers, _ = request(base, "/login", body=form, ctype="application/x-www-form-urlencoded",
                                 headers={"Origin": "http://evil.example"})  # login CSRF by a foreign form
    assert status == 403 and "Set-Cookie" not in headers
    status, headers, _ = request(base, "/login", body=urllib.parse.urlencode({"token": "wrong", "binding": binding}).encode(),
                                 ctype="application/x-www-form-urlencoded", headers={"Origin": base})
    assert status == 303 and headers["Location"] == "/#login-failed" and "Set-Cookie" not in headers
    status, headers, _ = request(base, "/login", body=form, ctype="application/x-www-form-urlencoded", headers={"Origin": base})
    cookie = headers["Set-Cookie"]
    assert status == 303 and "HttpOnly" in cookie and "SameSite=Strict" in cookie and cookie.startswith("__Host-") and "Secure" in cookie
    status, _, payload = request(base, "/api/me", headers={"Cookie": cookie.split(";")[0], "X-Oodeval-Binding": binding})
    assert json.loads(payload)["name"] == "carol"
    body = verdict(store.images()[0].image, verdict="ambiguous")
    status, _, _ = request(base, "/api/verdict", tokens["bob"], body, headers={"Origin": "http://evil.example"})
    assert status == 403 and store.rows() == []
    status, _, payload = request(base, "/api/me", headers={"Host": "evil.example", "Authorization": f"Bearer {tokens['bob']}"})
    assert status == 400 and "serves only localhost" in json.loads(payload)["error"]  # DNS rebinding


def test_every_response_carries_the_security_headers(served):
    base, _, tokens, project = served
    image = project.candidates[1].image
    for path, token in [("/", None), ("/static/app.js", None), ("/api/me", None), ("/api/me", tokens["bob"]),
                        ("/nowhere", None), (f"/image?image={image}", tokens["bob"]), ("/login", None)]:
        _, headers, _ = request(base, path, token)
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY", path
        csp = headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in csp, path
        assert ("sandbox" in csp) == path.startswith("/image"), path
        assert csp == CSP or path.startswith("/image"), path
    answer = raw_exchange(base, b"BREW /coffee HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # http.server's own error page
    assert answer.startswith(b"HTTP/1.0 501") and b"frame-ancestors 'none'" in answer and b'{"error"' in answer


def test_images_are_typed_from_their_bytes(served):
    base, store, tokens, project = served
    svg = project.candidates[0].image
    status, headers, payload = request(base, f"/image?image={svg}", tokens["bob"])
    assert status == 415 and headers["Content-Type"] == "application/json" and b"<svg" not in payload
    assert "not a raster image" in json.loads(payload)["error"]
    png = project.candidates[1]
    status, headers, payload = request(base, f"/image?image={png.image}", tokens["bob"])
    assert status == 200 and headers["Content-Type"] == "image/png" and payload == project.manifest.resolve(png.path).read_bytes()
    status, item = call(base, f"/api/item?image={png.image}", tokens["bob"])
    status, headers, payload = request(base, item["examples"]["0"][0], tokens["bob"])  # the HTML page named .png
    assert status == 415 and b"<script" not in payload
    status, headers, _ = request(base, item["examples"]["0"][1], tokens["bob"])
    assert status == 200 and headers["Content-Type"] == "image/png"
    assert store.rows() == []


def test_stage1_isolation_state_and_replays(served):
    base, store, tokens, project = served
    first = project.candidates[1].image
    body = verdict(first, verdict="ood", ood_label="Denison barb", fine_grained=True)
    status, res = call(base, "/api/verdict", tokens["alice"], body)
    assert status == 200 and res["row"] == store.rows()[0].id
    assert call(base, "/api/verdict", tokens["alice"], body) == (200, res)  # a replay adds nothing
    assert len(store.rows()) == 1
    stale = verdict(first, verdict="ambiguous")  # made on a page loaded before the first verdict
    status, err = call(base, "/api/verdict", tokens["alice"], stale)
    assert status == 409 and "changed since this page loaded" in err["error"]
    status, item = call(base, f"/api/item?image={first}", tokens["bob"])
    assert status == 200 and "Denison barb" not in json.dumps(item) and "alice" not in json.dumps(item)
    assert item["my_stage1"] is None and item["status"] == "stage1" and item["my_last_row"] == {"1": None, "3": None}
    mine = call(base, f"/api/item?image={first}", tokens["alice"])[1]
    assert mine["my_stage1"]["ood_label"] == "Denison barb" and mine["my_last_row"]["1"] == res["row"]
    status, q = call(base, "/api/queue?stage=1", tokens["alice"])
    assert [x["done"] for x in q["items"]] == [False, True] + [False] * (len(project.candidates) - 2)
    # bob disagrees on the label only: Stage 3, and everybody sees what differs
    call(base, "/api/verdict", tokens["bob"], verdict(first, verdict="ood", ood_label="tayra", fine_grained=True))
    item = call(base, f"/api/item?image={first}", tokens["carol"])[1]
    assert item["status"] == "stage3" and item["differences"] == ["ood_label"]
    me = call(base, "/api/me", tokens["alice"])[1]
    assert {p["annotator"]: p["stage3_waiting"] for p in me["progress"]} == {"alice": 1, "bob": 1, "carol": 1}
    assert call(base, "/api/queue?stage=2", tokens["bob"]) == (400, {"error": "stage must be 1 or 3, got '2'"})


BAD_POSTS = [
    ({"stage": 1, "verdict": "ambiguous", "image": "missing.png"}, "application/json", 404, "unknown image id 'missing.png'"),
    ({"stage": 1, "verdict": "ood"}, "application/json", 400, "needs a proposed OOD label"),
    ({"stage": 3, "verdict": "ambiguous"}, "application/json", 400, "still in Stage 1"),
    ({"stage": "1", "verdict": "ambiguous"}, "application/json", 400, "wrong type: stage"),
    ({"stage": 1, "verdict": "id", "id_class": True}, "application/json", 400, "wrong type: id_class"),
    ({"stage": 1, "verdict": "id", "id_class": 10**30}, "application/json", 400, "outside 0..4"),
    ({"stage": 1, "verdict": "ambiguous", "sneaky": 1}, "application/json", 400, "unknown field(s) sneaky"),
    ({"stage": 1, "verdict": "ambiguous", "submission": "x"}, "application/json", 400, "submission must be 8-64"),
    ({"stage": 1, "verdict": "ambiguous", "base": None, "submission": None}, "application/json", 400, "wrong type: submission"),
    ({"stage": 1, "verdict": "ambiguous", "note": ["a"]}, "application/json", 400, "wrong type: note"),
    (b'{"image": "x", "stage": 1, "verdict": "id", "id_class": ' + b"9" * 5000 + b"}", "application/json", 400, "not JSON"),
    (b"[" * 5000 + b"]" * 5000, "application/json", 400, "nested deeper than 2 levels"),
    (b'{"image": "\xff\xfe"}', "application/json", 400, "not UTF-8"),
    (b"{not json", "application/json", 400, "not JSON"),
    (b"[1, 2]", "application/json", 400, "must be a JSON object"),
    (b'{"image": "x"}', "application/json", 400, "missing field(s) base, stage, submission, verdict"),
    (b"x" * (64 * 1024 + 1), "application/json", 413, "at most 65536 bytes"),
    ({"stage": 1, "verdict": "ambiguous"}, "text/plain", 415, "application/json"),
]


@pytest.mark.parametrize("body, ctype, status, message", BAD_POSTS, ids=[b[3][:24] for b in BAD_POSTS])
def test_bad_requests_get_a_json_error_and_change_nothing(served, body, ctype, status, message):
    base, store, tokens, project = served
    if isinstance(body, dict):
        body = {**verdict(project.candidates[1].image), **body}
    got_status, got = call(base, "/api/verdict", tokens["bob"], body, ctype)
    assert got_status == status and message in got["error"]
    assert call(base, "/api/verdict", "wrong-token", verdict(project.candidates[1].image, verdict="ambiguous"))[0] == 401
    assert store.rows() == []


def test_broken_http_is_answered_and_never_holds_a_thread(served):
    base, store, tokens, project = served
    head = f"POST /api/verdict HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {tokens['bob']}\r\nContent-Type: application/json\r\n"
    answer = raw_exchange(base, (head + "Content-Length: ten\r\n\r\n{}").encode())
    assert answer.startswith(b"HTTP/1.0 400") and b"Content-Length must be a byte count" in answer
    answer = raw_exchange(base, (head + "Content-Length: 200\r\n\r\n{\"image\": ").encode())  # half a body, then silence
    assert answer.startswith(b"HTTP/1.0 408") and b"not received within 1 s" in answer
    with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=10) as s:  # a trickle of bytes
        s.sendall((head + "Content-Length: 200\r\n\r\n").encode())
        start = time.monotonic()
        while not select.select([s], [], [], 0.3)[0] and time.monotonic() - start < 5:
            s.sendall(b" ")  # every read gets a byte within the 1 s limit; the body as a whole is late
        answer, took = s.recv(65536), time.monotonic() - start
    assert answer.startswith(b"HTTP/1.0 408") and took < 4  # 200 bytes at this pace would take a minute
    answer = raw_exchange(base, (head + "\r\n").encode())
    assert answer.startswith(b"HTTP/1.0 411")
    assert raw_exchange(base, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n", wait=5.0) == b""  # headers never finished: closed
    assert call(base, "/api/me", tokens["bob"])[0] == 200 and store.rows() == []


def test_binding_ipv6_port_in_use_and_the_remote_warning(tmp_path, capsys, monkeypatch):
    project, store, tokens = make_project(tmp_path)
    server, base = start(project, host="::1")
    try:
        assert base.startswith("http://[::1]:") and call(base, "/api/me", tokens["alice"])[1]["name"] == "alice"
        port = server.server_address[1]
        with pytest.raises(ValueError, match=f"port {port} on ::1 is in use"):
            make_server(project.folder, host="::1", port=port)
        rc = main(["construct", "serve", str(project.folder), "--host", "::1", "--port", str(port)])
        assert rc == 2 and f"port {port} on ::1 is in use" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()
    for host in ("127.0.0.1", "::1", "[::1]", "localhost"):
        assert bind_warning(host) is None
    for host in ("0.0.0.0", "::", "192.168.1.5", "annotate.example.org"):
        assert "plain HTTP" in bind_warning(host) and "SSH tunnel" in bind_warning(host)
    import oodeval.construct.app

    def refuse(*args, **kwargs):  # the test binds nothing beyond loopback
        raise InputError("not bound in this test")  # what make_server raises for an address it cannot bind

    monkeypatch.setattr(oodeval.construct.app, "make_server", refuse)
    rc = main(["construct", "serve", str(project.folder), "--host", "0.0.0.0", "--port", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "warning: --host 0.0.0.0 serves beyond this machine over plain HTTP" in err and "not bound" in err
