"""The annotation web app: the JSON API (tokens, isolation, bad input) and a headless-Chromium session."""

import json
import shutil
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from oodeval.construct.app import make_server
from oodeval.construct.candidates import write_project
from oodeval.construct.evidence import build_evidence
from oodeval.construct.protocol import ProtocolStore
from oodeval.construct.rules import Outcome
from oodeval.construct.synthetic import make_synthetic_dataset


@pytest.fixture
def served(tmp_path):
    d = make_synthetic_dataset(tmp_path / "data", n_classes=5, per_class=6, seed=3)
    project = write_project(tmp_path / "work", d.manifest, d.reannotation, d.classes)
    build_evidence(project, np.load(d.image_embeddings), np.load(d.text_embeddings), top_k=3,
                   image_url_template="https://example.org/{path}", progress=False)
    store, tokens = ProtocolStore.create(project.db_path, project.candidates, ("alice", "bob"), "carol", 5)
    server = make_server(project.folder, port=0, examples=2)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    yield base, store, tokens, project
    server.shutdown()
    server.server_close()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def call(base, path, token=None, body=None, ctype="application/json", raw=False):
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method="POST" if data is not None else "GET")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", ctype)
    try:
        with urllib.request.build_opener(NoRedirect).open(req) as resp:
            payload = resp.read()
            return resp.status, payload if raw else json.loads(payload)
    except urllib.error.HTTPError as exc:
        payload = exc.read()
        return exc.code, payload if raw or not payload else json.loads(payload)


def test_tokens_and_login(served):
    base, store, tokens, _ = served
    assert call(base, "/api/me") == (401, {"error": "no access token given"})
    assert call(base, "/api/me", "forged") == (401, {"error": "unknown access token"})
    status, me = call(base, "/api/me", tokens["bob"])
    assert status == 200 and (me["name"], me["role"]) == ("bob", "stage1") and me["classes"][0] == "class a"
    assert call(base, f"/login?token={tokens['carol']}x")[0] == 401
    req = urllib.request.Request(f"{base}/login?token={tokens['carol']}")
    with pytest.raises(urllib.error.HTTPError) as info:  # the 303 is not followed
        urllib.request.build_opener(NoRedirect).open(req)
    cookie = info.value.headers["Set-Cookie"]
    assert info.value.code == 303 and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    req = urllib.request.Request(f"{base}/api/me", headers={"Cookie": cookie.split(";")[0]})
    with urllib.request.urlopen(req) as resp:
        assert json.loads(resp.read())["name"] == "carol"
    req = urllib.request.Request(f"{base}/api/me", headers={"Host": "evil.example", "Authorization": f"Bearer {tokens['bob']}"})
    with pytest.raises(urllib.error.HTTPError) as info:  # DNS rebinding: a foreign Host is refused
        urllib.request.urlopen(req)
    assert info.value.code == 400 and "serves only localhost" in json.loads(info.value.read())["error"]


def test_stage1_isolation_and_images(served):
    base, store, tokens, project = served
    first = project.candidates[0]
    body = {"image": first.image, "stage": 1, "verdict": "ood", "ood_label": "Denison barb", "fine_grained": True}
    status, res = call(base, "/api/verdict", tokens["alice"], body)
    assert status == 200 and res["row"] == store.rows()[0].id
    status, item = call(base, f"/api/item?image={first.image}", tokens["bob"], raw=True)
    assert status == 200 and b"Denison barb" not in item and b"alice" not in item
    item = json.loads(item)
    assert item["my_stage1"] is None and not item["in_stage3"] and item["evidence"]["original"]["label"] == first.original_label
    assert call(base, f"/api/item?image={first.image}", tokens["alice"])[1]["my_stage1"]["ood_label"] == "Denison barb"
    status, q = call(base, "/api/queue?stage=1", tokens["alice"])
    assert [x["done"] for x in q["items"]] == [True] + [False] * (len(project.candidates) - 1)
    assert call(base, "/api/queue?stage=1", tokens["bob"])[1]["items"][0]["done"] is False
    # the image and the example images of the candidate classes
    status, data = call(base, item["image_url"], tokens["bob"], raw=True)
    assert status == 200 and data == (project.manifest.resolve(first.path)).read_bytes()
    assert set(item["examples"]) >= {str(first.original_label)} | {str(e["label"]) for e in item["evidence"]["vlm_topk"]}
    url = item["examples"][str(first.original_label)][0]
    status, data = call(base, url, tokens["bob"], raw=True)
    pool = {c.path for c in project.candidates}
    examples = [p for p, lab in zip(project.manifest.paths, project.manifest.labels) if lab == first.original_label and p not in pool]
    assert status == 200 and data == project.manifest.resolve(examples[0]).read_bytes()
    assert call(base, item["image_url"])[0] == 401


