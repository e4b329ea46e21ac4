"""LLM prompt sets as replaceable files (TOML; format in ``prompts/default.toml``, ours shipped as the default).

``load_prompts(path=None, needed=())`` returns the prompts as a flat dict (``siblings``,
``eoe.far.first``, ``eoe.far.again``, ``eoe.fine_grained.first``, ``eoe.fine_grained.again``,
``eoe.near.first``). Each prompt may use only the placeholders of its slot; an unknown placeholder, a
malformed brace or a missing needed prompt is a ValueError naming the file and key, so a user's file
(e.g. EOE's released prompts) is checked before any request is sent.
"""

from __future__ import annotations

import string
import tomllib
from pathlib import Path

from ..errors import InputError

__all__ = ["DEFAULT_PROMPTS", "DEFAULT_NAME", "PLACEHOLDERS", "load_prompts", "prompts_provenance"]

DEFAULT_PROMPTS = Path(__file__).with_name("prompts") / "default.toml"
#: the ``prompt_file`` a vocabulary records when it was generated with oodeval's own wording
DEFAULT_NAME = "oodeval default"

_SET = ("n_id", "id_names", "batch")
#: the placeholders each prompt slot may use
PLACEHOLDERS: dict[str, tuple[str, ...]] = {
    "siblings": ("name", "k"),
    "eoe.far.first": _SET, "eoe.far.again": _SET,
    "eoe.fine_grained.first": _SET, "eoe.fine_grained.again": _SET,
    "eoe.near.first": ("name", "batch"),
}  # fmt: skip


def _flatten(data: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        out.update(_flatten(value, f"{name}.") if isinstance(value, dict) else {name: value})
    return out


def load_prompts(path: str | Path | None = None, needed: tuple[str, ...] = ()) -> dict[str, str]:
    """The validated prompts of ``path`` (default: ours), flattened to ``{slot: text}``."""
    path = Path(path) if path is not None else DEFAULT_PROMPTS
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    try:
        flat = _flatten(tomllib.loads(path.read_text()))
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"prompt file {path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(flat) - set(PLACEHOLDERS))
    if unknown:
        raise InputError(f"prompt file {path}: unknown prompt keys {unknown}; known: {sorted(PLACEHOLDERS)}")
    missing = [k for k in needed if k not in flat]
    if missing:
        raise InputError(f"prompt file {path} has no {', '.join(missing)}")
    for key, text in flat.items():
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"prompt file {path}: {key} must be a non-empty string")
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
        except ValueError as exc:
            raise InputError(f"prompt file {path}: {key} has a malformed placeholder ({exc}); write {{{{ and }}}} for literal braces") from exc
        bad = sorted(fields - set(PLACEHOLDERS[key]))
        if bad:
            raise InputError(f"prompt file {path}: {key} uses placeholders {bad}; allowed: {list(PLACEHOLDERS[key])}")
    return {k: str(v) for k, v in flat.items()}


def prompts_provenance(path: str | Path | None, keys: tuple[str, ...]) -> dict:
    """What to record with a vocabulary: the prompt file and the exact prompt texts used."""
    texts = load_prompts(path, keys)
    return {"prompt_file": str(path) if path is not None else DEFAULT_NAME, "prompts": {k: texts[k] for k in keys}}
