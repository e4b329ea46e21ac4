"""Label embeddings: template averaging, exact batch truncation, the on-disk cache; ImageNet names."""

import numpy as np
import pytest


@pytest.fixture(scope="module")
def clip(tiny_clip):
    import open_clip
    import torch

    torch.manual_seed(0)
    model, _, _ = open_clip.create_model_and_transforms(tiny_clip, pretrained=None)
    return model.eval(), open_clip.get_tokenizer(tiny_clip)


LABELS = ["cat", "golden retriever", "a very long and oddly specific label name of a thing", "x", "cat food"]
# unit-norm float32 embeddings: 8 float32 ulps of 1 covers the reordering of sums across batch shapes
UNIT_ATOL = 8 * float(np.finfo(np.float32).eps)


def test_truncated_batches_equal_full_length(clip):
    from oodeval.zeroshot.text import _truncation_kind, encode_prompts

    model, tok = clip
    assert _truncation_kind(model) == "clip"
    prompts = [f"a photo of a {label}." for label in LABELS] * 3
    full = encode_prompts(model, tok, prompts, batch_size=4, truncate=False)
    cut = encode_prompts(model, tok, prompts, batch_size=4, truncate=True)
    assert full.shape == (15, 32)
    np.testing.assert_allclose(cut, full, rtol=1e-5, atol=1e-6)
    # the reference: open_clip's own encode_text on the padded 77-token tensor, one prompt at a time
    import torch

    with torch.no_grad():
        ref = model.encode_text(tok(prompts[:1])).numpy()
    np.testing.assert_allclose(cut[:1], ref, rtol=1e-5, atol=1e-6)


def test_towers_without_causal_mask_fall_back_to_full_length(clip, tiny_clip):
    import open_clip
    import torch

    from oodeval.zeroshot.text import TextEncoder, _truncation_kind

    torch.manual_seed(1)
    model, _, _ = open_clip.create_model_and_transforms(tiny_clip, pretrained=None)
    model.attn_mask = None  # bidirectional text attention: padding would change the result
    assert _truncation_kind(model) is None
    enc = TextEncoder(model, clip[1], "tiny-bidir")
    assert enc.truncate is False
    assert TextEncoder(clip[0], clip[1], "tiny").truncate is True


def test_template_ensemble_is_mean_of_normalised_then_normalised(clip):
    import torch

    from oodeval.zeroshot.templates import PAPER
    from oodeval.zeroshot.text import TextEncoder

    model, tok = clip
    got = TextEncoder(model, tok, "tiny").encode(LABELS[:2], progress=False)
    for row, label in zip(got, LABELS[:2]):
        with torch.no_grad():
            raw = model.encode_text(tok([t.format(label) for t in PAPER])).double().numpy()
        raw /= np.linalg.norm(raw, axis=1, keepdims=True)
        mean = raw.mean(0)
        np.testing.assert_allclose(row, mean / np.linalg.norm(mean), rtol=1e-5, atol=1e-6)
    assert len(PAPER) == 8 and PAPER[0] == "{}"


def test_paper_templates_are_openai_templates():
    from oodeval.zeroshot.templates import PAPER, template_set

    assert set(PAPER[1:]) <= set(template_set("openai"))
    with pytest.raises(ValueError, match="unknown template set"):
        template_set("nope")


def test_cache_encodes_each_label_once_per_key(clip, tmp_path, tiny_clip):
    import open_clip
    import torch

    from oodeval.zeroshot.text import TextEncoder

    model, tok = clip
    enc = TextEncoder(model, tok, "tiny", weights="w0", cache_dir=tmp_path, shard_size=2)
    first = enc.encode(LABELS[:3], progress=False)
    assert enc.last_stats["encoded"] == 3 and enc.last_stats["prompts"] == 24
    assert enc.last_stats["prompts_per_s"] > 0
    # a fresh encoder (new process) reads the shards; only the new labels are encoded
    enc2 = TextEncoder(model, tok, "tiny", weights="w0", cache_dir=tmp_path, shard_size=2)
    both = enc2.encode(LABELS, progress=False)
    assert enc2.last_stats["encoded"] == 2 and enc2.last_stats["cached"] == 3
    assert both[:3].tobytes() == first.tobytes()
    # unit-norm float32 rows; another batch composition reorders the sums: a few ulps of 1 (~4e-8 seen)
    np.testing.assert_allclose(both, TextEncoder(model, tok, "tiny").encode(LABELS, progress=False),
                               rtol=1e-5, atol=UNIT_ATOL)
    folders = list(tmp_path.iterdir())
    assert len(folders) == 1 and len(list(folders[0].glob("shard-*.npz"))) == 3
    # another template set, or other weights, is another key
    TextEncoder(model, tok, "tiny", weights="w0", templates=("{}",), cache_dir=tmp_path).encode(["cat"], progress=False)
    torch.manual_seed(5)
    other, _, _ = open_clip.create_model_and_transforms(tiny_clip, pretrained=None)
    enc3 = TextEncoder(other, tok, "tiny", weights="w0", cache_dir=tmp_path)
    enc3.encode(["cat"], progress=False)
    assert enc3.last_stats["encoded"] == 1
    assert len(list(tmp_path.iterdir())) == 3


def test_imagenet_names_and_wnids():
    from oodeval.zeroshot.imagenet import class_names, wnids

    names, raw, ids = class_names(), class_names(unique=False), wnids()
    assert len(names) == len(set(names)) == 1000 and len(set(ids)) == 1000
    assert all(i.startswith("n") and len(i) == 9 for i in ids)
    assert ids[0] == "n01440764" and names[0] == "tench"
    changed = [i for i in range(1000) if names[i] != raw[i]]
    assert changed == [744, 837]
    assert raw[744] == raw[657] == "missile" and raw[837] == raw[836] == "sunglasses"
    assert names[744] == "projectile" and names[837] == "dark glasses"


def test_encode_labels_loads_like_the_image_side(tmp_path, tiny_clip):
    import open_clip
    import torch

    from oodeval.features.backbones import load_backbone
    from oodeval.zeroshot.text import TextEncoder, encode_labels

    got = encode_labels(tiny_clip, ["cat", "dog"], cache_dir=tmp_path, progress=False)
    again = encode_labels(f"open_clip:{tiny_clip}", ["dog"], cache_dir=tmp_path, progress=False)
    assert got.shape == (2, 32) and np.allclose(again[0], got[1], rtol=1e-5, atol=UNIT_ATOL)
    # the same random-init text tower as the image-side loader (seed 0)
    bb = load_backbone(f"open_clip:{tiny_clip}")
    ref = TextEncoder(bb.model, open_clip.get_tokenizer(tiny_clip), "x").encode(["cat", "dog"], progress=False)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    # weights from a local file
    path = tmp_path / "w.pt"
    torch.manual_seed(9)
    other, _, _ = open_clip.create_model_and_transforms(tiny_clip, pretrained=None)
    torch.save(other.state_dict(), path)
    from_file = encode_labels(tiny_clip, ["cat"], weights=str(path), cache_dir=tmp_path, progress=False)
    direct = TextEncoder(other.eval(), open_clip.get_tokenizer(tiny_clip), "y").encode(["cat"], progress=False)
    np.testing.assert_allclose(from_file, direct, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="timm models only"):
        encode_labels(tiny_clip, ["cat"], model_kwargs={"drop_rate": 0.1})
