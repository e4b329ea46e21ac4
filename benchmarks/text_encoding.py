"""Text-encoding throughput with and without batch truncation (issue 5 closing note).

Encodes WordNet head lemmas (or generated labels when WordNet is missing) with the paper's 8
templates through a random-init open_clip text tower: the ViT-B-32 tower at its real size
(12 layers, width 512) by default, or the tiny 2-layer test config with --tiny. Prints prompts/s for
truncated and full-length (77-token) batches and the largest difference between the two results.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/text_encoding.py [--labels 256] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def main() -> None:
    import numpy as np
    import open_clip
    import torch

    from oodeval.zeroshot.templates import PAPER
    from oodeval.zeroshot.text import TextEncoder
    from oodeval.zeroshot.wordnet import DEFAULT_WORDNET, head_lemmas

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labels", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args()

    name = "ViT-B-32"
    if args.tiny:
        path = os.path.join(tempfile.mkdtemp(), "oodeval-tiny-vit.json")
        with open(path, "w") as fh:
            json.dump(TINY, fh)
        open_clip.add_model_config(path)
        name = "oodeval-tiny-vit"
    torch.manual_seed(0)
    model, _, _ = open_clip.create_model_and_transforms(name, pretrained=None)
    tok = open_clip.get_tokenizer(name)
    if (DEFAULT_WORDNET / "data.noun").is_file():
        lexicon = head_lemmas()
        step = max(1, len(lexicon) // args.labels)
        labels = lexicon[::step][: args.labels]
    else:
        labels = [f"label number {i}" for i in range(args.labels)]
    print(f"model {name} (random init), text tower {sum(p.numel() for n, p in model.named_parameters() if not n.startswith('visual')) / 1e6:.1f}M params, "
          f"{len(labels)} labels x {len(PAPER)} templates, batch {args.batch_size}, torch threads {torch.get_num_threads()}")
    results = {}
    for truncate in (True, False):
        enc = TextEncoder(model, tok, name, templates=PAPER, batch_size=args.batch_size, truncate=truncate)
        t0 = time.perf_counter()
        emb = enc.encode(labels, progress=False)
        sec = time.perf_counter() - t0
        results[truncate] = emb
        s = enc.last_stats
        print(f"truncate={truncate!s:5}: {s['prompts']} prompts in {sec:.2f}s = {s['prompts'] / sec:.0f} prompts/s")
    print(f"max |truncated - full| = {np.abs(results[True] - results[False]).max():.2e}")


if __name__ == "__main__":
    main()
