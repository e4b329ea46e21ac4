# `make demo` and `make test` do all set-up themselves (scripts/setup.sh is idempotent).
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1

.PHONY: setup demo test bench golden golden-record

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/oodeval demo

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

bench: setup
	$(PY) benchmarks/metrics.py

# the local bitwise guard: the quick demo's bits on this machine, before and after a change (never committed)
golden: setup
	$(PY) tests/golden.py check

golden-record: setup
	$(PY) tests/golden.py record
