"""The annotation page in headless Chromium: a pool SVG that cannot run, the page's states, and a keyboard-only
walk of two annotators who disagree on the OOD label through Stage 3 to an agreed export."""

import csv
import shutil
import time

import pytest

from oodeval.cli import main
from oodeval.construct.rules import Outcome
from test_construct_app import make_project, start

pytestmark = pytest.mark.needs("chromium", "wordnet")

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
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)


@pytest.fixture
def app(request, tmp_path):
    project, store, tokens = make_project(tmp_path, **getattr(request, "param", {"svg": True}))
    server, base = start(project)
    yield base, store, tokens, project
    server.shutdown()
    server.server_close()


class Page:
    """Keyboard-only driving of the page: log in by typing the token, then keys to the focused element."""

    def __init__(self, browser, base, tokens):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self.d, self.base, self.tokens, self.By = browser, base, tokens, By
        self.wait = WebDriverWait(browser, 30)

    def text(self, id_):
        return self.d.find_element(self.By.ID, id_).text

    def shown(self, id_):
        return self.d.find_element(self.By.ID, id_).is_displayed()

    def keys(self, *seq):
        for k in seq:
            self.d.switch_to.active_element.send_keys(k)

    def login(self, name):
        from selenium.webdriver.common.keys import Keys

        self.d.delete_all_cookies()  # the next annotator's own browser
        self.d.get(self.base + "/")
        self.wait.until(lambda d: self.shown("login"))
        self.keys(self.tokens[name], Keys.ENTER)
        self.wait.until(lambda d: name in self.text("who"))
        self.wait.until(lambda d: self.text("position").startswith("Stage"))

    def at_image(self, image):
        self.wait.until(lambda d: d.find_element(self.By.ID, "image").get_attribute("data-image") == image)

    def saved(self, prefix="saved"):
        self.wait.until(lambda d: self.text("message").startswith(prefix))
        self.d.execute_script("document.getElementById('message').textContent = ''")


def test_a_pool_svg_with_a_script_does_not_run_as_a_page(app, browser):
    base, store, tokens, project = app
    svg = project.candidates[0].image
    assert svg.endswith(".svg")
    page = Page(browser, base, tokens)
    page.login("alice")  # logged in: the script would act as alice
    assert page.text("who").startswith("alice")  # the app's own script runs
    browser.get(f"{base}/image?image={svg}")
    time.sleep(1.0)  # time for the script's two fetches, had it run
    assert "ran as" not in browser.title and "not a raster image" in browser.page_source
    example = f"{base}/example?label=0&k=0"  # the HTML page among the ID examples
    browser.get(example)
    time.sleep(0.5)
    assert browser.title != "ran" and "not a raster image" in browser.page_source
    assert store.rows() == []


@pytest.mark.parametrize("app", [{"long_names": True}], indirect=True)
def test_page_states(app, browser):
    from selenium.webdriver.common.keys import Keys

    base, store, tokens, project = app
    page = Page(browser, base, tokens)
    first, second = project.candidates[0].image, project.candidates[1].image
    browser.get(base + "/")  # logged out: only the login form, no app skeleton or broken image
    page.wait.until(lambda d: page.shown("login"))
    assert not page.shown("app") and not page.shown("image")
    page.keys("not-a-token", Keys.ENTER)
    page.wait.until(lambda d: "not valid" in page.text("login-error"))
    assert "{" not in page.text("login-error") and not page.shown("app")

    page.login("alice")
    page.at_image(first)
    assert "no object of any ID class is visible" in page.text("definitions") and "too degraded" in page.text("definitions")
    form, evidence = (browser.find_element(page.By.ID, i).rect for i in ("verdict-form", "right"))
    assert form["x"] + form["width"] <= evidence["x"]  # long class names do not push the form into the evidence
    page.keys("a")  # a verdict chosen, then Enter on a Stage tab: nothing is submitted
    browser.execute_script("document.getElementById('tab-stage1').focus()")
    page.keys(Keys.ENTER)
    time.sleep(0.5)
    assert store.rows() == []
    page.at_image(first)
    page.keys("a", Keys.ENTER)  # Enter inside the form submits
    page.saved()
    page.at_image(second)
    page.keys("a", Keys.ENTER)
    page.saved()
    page.keys("s")  # Stage 3 is empty: no image, no form, Enter does nothing and throws nothing
    page.wait.until(lambda d: page.text("position") == "Stage 3" and page.shown("empty"))
    assert not page.shown("item") and "No image is in Stage 3" in page.text("empty")
    page.keys(Keys.ENTER, "a", Keys.ENTER)
    time.sleep(0.5)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]
    assert errors == [] and len(store.rows()) == 2

    page.login("bob")  # bob's Enter decides the image at Stage 2 ...
    page.at_image(first)
    page.keys("a", Keys.ENTER)
    page.saved()
    assert store.outcome(first) == Outcome("final", "ambiguous", 2)
    page.keys("p")  # ... he sees it decided, and cannot undo it: agreement is final
    page.at_image(first)
    page.wait.until(lambda d: "Decided at Stage 2: ambiguous" in page.text("state"))
    assert browser.find_element(page.By.ID, "undo").get_attribute("disabled") is not None
    page.keys("u")
    page.wait.until(lambda d: "nothing to undo here" in page.text("message"))
    assert store.outcome(first) == Outcome("final", "ambiguous", 2)
    page.keys("n")
    page.at_image(second)
    page.keys("i", Keys.ESCAPE, "1", Keys.ENTER)  # a dispute: Stage 3 waits, and bob is told
    page.saved()
    page.wait.until(lambda d: "1 image wait" in page.text("waiting"))
    page.keys("p")
    page.at_image(second)
    page.wait.until(lambda d: "waits for the joint review in Stage 3" in page.text("state"))
    assert browser.find_element(page.By.ID, "undo").get_attribute("disabled") is not None
    third = project.candidates[2].image
    assert store.outcome(third) == Outcome("stage1")
    page.keys("n")
    page.at_image(third)
    rows = len(store.rows())
    page.keys("a")  # a verdict chosen, then Enter on "log out": it logs out and submits nothing
    browser.execute_script("document.getElementById('logout').focus()")
    page.keys(Keys.ENTER)
    page.wait.until(lambda d: page.shown("login"))
    assert len(store.rows()) == rows and store.outcome(third) == Outcome("stage1")


