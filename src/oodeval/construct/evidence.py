"""Per-image evidence for the annotators (paper Sec. 3 "Per-image evidence", Fig. 3 top).

(C) the original label; (D) the top-k ID classes a VLM ranks closest to the image, by cosine
between cached image embeddings (N, E) and class text embeddings (C, E); (E) the classes the
reannotators most often re-assigned images of the original class to (confusion counts of the
reannotation table); (A) an open-world MLLM answer: the model must either name one of the ID
classes (closed world) or say the subject is in none of them and give a free-form fine-grained
label (open world), after App. G of the paper (the prompt wording here is ours); (B) reverse
image search links for a public image URL. Every piece is optional. Evidence is one JSON file
per image under ``evidence/``, written atomically; rerunning adds missing pieces (resume).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import string
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import numpy as np

from .._arrays import l2_normalise
from .._io import write_json_atomic
from ..data.images import ImageError, open_image
from ..errors import InputError
from ..features.featureset import FeatureSet
from .candidates import check_not_initialised
from .tables import confusion_counts

if TYPE_CHECKING:
    from ..llm import ChatClient
    from .candidates import Project

__all__ = [
    "REVERSE_SEARCH",
    "evidence_file",
    "load_evidence",
    "load_embeddings",
    "load_text_embeddings",
    "vlm_topk",
    "confusion_topk",
    "reverse_search_links",
    "mllm_messages",
    "parse_mllm_answer",
    "describe_image",
    "image_bytes",
    "NotAnImageError",
    "check_url_template",
    "check_templates",
    "build_evidence",
]

#: reverse image search services; ``{url}`` is the percent-encoded public image URL
REVERSE_SEARCH = {
    "Google Lens": "https://lens.google.com/uploadbyurl?url={url}",
    "Bing": "https://www.bing.com/images/search?view=detailv2&iss=sbi&q=imgurl:{url}",
    "Yandex": "https://yandex.com/images/search?rpt=imageview&url={url}",
    "TinEye": "https://tineye.com/search?url={url}",
}

MLLM_PROMPT = (
    "You are an expert image annotator. These are the {n} classes of the dataset, separated by semicolons:\n"
    "{names}\n\n"
    "Look at the image. If its main subject belongs to one of these classes, answer with that class name "
    "exactly as written (closed world). If it belongs to none of them, state that it is not in the list and "
    "give the most specific fine-grained label you can for what it shows, such as a species, breed or model "
    "(open world). Reply with JSON only: "
    '{{"in_list": true or false, "label": "class name or free-form label", "description": "one sentence"}}'
)


def evidence_file(folder: str | Path, image: str) -> Path:
    """``folder/<readable stem>-<hash>.json`` for an image id (ids are paths with slashes)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", image)[-60:].strip("._") or "image"
    return Path(folder) / f"{stem}-{hashlib.blake2b(image.encode(), digest_size=6).hexdigest()}.json"


def load_evidence(folder: str | Path, image: str) -> dict:
    """The stored evidence of an image, or ``{}`` when none was built."""
    f = evidence_file(folder, image)
    return json.loads(f.read_text()) if f.is_file() else {}


