"""Shared test set-up: no hub access, and a tiny open_clip ViT config for random-init tests."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest

#: what a ``@pytest.mark.needs(WHAT)`` test reads: the Debian packages and their files
#: (scripts/setup.sh installs them when run as root)
NEEDS = {
    "fashion-mnist": {"dataset-fashion-mnist": "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"},
    "wordnet": {"wordnet-base": "/usr/share/wordnet/data.noun"},
    "chromium": {"chromium": "/usr/bin/chromium", "chromium-driver": "/usr/bin/chromedriver"},
}


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", f"needs(what): the test reads a Debian package's files ({', '.join(NEEDS)}); "
                                       "skipped when they are missing, a failure under CI=true")  # fmt: skip
    config.addinivalue_line("markers", "numerics: a numerical result that must hold on every CPU kernel and thread count; "
                                       ".ci/run runs these again under other kernels (docs/conventions.md#reproducibility)")  # fmt: skip
    config.addinivalue_line("markers", "engines(which): the test runs on a real Ray cluster or Slurm controller started by "
                                       "scripts/engines.sh; skipped unless OODEVAL_ENGINES names it (ray,slurm)")  # fmt: skip


def missing_packages(what: str) -> list[str]:
    """The Debian packages of ``what`` (a key of NEEDS) whose files are not installed."""
    if what not in NEEDS:
        raise pytest.UsageError(f"@pytest.mark.needs({what!r}): unknown; known: {', '.join(NEEDS)}")
    return [pkg for pkg, path in NEEDS[what].items() if not os.path.exists(path)]


def pytest_runtest_setup(item) -> None:
    """Skip a test whose Debian packages are missing, naming them; under ``CI=true`` fail it instead.
    Skip an engines test unless ``OODEVAL_ENGINES`` names its engine (`.ci/run` sets it once they are up)."""
    wanted = {e for mark in item.iter_markers("engines") for e in mark.args}
    started = set(filter(None, os.environ.get("OODEVAL_ENGINES", "").split(",")))
    if wanted - started:
        pytest.skip(f"needs the {', '.join(sorted(wanted - started))} engine(s) of scripts/engines.sh "
                    "(run with OODEVAL_ENGINES=ray,slurm once they are up; see docs/experiments.md)")
    missing = [pkg for mark in item.iter_markers("needs") for what in mark.args for pkg in missing_packages(what)]
    if not missing:
        return
    msg = (f"Debian packages missing: {', '.join(dict.fromkeys(missing))}; `make test` installs them when run as root "
           "(scripts/setup.sh), or install them with apt-get")  # fmt: skip
    if os.environ.get("CI") == "true":
        pytest.fail(f"{msg} (CI=true: a missing package is a failure, not a skip)", pytrace=False)
    pytest.skip(msg)


TINY_CLIP = "oodeval-tiny-vit"
TINY_CLIP_CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory) -> str:
    """Register a 2-layer, 32-px open_clip ViT under the name ``oodeval-tiny-vit`` and return it.

    Create it with ``open_clip.create_model_and_transforms(tiny_clip, pretrained=None)``.
    """
    import open_clip

    path = tmp_path_factory.mktemp("clipcfg") / f"{TINY_CLIP}.json"
    path.write_text(json.dumps(TINY_CLIP_CONFIG))
    open_clip.add_model_config(path)
    return TINY_CLIP


@pytest.fixture(scope="module")
def scored_together():
    """(ID train, ID test + OOD in one FeatureSet) of an 8-class, 32-d synthetic problem: the peer
    comparisons score both sets together, so a ranking spans ID and OOD."""
    import numpy as np

    from oodeval.detectors._synthetic import synthetic_problem
    from oodeval.features import FeatureSet

    train, test, ood = synthetic_problem(n_classes=8, dim=32, n_train=800, n_test=150, n_ood=150, seed=4)
    both = FeatureSet(np.concatenate([test.features, ood.features]), logits=np.concatenate([test.logits, ood.logits]),
                      weight=test.weight, bias=test.bias)
    return train, both
