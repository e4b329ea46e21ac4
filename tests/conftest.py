"""Shared test set-up: no hub access, and a tiny open_clip ViT config for random-init tests."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest

#: Debian packages the suite reads (scripts/setup.sh installs them when run as root)
DEBIAN_FILES = {
    "dataset-fashion-mnist": "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz",
    "wordnet-base": "/usr/share/wordnet/data.noun",
    "chromium": "/usr/bin/chromium",
    "chromium-driver": "/usr/bin/chromedriver",
}


def pytest_sessionstart(session) -> None:
    """Fail at once, naming the packages, instead of skipping the tests that need them."""
    missing = [pkg for pkg, path in DEBIAN_FILES.items() if not os.path.exists(path)]
    if missing:
        raise pytest.UsageError(
            f"Debian packages missing: {', '.join(missing)}; `make test` installs them when run as root "
            "(scripts/setup.sh), or install them with apt-get"
        )

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
