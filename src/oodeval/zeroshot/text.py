"""Label embeddings from an open_clip text tower (paper Sec. 4.1, App. G).

t(label) = normalise(mean_j normalise(f(template_j(label)))) over the template set (8 templates of
App. G by default). Prompts are encoded in batches sorted by token length, and each batch's token
tensor (open_clip pads to 77) is cut to the longest sequence in the batch. This is exact for text
towers with a causal attention mask that pool at the EOT token (OpenAI CLIP / OpenCLIP): no real
token attends to the padding. It is used only for such towers and only after a probe batch encoded
both ways agrees; otherwise (SigLIP-style towers, padding masks, class tokens) prompts are encoded at
full length. Results are cached per (model, weights, template set, label) when a cache root is given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from .._extras import optional
from ..errors import InputError
from .models import load_clip
from .templates import PAPER, templates_id
from .text_cache import TextEmbeddingCache

__all__ = ["TextEncoder", "encode_labels", "encode_prompts", "model_fingerprint", "check_same_model"]

log = logging.getLogger(__name__)


def model_fingerprint(model) -> str:
    """Hash of the text tower's parameters and buffers (identifies random-init weights too)."""
    from ..features.backbones import text_tower_fingerprint

    return text_tower_fingerprint(model)


def check_same_model(text_tower: str, featuresets: dict) -> None:
    """Raise ValueError unless every FeatureSet's recorded ``meta["text_tower"]`` (the fingerprint of the
    VLM that made its image embeddings, stored at extraction) equals ``text_tower``, the fingerprint of
    the model about to encode the labels. FeatureSets without a record (made elsewhere) get a warning."""
    for name, fs in featuresets.items():
        recorded = fs.meta.get("text_tower")
        if recorded is None:
            log.warning("%s: no text-tower fingerprint recorded with the image features; cannot check that the "
                        "labels are encoded by the same model and weights", name)
        elif recorded != text_tower:
            raise InputError(f"{name}: the image features were extracted with {fs.meta.get('model', 'another model')!r} "
                             f"(weights {fs.meta.get('weights') or fs.meta.get('pretrained')}) whose text tower differs from the one "
                             f"given for the labels (fingerprint {recorded[:12]} != {text_tower[:12]}); give the same model and weights")


def _truncation_kind(model) -> str | None:
    """'clip' or 'text' when the text tower is causal and pools at EOT (truncation exact), else None."""
    if hasattr(model, "positional_embedding") and hasattr(model, "token_embedding"):
        ok = getattr(model, "attn_mask", None) is not None and getattr(model, "text_pool_type", "argmax") in ("argmax", "eos")
        return "clip" if ok else None
    text = getattr(model, "text", None)
    if text is not None and hasattr(text, "positional_embedding") and hasattr(text, "token_embedding"):
        ok = (
            getattr(text, "attn_mask", None) is not None
            and getattr(text, "cls_emb", None) is None
            and not getattr(text, "use_pad_mask", False)
            and getattr(text, "pool_type", None) in ("argmax", "eos")
        )
        return "text" if ok else None
    return None


def _forward_truncated(model, kind: str, tokens):
    """The text tower's forward on a token tensor shorter than its context length."""
    torch = optional("torch")
    text_global_pool = optional("open_clip.transformer").text_global_pool
    tower = model if kind == "clip" else model.text
    n = tokens.shape[1]
    cast = tower.transformer.get_cast_dtype()
    x = tower.token_embedding(tokens).to(cast) + tower.positional_embedding[:n].to(cast)
    x = tower.transformer(x, attn_mask=tower.attn_mask[:n, :n])
    x = tower.ln_final(x)
    if kind == "clip":
        pool, eos = tower.text_pool_type, getattr(tower, "text_eos_id", None)
    else:
        pool, eos = tower.pool_type, getattr(tower, "eos_id", None)
    x = text_global_pool(x, tokens, pool, eos_token_id=eos)
    proj = tower.text_projection
    if proj is not None:
        x = proj(x) if isinstance(proj, torch.nn.Linear) else x @ proj
    return x


def _lengths(tokens) -> np.ndarray:
    """Per-row length up to and including the last non-zero (non-padding) token."""
    nonzero = (tokens != 0).cpu().numpy()
    last = nonzero.shape[1] - 1 - np.argmax(nonzero[:, ::-1], axis=1)
    return np.where(nonzero.any(axis=1), last + 1, 1)


def encode_prompts(model, tokenizer, prompts: Sequence[str], batch_size: int = 256, truncate: bool = True, device: str = "cpu") -> np.ndarray:
    """Raw (unnormalised) text-tower outputs (len(prompts), E) float32 for ``prompts``.

    With ``truncate`` (and a tower where it is exact) each batch is cut to its longest prompt;
    prompts are batched in order of token length so batches are short.
    """
    torch = optional("torch")
    tokens = tokenizer(list(prompts))
    kind = _truncation_kind(model) if truncate else None
    lengths = _lengths(tokens)
    order = np.argsort(lengths, kind="stable") if kind else np.arange(len(prompts))
    out: list[np.ndarray] = []
    with torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            idx = order[start : start + batch_size]
            batch = tokens[torch.as_tensor(idx)].to(device)
            if kind:
                batch = batch[:, : int(lengths[idx].max())]
                emb = _forward_truncated(model, kind, batch)
            else:
                emb = model.encode_text(batch)
            out.append(emb.float().cpu().numpy())
    emb = np.concatenate(out) if out else np.zeros((0, 0), np.float32)
    result = np.empty_like(emb)
    result[order] = emb
    return result


