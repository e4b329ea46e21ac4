"""AdaNeg (Zhang & Zhang, NeurIPS 2024, arXiv 2410.20149): test-time adaptive negative proxies.

The authors' release is the ``ttapromptnoadagap`` postprocessor of YBZh/OpenOOD-VLM
(openood/postprocessors/ttaprompt_postprocessor.py, class ``TTAPromptPostprocessor_noadagap``, commit
694592a7ac889ce9bd2d17c7f7592f142b1ce081), run by scripts/ood/adaneg/imagenet.sh (commit
804f3310d3045c24fdd896da6c508c919fb47f0c). Its maths, re-stated:

- One memory slot per label k of the K = C + M labels (ID names, then the negatives). A slot holds the
  label's text embedding t_k and up to ``memory_size - 1`` test-image embeddings (the release allocates
  1 + L rows, starts writing at row 1 and calls a slot full at row L, so L - 1 images fit beside t_k).
- Each batch is first scored statically: s0 = NegLabel's grouped Eq. 3 with G = ``n_groups`` groups.
  An image with s0 > thres + gap (1 - thres) goes to the slot of its top ID label, one with
  s0 < thres - gap thres to the slot of its top negative label, in batch order, ID candidates first;
  its entropy H = -sum p log(p + 1e-8) is that of the softmax over the ID logits (ID slot) or over
  the negative logits (negative slot). A full slot replaces its highest-entropy image when the new
  image's entropy is lower, else keeps what it has. (The release compares with all 1 + L entropies,
  the text row's and the never-written last row's zeros included; since its offset makes H slightly
  negative for near one-hot posteriors, H < ~1e-8, it can then overwrite the text embedding. Here
  the text row is never replaced, as the paper describes the memory.)
- Then the same batch (now in the memory) is scored with adaptive proxies: sample-adaptive (the
  ImageNet run, ``samada True``) p_k(x) = normalise(sum_j w_j m_kj) with w_j = exp(-beta (1 - m_kj'x))
  over the slot's rows m_k0 = t_k, m_k1.. (images); task-adaptive (``sample_adaptive=False``)
  p_k = normalise(t_k + sum_j m_kj). s1 = the grouped Eq. 3 of the logits x'p_k / tau.
- The score is s1 + lambda s0 (``in_score combine``).

Defaults from the ImageNet script: memory_size (memleng) = 10, thres = 0.5, gap = 0.5, beta = 5.5,
lambda = 0.1, G = 5 (random_permute True), batch size 256, tau = 0.01 (CLIP's logit scale 100; the
script's ``tau 1.0`` is not used by the score). The release permutes negatives with torch's seed-0
permutation; here, as in :class:`~oodeval.zeroshot.scorers.NegLabel`, ``numpy.random.default_rng(seed)``.

The evaluator of the release (openood/evaluators/fsood_evaluator_clip.py) resets the memory for
each OOD set and streams all ID test images together with that OOD set in one shuffled order;
:mod:`oodeval.zeroshot.testtime` states that protocol and varies it. The memory holds at most
K (memory_size - 1) image embeddings (a float64 pool grown on demand) plus a K x (L-1) x (L-1) Gram
matrix, so the proxies are never materialised per image: x'p_k and |p_k| come from dot products
with the stored images only (empty rows cost nothing).
"""

from __future__ import annotations

import numpy as np
from scipy.special import log_softmax

from .. import _arrays
from ..detectors.base import as_scores
from ..errors import InputError
from ..features import FeatureSet
from ..features.stream import iter_chunks
from ..params import BOOLEAN, POSITIVE, SEED, Integral, Interval, Real
from .scorers import ZeroShotScorer, _check_unit, _prepare, grouped_share, register

__all__ = ["AdaNeg", "MemoryBank"]


def _entropy(logits: np.ndarray) -> np.ndarray:
    """-sum p log(p + 1e-8) of softmax(logits) along the last axis (the release's entropy)."""
    p = np.exp(log_softmax(logits, axis=-1))
    return -(p * np.log(p + 1e-8)).sum(axis=-1)


