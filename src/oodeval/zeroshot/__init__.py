"""Zero-shot VLM OOD detection: label embeddings, negative vocabularies, and scorers (paper Sec. 4.1, 4.4).

Light to import; torch / open_clip are imported only by the functions that encode text.
"""

from .scorers import REGISTRY, ZeroShotScorer, create_scorer, register, score_zeroshot, scorer_names, similarity_logits
from .vocabulary import Vocabulary, oracle, union
from . import adaneg, csp  # noqa: E402,F401 - register AdaNeg and CSP

__all__ = [
    "REGISTRY", "ZeroShotScorer", "create_scorer", "scorer_names", "register", "score_zeroshot", "similarity_logits",
    "Vocabulary", "oracle", "union",
]  # fmt: skip