def load_embeddings(path: str | Path) -> np.ndarray:
    """A (rows, E) float array from a ``.npy`` file or a FeatureSet folder (its ``features``)."""
    path = Path(path)
    if path.is_dir():
        arr = np.asarray(FeatureSet.load(path).features)
    elif path.is_file():
        arr = np.load(path)
    else:
        raise FileNotFoundError(f"embeddings {path} do not exist (want a .npy file or a FeatureSet folder)")
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise InputError(f"embeddings {path} must be a non-empty (rows, E) array, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise InputError(f"embeddings {path} hold {int((~np.isfinite(arr)).sum())} non-finite values")
    return arr


def load_text_embeddings(path: str | Path, class_names: list[str] | None) -> np.ndarray:
    """Class text embeddings (C, E), rows in class order.

    Accepts a ``.npy`` (C, E) array, a FeatureSet folder, or label-keyed embeddings: a ``.npz`` with
    ``labels`` and ``embeddings`` arrays, or a folder of such ``shard-*.npz`` files (the zero-shot text
    cache, :mod:`oodeval.zeroshot.text_cache`), looked up by class name.
    """
    path = Path(path)
    shards = sorted(path.glob("shard-*.npz")) if path.is_dir() else [path] if path.suffix == ".npz" and path.is_file() else []
    if not shards:
        return load_embeddings(path)
    if not class_names:
        raise InputError(f"text embeddings {path} are keyed by label: give the class names (--classes at `construct candidates`)")
    table: dict[str, np.ndarray] = {}
    for shard in shards:
        with np.load(shard, allow_pickle=False) as z:
            if "labels" not in z or "embeddings" not in z:
                raise InputError(f"{shard} has no 'labels' and 'embeddings' arrays")
            for label, row in zip(z["labels"].tolist(), z["embeddings"]):
                table.setdefault(label, row)
    missing = [n for n in class_names if n not in table]
    if missing:
        raise InputError(f"text embeddings {path} lack {len(missing)} of the {len(class_names)} class names, e.g. {missing[:3]}")
    return np.stack([table[n] for n in class_names])


def vlm_topk(image_emb: np.ndarray, text_emb: np.ndarray, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Evidence (D): the k classes of highest cosine h(x)'t per image, best first.

    Both sides are l2-normalised here (a no-op for normalised caches). Returns (index (N,k), cosine (N,k));
    ties keep the lower class index first.
    """
    if image_emb.ndim != 2 or text_emb.ndim != 2 or image_emb.shape[1] != text_emb.shape[1]:
        raise InputError(f"image embeddings {image_emb.shape} and text embeddings {text_emb.shape} must be (N, E) and (C, E)")
    k = min(int(k), text_emb.shape[0])
    if k < 1:
        raise InputError(f"top-k needs k >= 1, got {k}")
    sims = l2_normalise(image_emb.astype(np.float64)) @ l2_normalise(text_emb.astype(np.float64)).T
    idx = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return idx, np.take_along_axis(sims, idx, axis=1)


def confusion_topk(counts: dict, label: int, k: int = 5) -> list[tuple[int, int]]:
    """Evidence (E): up to k (class, count) pairs for an original class, most frequent first, ties by class."""
    c = counts.get(label, {})
    return sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


def check_url_template(template: str, field: str, what: str) -> None:
    """Refuse a URL template that does not use exactly the one placeholder ``{field}``."""
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        raise InputError(f"{what} {template!r} is not a valid template ({exc}); write literal braces as {{{{ and }}}}") from exc
    if fields != {field}:
        found = ", ".join("{" + f + "}" for f in sorted(fields)) or "none"
        raise InputError(f"{what} {template!r} must use the placeholder {{{field}}} and no other (found {found})")


def _check_search_templates(templates: dict[str, str] | None) -> None:
    for name, tpl in (templates or {}).items():
        if not tpl.startswith(("https://", "http://")):
            raise InputError(f"reverse-search template {name!r} must be an http(s) URL containing {{url}}, got {tpl!r}")
        check_url_template(tpl, "url", f"reverse-search template {name!r}")


def check_templates(image_url_template: str | None, search_templates: dict[str, str] | None) -> None:
    """The URL templates of evidence (B): ``{path}`` only in the image URL, ``{url}`` only in each search URL."""
    if image_url_template:
        check_url_template(image_url_template, "path", "image URL template")
    _check_search_templates(search_templates)


def reverse_search_links(image_url: str, templates: dict[str, str] | None = None) -> list[dict]:
    """Evidence (B): ``[{service, url}]`` reverse image search links for a public image URL."""
    encoded = quote(image_url, safe="")
    _check_search_templates(templates)
    return [{"service": name, "url": tpl.format(url=encoded)} for name, tpl in (templates or REVERSE_SEARCH).items()]


#: raster formats served as they are (PIL format -> MIME type); any other format PIL opens is re-encoded as PNG
SERVED_AS_IS = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}
#: an image with more pixels is not served (re-encoding a small, highly compressed file of that size costs seconds and GB)
MAX_PIXELS = 40_000_000


class NotAnImageError(InputError):
    """A pool or example file that is not a raster image (an SVG, an HTML page, a corrupt file)."""


def image_bytes(path: str | Path) -> tuple[bytes, str]:
    """(bytes, MIME type) of an image file or of ``FILE#K`` inside a container, typed from the bytes.

    The file name decides nothing: the bytes must be a raster image that PIL opens. PNG, JPEG, GIF and
    WebP are returned as they are, other raster formats (and container items) re-encoded as PNG;
    anything else (SVG, HTML, ...) and images of more than ``MAX_PIXELS`` pixels raise
    :class:`NotAnImageError`, a missing file FileNotFoundError.
    """
    import io

    from PIL import Image, UnidentifiedImageError


    path = Path(path)
    if not path.is_file():
        if "#" not in path.name:
            raise FileNotFoundError(f"image {path} does not exist")
        try:
            img = open_image(str(path))
        except (ImageError, OSError) as exc:
            raise FileNotFoundError(f"image {path} cannot be read: {exc}") from None
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        return buf.getvalue(), "image/png"
    data = path.read_bytes()
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt = img.format
            if img.width * img.height > MAX_PIXELS:
                raise NotAnImageError(f"{path.name} has {img.width}x{img.height} pixels, more than the {MAX_PIXELS:,} served")
            if fmt in SERVED_AS_IS:
                img.verify()
                return data, SERVED_AS_IS[fmt]
            buf = io.BytesIO()
            img.convert("RGBA").save(buf, format="PNG")
            return buf.getvalue(), "image/png"
    except NotAnImageError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError, ValueError) as exc:
        raise NotAnImageError(f"{path.name} is not a raster image ({type(exc).__name__}: {exc}); it is not served") from None


def _data_url(path: Path) -> str:
    data, mime = image_bytes(path)
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def mllm_messages(image_path: str | Path, class_names: list[str]) -> list[dict]:
    """The chat messages of evidence (A): the prompt and the image as an OpenAI-style data-URL part."""
    text = MLLM_PROMPT.format(n=len(class_names), names="; ".join(class_names))
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": _data_url(Path(image_path))}},
            ],
        }
    ]


def parse_mllm_answer(text: str, class_names: list[str]) -> dict:
    """``{label, in_list, id_class, description, raw}`` from the model's reply.

    The first JSON object in the reply is read; ``id_class`` is set when the label equals an ID
    class name (case-insensitive), whatever the model claimed in ``in_list``. Without JSON the raw
    text is the label.
    """
    label, description, claimed = text.strip(), "", None
    match = re.search(r"\{.*\}", text, flags=re.S)
    if match:
        try:
            obj = json.loads(match.group(0))
            label = str(obj.get("label", "")).strip() or label
            description = str(obj.get("description", "")).strip()
            claimed = obj.get("in_list")
        except (json.JSONDecodeError, AttributeError):
            pass
    lower = {n.lower(): i for i, n in enumerate(class_names)}
    id_class = lower.get(label.lower())
    return {
        "label": label,
        "in_list": id_class is not None,
        "claimed_in_list": claimed if isinstance(claimed, bool) else None,
        "id_class": id_class,
        "description": description,
        "raw": text,
    }


def describe_image(client: ChatClient, image_path: str | Path, class_names: list[str], **params) -> dict:
    """Evidence (A) for one image through an ``oodeval.llm.ChatClient`` (cached by the client)."""
    answer = client.complete(mllm_messages(image_path, class_names), **params)
    out = parse_mllm_answer(answer, class_names)
    out["model"] = getattr(client, "model", None)
    return out


def build_evidence(
    project: Project,
    image_embeddings: np.ndarray | None = None,
    text_embeddings: np.ndarray | None = None,
    top_k: int = 5,
    confusions_k: int = 5,
    client: ChatClient | None = None,
    image_url_template: str | None = None,
    force: bool = False,
    progress: bool = True,
    search_templates: dict[str, str] | None = None,
) -> dict[str, int]:
    """Write (or complete) the evidence JSON of every candidate of a :class:`~.candidates.Project`.

    image_embeddings: (len(manifest), E) rows aligned with the ID manifest; text_embeddings: (C, E).
    image_url_template: e.g. ``https://example.org/val/{path}``; a manifest column ``url`` wins.
    search_templates: service -> URL template with ``{url}`` (default :data:`REVERSE_SEARCH`).
    Pieces already present are kept unless ``force``. Returns how many images got each piece.
    """
    from tqdm import tqdm

    check_templates(image_url_template, search_templates)
    check_not_initialised(project.folder, "evidence")
    names = project.class_names
    if (image_embeddings is None) != (text_embeddings is None):
        raise InputError("evidence (D) needs both image embeddings and class text embeddings")
    topk_rows: dict[str, list[dict]] = {}
    index = project.manifest.index()
    if image_embeddings is not None:
        if image_embeddings.shape[0] != len(project.manifest):
            raise InputError(
                f"image embeddings have {image_embeddings.shape[0]} rows but the ID manifest has {len(project.manifest)}; "
                "they must be aligned row by row"
            )
        if names is not None and text_embeddings.shape[0] != len(names):
            raise InputError(f"text embeddings have {text_embeddings.shape[0]} rows but there are {len(names)} class names")
        rows = np.array([index[c.image] for c in project.candidates])
        idx, sims = vlm_topk(image_embeddings[rows], text_embeddings, top_k)
        for c, ii, ss in zip(project.candidates, idx, sims):
            topk_rows[c.image] = [{"label": int(i), "name": project.class_name(int(i)), "cosine": float(s)} for i, s in zip(ii, ss)]
    if client is not None and names is None:
        raise InputError("evidence (A) needs the ID class names (--classes when running `construct candidates`)")
    counts = confusion_counts(project.reannotation)
    done = dict.fromkeys(("written", "original", "vlm_topk", "confusions", "mllm", "reverse_search"), 0)
    project.evidence_dir.mkdir(parents=True, exist_ok=True)
    for c in tqdm(project.candidates, desc="evidence", unit="image", disable=not progress):
        old = {} if force else load_evidence(project.evidence_dir, c.image)
        ev = dict(old)
        ev["image"] = c.image
        ev["path"] = c.path
        ev["flag"] = c.flag
        ev["original"] = {"label": c.original_label, "name": c.original_name}
        if c.image in topk_rows:
            ev["vlm_topk"] = topk_rows[c.image]
        ev["confusions"] = [{"label": int(lab), "name": project.class_name(int(lab)), "count": int(n)} for lab, n in confusion_topk(counts, c.original_label, confusions_k)]
        url = project.manifest.extra[index[c.image]].get("url") or (image_url_template.format(path=c.path) if image_url_template else None)
        if url:
            ev["image_url"] = url
            ev["reverse_search"] = reverse_search_links(url, search_templates)
        if client is not None and "mllm" not in ev:
            ev["mllm"] = describe_image(client, project.manifest.resolve(c.path), names)
        if ev != old:
            write_json_atomic(evidence_file(project.evidence_dir, c.image), ev)
            done["written"] += 1
        for key in ("original", "vlm_topk", "confusions", "mllm", "reverse_search"):
            done[key] += bool(ev.get(key))
    return done
