"""The suite's needs marker: a missing Debian package skips only the tests that read it; a failure under CI=true."""

from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
TESTS = '''
import pytest

@pytest.mark.needs("wordnet")
def test_reads_wordnet():
    pass

@pytest.mark.needs("chromium")
def test_reads_chromium():
    pass

def test_needs_nothing():
    pass
'''


def _suite(pytester, missing_wordnet: bool):
    """The suite's conftest with WordNet's file moved away and Chromium's pointed at a file that exists."""
    here = str(Path(__file__))
    conftest = CONFTEST.replace('"/usr/bin/chromium"', repr(here)).replace('"/usr/bin/chromedriver"', repr(here))
    if missing_wordnet:
        conftest = conftest.replace("/usr/share/wordnet/data.noun", "/nonexistent/wordnet/data.noun")
    assert conftest.count(here) == 2 and "/nonexistent/wordnet" in conftest  # the paths are the conftest's
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_needs=TESTS)


def test_a_missing_package_skips_only_its_tests(pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    _suite(pytester, missing_wordnet=True)
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*Debian packages missing: wordnet-base*"])


def test_under_ci_a_missing_package_is_a_failure(pytester, monkeypatch):
    monkeypatch.setenv("CI", "true")
    _suite(pytester, missing_wordnet=True)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*Debian packages missing: wordnet-base*CI=true: a missing package is a failure*"])
    assert result.ret != 0