def test_keyboard_walk_two_annotators_disagree_on_the_label_then_agree_in_stage3(app, browser, capsys):
    from selenium.webdriver.common.keys import Keys

    base, store, tokens, project = app
    image = project.candidates[1].image  # a PNG (the first candidate is the refused SVG of the fixture)
    page = Page(browser, base, tokens)

    def ood(label, *after):
        page.keys("o", label, Keys.ESCAPE, "f", *after, Keys.ENTER)  # label typed into the focused field, flag ticked
        page.saved()

    page.login("alice")
    page.keys("n")
    page.at_image(image)
    ood("Denison barb")
    page.login("bob")
    page.keys("n")
    page.at_image(image)
    assert "Denison barb" not in browser.page_source
    ood("tayra")  # same verdict and flag, another label: no agreement
    assert store.outcome(image) == Outcome("stage3")
    page.wait.until(lambda d: "1 image wait" in page.text("waiting"))
    page.keys("s")
    page.at_image(image)
    page.wait.until(lambda d: "differ on: OOD label." in page.text("stage3-differences"))
    table = page.text("stage3-table")
    assert "Denison barb" in table and "tayra" in table and "alice" in table
    ood("Denison barb")
    page.login("carol")
    page.at_image(image)
    ood("denison  Barb")  # the same label up to case and spacing
    assert store.outcome(image) == Outcome("stage3")
    page.login("alice")
    page.keys("s")
    page.at_image(image)
    ood("Denison barb")
    got = store.outcome(image)
    assert (got.status, got.verdict, got.stage, got.ood_label, got.fine_grained) == ("final", "ood", 3, "Denison barb", True)
    page.wait.until(lambda d: page.shown("done") and "all 1 image" in page.text("done-text"))  # her queue is finished
    page.keys("p")  # and she can review the decision
    page.wait.until(lambda d: "Decided: ood — Denison barb" in page.text("stage3-outcome"))

    assert main(["construct", "export", str(project.folder), "--allow-pending"]) == 0
    capsys.readouterr()
    with open(project.folder / "export" / "ood.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["ood_label"], r["fine_grained"], r["decided_stage"]) for r in rows] == [("Denison barb", "1", "3")]
    assert rows[0]["other_labels"] == "denison  Barb"


def test_stage3_notes_senses_new_items_layout_and_done_screens(app, browser, tmp_path):
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    base, store, tokens, project = app
    images = [c.image for c in project.candidates]
    tayra = "n02451415"
    page = Page(browser, base, tokens)
    page.login("carol")  # her Stage 3 is empty; she keeps the page open
    page.wait.until(lambda d: page.shown("empty"))
    store.submit("alice", images[1], 1, "ood", "tayra", True, note="long tail, dark fur", ood_sense=tayra)
    store.submit("bob", images[1], 1, "ood", "weasel", True, note="looks like a weasel to me")  # a dispute, elsewhere
    page.at_image(images[1])  # appears without a reload
    page.wait.until(lambda d: "1 new image in this queue" in page.text("new-items"))
    page.wait.until(lambda d: "long tail, dark fur" in page.text("stage3-table"))
    table = page.text("stage3-table")
    assert "looks like a weasel to me" in table and "= tayra, taira, eira barbara (n02451415)" in table  # notes, the chosen sense
    assert "long-tailed arboreal mustelid" in page.text("stage3-senses")  # and its gloss
    geometry = browser.execute_script("""
        const r = document.getElementById('submit').getBoundingClientRect();
        const lines = [...document.querySelectorAll('th')].filter((th) => th.offsetParent).map((th) => {
          const range = document.createRange(); range.selectNodeContents(th);
          return [th.textContent, new Set([...range.getClientRects()].map((x) => Math.round(x.top))).size]; });
        const panel = document.getElementById('right').getBoundingClientRect();
        const clipped = [...document.querySelectorAll('#stage3-table td, #stage3-table th')].filter(
          (c) => c.getBoundingClientRect().right > panel.right + 1).length;
        return {bottom: r.bottom, height: window.innerHeight, scroll: window.scrollY, lines: lines, clipped: clipped};""")
    browser.save_screenshot(str(tmp_path / "stage3.png"))
    assert geometry["scroll"] == 0 and geometry["bottom"] <= geometry["height"], geometry  # the form in view at 1280x900
    assert len(geometry["lines"]) >= 10 and all(n == 1 for _, n in geometry["lines"]), geometry["lines"]  # no header wraps
    assert geometry["clipped"] == 0  # every column (the notes too) visible without scrolling sideways
    page.keys("o", "Tayra")  # the senses of the typed label, with their glosses
    page.wait.until(lambda d: any(o.get_attribute("value") == tayra for o in Select(d.find_element(page.By.ID, "ood-sense")).options))
    sense = Select(browser.find_element(page.By.ID, "ood-sense"))
    assert "long-tailed arboreal mustelid" in next(o.text for o in sense.options if o.get_attribute("value") == tayra)
    assert sense.first_selected_option.get_attribute("value") == ""  # a free label unless a sense is chosen
    sense.select_by_value(tayra)
    page.keys(Keys.ESCAPE, "f", Keys.ENTER)
    page.saved()
    assert (store.rows(images[1])[-1].ood_label, store.rows(images[1])[-1].ood_sense) == ("Tayra", tayra)
    page.wait.until(lambda d: page.shown("done") and "Stage 3 done" in page.text("done-title"))  # no jump back to image 1
    assert not page.shown("item") and "all 1 image" in page.text("done-text")

    for image in images[3:]:  # alice has one image left in Stage 1
        store.submit("alice", image, 1, "ambiguous")
    page.login("alice")
    page.at_image(images[0])
    page.keys("a", Keys.ENTER)
    page.saved()
    page.at_image(images[2])
    page.keys("a", Keys.ENTER)
    page.saved()
    page.wait.until(lambda d: page.shown("done") and "Stage 1 done" in page.text("done-title"))
    assert f"all {len(images)} images" in page.text("done-text") and page.text("position") == f"Stage 1: all {len(images)} done"
    browser.save_screenshot(str(tmp_path / "done.png"))
    page.keys("p")  # review from the done screen
    page.at_image(images[-1])
    page.wait.until(lambda d: page.shown("item") and not page.shown("done"))


def test_a_service_on_another_port_gets_no_token_and_cannot_switch_the_annotator(app, browser):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from test_construct_hostile import login, me

    base, store, tokens, project = app
    page = Page(browser, base, tokens)
    page.login("alice")
    _, bob = login(base, tokens["bob"], "b" * 32)  # bob's own session, from his own browser
    seen = []

    class Neighbour(BaseHTTPRequestHandler):  # a hostile service on another 127.0.0.1 port
        def do_GET(self):
            seen.append(self.headers.get("Cookie", ""))
            self.send_response(200)
            self.send_header("Set-Cookie", f"{bob}; Path=/; Secure; HttpOnly; SameSite=Lax")  # plant bob's session
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", "24")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"<title>neighbour</title>")

        def log_message(self, *args):
            pass

    neighbour = ThreadingHTTPServer(("127.0.0.1", 0), Neighbour)
    neighbour.daemon_threads = True
    threading.Thread(target=neighbour.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.1:{neighbour.server_address[1]}/")
        page.wait.until(lambda d: d.title == "neighbour")
    finally:
        neighbour.shutdown()
        neighbour.server_close()
    stolen = seen[0]  # cookies are not port-scoped: it sees alice's cookie, which holds no token ...
    assert stolen.startswith("__Host-oodeval_session=") and not [t for t in tokens.values() if t in stolen]
    assert me(base, stolen, "")[0] == 401  # ... and without alice's page binding the session id reaches no API
    browser.get(base + "/")  # alice's browser now holds bob's session cookie: the page does not become bob's
    page.wait.until(lambda d: page.shown("login"))
    assert not page.shown("app") and "bob" not in page.text("who")
    assert store.rows() == []