class TextEncoder:
    """Encode labels with a template ensemble, with an optional on-disk cache.

    ``TextEncoder(model, tokenizer, model_name, weights=None, templates=PAPER, cache_dir=None,
    batch_size=256, truncate=True).encode(labels) -> (L, E) float32``, rows l2-normalised.
    ``weights`` names the checkpoint (path or tag) for the cache key; the text tower's parameter hash
    is part of the key too, so random-init towers never share a cache entry by accident.
    After ``encode``, ``last_stats`` holds prompts encoded, seconds and prompts per second.
    """

    def __init__(
        self,
        model,
        tokenizer,
        model_name: str,
        weights: str | None = None,
        templates: Sequence[str] = PAPER,
        cache_dir: str | Path | None = None,
        batch_size: int = 256,
        truncate: bool = True,
        device: str = "cpu",
        shard_size: int = 4096,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.templates = tuple(templates)
        self.batch_size = batch_size
        self.device = device
        self.shard_size = shard_size
        self.truncate = bool(truncate) and self._truncation_agrees()
        self.key = {
            "model": model_name,
            "weights": str(weights) if weights is not None else None,
            "text_tower": model_fingerprint(model),
            "templates": templates_id(self.templates),
        }
        self.cache = TextEmbeddingCache(cache_dir, self.key) if cache_dir is not None else None
        self.last_stats: dict = {}

    def _truncation_agrees(self) -> bool:
        """Probe: truncated and full-length encodings of a short batch must agree."""
        if _truncation_kind(self.model) is None:
            return False
        probe = ["a photo of a cat.", "x", "a close-up photo of a very long and oddly specific name."]
        full = encode_prompts(self.model, self.tokenizer, probe, truncate=False, device=self.device)
        cut = encode_prompts(self.model, self.tokenizer, probe, truncate=True, device=self.device)
        scale = max(float(np.abs(full).max()), 1e-12)
        return bool(np.abs(full - cut).max() <= 1e-4 * scale)

    def _encode_uncached(self, labels: list[str]) -> np.ndarray:
        prompts = [t.format(label) for label in labels for t in self.templates]
        raw = encode_prompts(self.model, self.tokenizer, prompts, self.batch_size, self.truncate, self.device)
        raw = raw.astype(np.float64).reshape(len(labels), len(self.templates), -1)
        raw /= np.linalg.norm(raw, axis=2, keepdims=True)
        mean = raw.mean(axis=1)
        return (mean / np.linalg.norm(mean, axis=1, keepdims=True)).astype(np.float32)

    def encode(self, labels: Sequence[str], progress: bool = True) -> np.ndarray:
        """(len(labels), E) float32 l2-normalised label embeddings, in the order given."""
        from tqdm import tqdm

        labels = [str(label) for label in labels]
        todo = list(dict.fromkeys(label for label in labels if self.cache is None or label not in self.cache))
        fresh: dict[str, np.ndarray] = {}
        t0 = time.perf_counter()
        chunk = max(int(self.shard_size), 1)  # bounds the token tensor; one cache shard per chunk
        with tqdm(total=len(todo), desc="encode labels", unit="label", disable=not progress or not todo) as bar:
            for start in range(0, len(todo), chunk):
                part = todo[start : start + chunk]
                emb = self._encode_uncached(part)
                if self.cache is not None:
                    self.cache.add(part, emb)
                else:
                    fresh.update(zip(part, emb))
                bar.update(len(part))
        seconds = time.perf_counter() - t0
        n_prompts = len(todo) * len(self.templates)
        self.last_stats = {
            "labels": len(labels),
            "encoded": len(todo),
            "cached": len(set(labels)) - len(todo),
            "prompts": n_prompts,
            "seconds": seconds,
            "prompts_per_s": n_prompts / seconds if n_prompts and seconds > 0 else float("nan"),
            "truncate": self.truncate,
        }
        if self.cache is not None:
            return self.cache.get(labels)
        if not labels:
            return np.zeros((0, 0), np.float32)
        return np.stack([fresh[label] for label in labels])


@lru_cache(maxsize=4)
def _encoder_for(model: str, weights: str | None, pretrained: str | None, cache_dir: str | None,
                 templates: tuple[str, ...], batch_size: int, truncate: bool, device: str) -> TextEncoder:
    net, tokenizer, name = load_clip(model, weights, pretrained, device=device)
    label = weights if weights is not None else (pretrained or "random-init(seed=0)")
    return TextEncoder(net, tokenizer, name, label, templates, cache_dir, batch_size, truncate, device)


def encode_labels(
    model: str,
    labels: Sequence[str],
    weights: str | None = None,
    pretrained: str | None = None,
    cache_dir: str | Path | None = None,
    templates: Sequence[str] = PAPER,
    model_kwargs: dict | None = None,
    batch_size: int = 256,
    truncate: bool = True,
    device: str = "cpu",
    progress: bool = True,
) -> np.ndarray:
    """(len(labels), E) float32 l2-normalised label embeddings of open_clip ``model`` (see ``load_clip``).

    The loaded model and encoder are kept for the next call with the same arguments.
    """
    if model_kwargs:
        raise InputError(f"model_kwargs apply to timm models only, not open_clip text towers: {sorted(model_kwargs)}")
    enc = _encoder_for(str(model), None if weights is None else str(weights), pretrained,
                       None if cache_dir is None else str(cache_dir), tuple(templates), batch_size, truncate, device)
    return enc.encode(labels, progress=progress)