class MemoryBank:
    """Per-label slots of test-image embeddings (AdaNeg's memory) for label embeddings ``text`` (K, E).

    Each slot keeps at most ``capacity`` images with their entropies. The images live in one pool of
    at most K * capacity rows (a replaced image's row is reused), with each row's dot product with its
    label's text embedding and, per slot, the Gram matrix of its images: what the proxies' norms need.
    """

    def __init__(self, text: np.ndarray, capacity: int) -> None:
        k, e = text.shape
        self.text = text
        self.capacity = capacity
        self.count = np.zeros(k, dtype=np.int64)
        self.rows = np.full((k, capacity), -1, dtype=np.int64)  # pool row of each stored image
        self.entropy = np.zeros((k, capacity))
        self.gram = np.zeros((k, capacity, capacity))  # m_kj . m_kj'
        self.pool = np.empty((0, e))
        self.gram_text = np.empty(0)  # t_slot . m of each pool row
        self.used = 0

    def _grow(self) -> None:
        size = max(64, 2 * len(self.pool))
        for name in ("pool", "gram_text"):
            old = getattr(self, name)
            new = np.zeros((size, *old.shape[1:]), dtype=old.dtype)
            new[: self.used] = old[: self.used]
            setattr(self, name, new)

    def _put(self, slot: int, j: int, x: np.ndarray, h: float, row: int) -> None:
        self.pool[row], self.gram_text[row] = x, self.text[slot] @ x
        self.rows[slot, j] = row
        self.entropy[slot, j] = h
        n = self.count[slot]
        g = self.pool[self.rows[slot, :n]] @ x
        self.gram[slot, j, :n] = g
        self.gram[slot, :n, j] = g

    def add(self, slot: int, x: np.ndarray, h: float) -> None:
        """Store ``x`` (entropy ``h``) in ``slot``: appended while there is room, else replacing the
        highest-entropy image when ``h`` is lower (the release's rule)."""
        n = self.count[slot]
        if n < self.capacity:
            if self.used == len(self.pool):
                self._grow()
            self.count[slot] = n + 1
            self._put(slot, n, x, h, self.used)
            self.used += 1
            return
        j = int(np.argmax(self.entropy[slot]))
        if h < self.entropy[slot, j]:
            self._put(slot, j, x, h, int(self.rows[slot, j]))

    def _layout(self):
        """The filled slots; their stored images' pool rows, slot by slot, and where each slot's run
        starts; and per number n of images held, the slots holding n (positions among the filled
        slots), their images' positions in that run (s, n) and their Gram matrices (s, n, n)."""
        filled = np.flatnonzero(self.count)
        counts = self.count[filled]
        starts = np.r_[0, np.cumsum(counts)[:-1]]
        entries = self.rows[filled][np.arange(self.capacity) < counts[:, None]]
        groups = []
        for n in np.unique(counts):
            sel = np.flatnonzero(counts == n)
            groups.append((sel, starts[sel][:, None] + np.arange(n), self.gram[filled[sel], :n, :n]))
        return filled, entries, starts, groups

    def proxy_cosines(self, x: np.ndarray, static: np.ndarray, beta: float, sample_adaptive: bool) -> np.ndarray:
        """cos(x, p_k) (rows of x against every slot's proxy), (N, K), written into ``static`` = x @ text.T.

        With w0 = w(t_k'x), w_e = w(m_e'x) (w = exp(-beta (1 - .)), or 1 task-adaptively):
        x'p_k = (w0 t_k'x + sum_e w_e m_e'x) / sqrt(w0^2 + 2 w0 sum_e w_e t_k'm_e + w'G_k w), G_k the
        Gram matrix of slot k's images. Worked with images along the first axis (rows of x along the last)."""
        if self.used == 0:
            return static
        filled, entries, starts, groups = self._layout()
        images, gram_text = self.pool[entries], self.gram_text[entries][:, None]
        rows = max(1, _arrays.CHUNK_ELEMENTS // max(1, 4 * entries.size))
        for start in range(0, len(x), rows):
            part = slice(start, start + rows)
            cos0 = static[part][:, filled].T
            cos = images @ x[part].T
            if sample_adaptive:
                w0, w = np.exp(-beta * (1.0 - cos0)), np.exp(-beta * (1.0 - cos))
            else:
                w0, w = np.ones_like(cos0), np.ones_like(cos)
            num = w0 * cos0 + np.add.reduceat(w * cos, starts, axis=0)
            cross = np.add.reduceat(w * gram_text, starts, axis=0)
            quad = np.empty_like(num)
            for sel, pos, gram in groups:
                wg = w[pos]  # (s, n, rows)
                quad[sel] = ((gram @ wg) * wg).sum(axis=1)
            static[part, filled] = (num / np.sqrt(w0**2 + 2.0 * w0 * cross + quad)).T
        return static


@register("adaneg", 11, vocabulary=True)
class AdaNeg(ZeroShotScorer):
    """AdaNeg: s1 + lambda s0 with a test-time memory of image embeddings (module docstring).

    A test-time scorer: ``score`` consumes its images as one stream, in row order, ``batch_size`` at a
    time, from an empty memory (state lives only inside the call). The ID:OOD stream of the paper's
    protocol is built by :func:`oodeval.zeroshot.testtime.score_pair`; ``id_share`` (None: the ID
    and OOD sets whole) is that protocol's ID:OOD mix where a grid runs the scorer
    (:meth:`oodeval.scorer_factory.Scorer.score_pair`; ``score`` itself takes the rows it is given).
    """

    label = "AdaNeg"
    test_time = True
    constraints = {
        "tau": POSITIVE, "n_groups": Interval(Integral, 1, None), "seed": SEED,
        "memory_size": Interval(Integral, 2, None), "thres": Interval(Real, 0, 1), "gap": Interval(Real, 0, 1),
        "beta": Interval(Real, 0, None), "lam": Interval(Real, 0, None), "sample_adaptive": BOOLEAN,
        "batch_size": Interval(Integral, 1, None), "id_share": (Interval(Real, 0, 1, closed="neither"), None),
    }  # fmt: skip

    def __init__(self, tau: float = 0.01, n_groups: int = 5, seed: int = 0, memory_size: int = 10, thres: float = 0.5,
                 gap: float = 0.5, beta: float = 5.5, lam: float = 0.1, sample_adaptive: bool = True,
                 batch_size: int = 256, id_share: float | None = None) -> None:
        self.tau = tau
        self.n_groups = n_groups
        self.seed = seed
        self.memory_size = memory_size
        self.thres = thres
        self.gap = gap
        self.beta = beta
        self.lam = lam
        self.sample_adaptive = sample_adaptive
        self.batch_size = batch_size
        self.id_share = id_share

    def score(self, image: FeatureSet | np.ndarray, id_text: np.ndarray, negatives: np.ndarray | None = None,
              normalize: bool = False) -> np.ndarray:
        """float64 (N,) scores of the rows of ``image`` taken as one stream in row order."""
        if isinstance(image, FeatureSet):
            image = image.features
        self.check_params()
        id_text = _check_unit("text embeddings", id_text, 2)
        if id_text.shape[0] == 0:
            raise InputError("no text embeddings (0 labels)")
        e = id_text.shape[1]
        negatives = (np.zeros((0, e)) if negatives is None or np.size(negatives) == 0
                     else _check_unit("negative text embeddings", negatives, 2))
        if negatives.shape[1] != e or np.shape(image)[-1] != e:
            raise InputError(f"image embeddings have dim {np.shape(image)[-1]}, text embeddings {e}, negatives {negatives.shape[1]}")
        text = np.concatenate([id_text, negatives])
        bank = MemoryBank(text, int(self.memory_size) - 1)
        n = len(image)
        out = np.empty(n)
        for part, chunk in iter_chunks({"features": image}, int(self.batch_size)):
            x = _prepare("image embeddings", chunk["features"], normalize)
            out[part] = self._batch(bank, x, len(id_text))
        return as_scores(out, n, type(self).__name__)

    def _batch(self, bank: MemoryBank, x: np.ndarray, c: int) -> np.ndarray:
        """Scores of one batch: static score, memory update, then the adaptive score."""
        cos = x @ bank.text.T
        logits = cos / self.tau
        s0 = grouped_share(logits[:, :c], logits[:, c:], self.n_groups, self.seed)
        hi = self.thres + self.gap * (1.0 - self.thres)
        lo = self.thres - self.gap * self.thres
        for rows, part, offset in ((s0 > hi, slice(0, c), 0), (s0 < lo, slice(c, None), c)):
            idx = np.flatnonzero(rows)
            if idx.size and logits.shape[1] > offset:
                sub = logits[idx, part]
                for i, slot, h in zip(idx, offset + np.argmax(sub, axis=1), _entropy(sub)):
                    bank.add(int(slot), x[i], float(h))
        ada = bank.proxy_cosines(x, cos, self.beta, bool(self.sample_adaptive))  # in place: cos is not used again
        ada /= self.tau
        s1 = grouped_share(ada[:, :c], ada[:, c:], self.n_groups, self.seed)
        return s1 + self.lam * s0