BAD_POSTS = [
    ({"image": "missing.png", "stage": 1, "verdict": "ambiguous"}, "application/json", 404, "unknown image id 'missing.png'"),
    ({"image": "IMG", "stage": 1, "verdict": "ood"}, "application/json", 400, "needs a proposed OOD label"),
    ({"image": "IMG", "stage": 3, "verdict": "ambiguous"}, "application/json", 400, "still in Stage 1"),
    ({"image": "IMG", "stage": "1", "verdict": "ambiguous"}, "application/json", 400, "wrong type: stage"),
    ({"image": "IMG", "stage": 1, "verdict": "id", "id_class": True}, "application/json", 400, "wrong type: id_class"),
    ({"image": "IMG", "verdict": "ambiguous", "sneaky": 1}, "application/json", 400, "unknown field(s) sneaky"),
    (b"{not json", "application/json", 400, "not JSON"),
    (b"[1, 2]", "application/json", 400, "must be a JSON object"),
    ({"image": "IMG", "stage": 1, "verdict": "ambiguous"}, "text/plain", 415, "application/json"),
]


@pytest.mark.parametrize("body, ctype, status, message", BAD_POSTS, ids=[b[3][:24] for b in BAD_POSTS])
def test_bad_requests_change_nothing(served, body, ctype, status, message):
    base, store, tokens, project = served
    if isinstance(body, dict) and body.get("image") == "IMG":
        body = {**body, "image": project.candidates[1].image}
    before = store.rows()
    got_status, got = call(base, "/api/verdict", tokens["bob"], body, ctype)
    assert got_status == status and message in got["error"]
    good = {"image": project.candidates[1].image, "stage": 1, "verdict": "ambiguous"}
    assert call(base, "/api/verdict", "wrong-token", good)[0] == 401
    assert store.rows() == before
    assert call(base, "/api/queue?stage=2", tokens["bob"]) == (400, {"error": "stage must be 1 or 3, got '2'"})


# ---- end to end in headless Chromium ----------------------------------------------------------------
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1280,900"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)


def test_browser_two_annotators_disagree_then_resolve(served, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    base, store, tokens, project = served
    image = project.candidates[0].image
    wait = WebDriverWait(browser, 30)

    def login(name, stage=None):
        browser.get(f"{base}/login?token={tokens[name]}")
        wait.until(lambda d: name in d.find_element(By.ID, "who").text)
        wait.until(lambda d: d.find_element(By.ID, "position").text.startswith("Stage"))
        if stage == 3:
            browser.find_element(By.ID, "tab-stage3").click()
            wait.until(lambda d: d.find_element(By.ID, "position").text.startswith("Stage 3"))
        wait.until(lambda d: d.find_element(By.ID, "image").get_attribute("data-image") == image)
        wait.until(lambda d: d.execute_script("return document.getElementById('image').naturalWidth") > 0)

    def keys(*seq):
        for k in seq:
            browser.switch_to.active_element.send_keys(k)

    def saved():
        wait.until(lambda d: d.find_element(By.ID, "message").text.startswith("saved"))

    # Stage 1: alice says OOD (fine-grained), from the keyboard only
    login("alice")
    assert browser.find_element(By.ID, "evidence").text.count("(D) closest ID classes") == 1
    assert len(browser.find_elements(By.CSS_SELECTOR, "#evidence .examples img")) >= 2
    keys("o", "Denison barb", Keys.ESCAPE, "f", Keys.ENTER)
    saved()
    assert store.view("alice", image)["my_stage1"]["fine_grained"] is True
    progress = browser.find_element(By.CSS_SELECTOR, "#progress tr[data-annotator=alice]").text
    assert f"1/{len(project.candidates)}" in progress

    # bob sees nothing of alice's verdict and answers ID with the original class (shortcut 1)
    login("bob")
    assert "Denison barb" not in browser.page_source
    assert not browser.find_element(By.ID, "stage3-panel").is_displayed()
    keys("1", Keys.ENTER)
    saved()
    assert store.outcome(image) == Outcome("stage3")

    # Stage 3: carol sees both verdicts and proposes the label
    login("carol", stage=3)
    table = browser.find_element(By.ID, "stage3-table").text
    assert "alice" in table and "Denison barb" in table and "bob" in table and project.candidates[0].original_name in table
    keys("o", "Denison barb", Keys.ESCAPE, "f", Keys.ENTER)
    saved()
    for name in ("alice", "bob"):
        login(name, stage=3)
        keys("o", "Denison barb", Keys.ESCAPE, "f", Keys.ENTER)
        saved()
    assert store.outcome(image) == Outcome("final", "ood", 3, "Denison barb", True, None, ("Denison barb",))
    browser.get(f"{base}/login?token={tokens['carol']}")
    wait.until(lambda d: "Decided: ood" in d.find_element(By.ID, "stage3-outcome").text)
