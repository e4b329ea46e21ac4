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
:mod:`oodeval.zeroshot.testtime` states that protocol and varies it.

Computation (the same float64 maths, arranged for speed): the memory holds at most K (memory_size - 1)
image embeddings plus, per label, the Gram matrix of its images and their dot products with t_k, kept
up to date as images arrive, so the proxies are never materialised per image: x'p_k and |p_k| come from
the dot products of x with the label's stored images only (labels with an empty slot keep s0's
logit). Full slots live in one contiguous (slots, memory_size - 1, E) block, the others in a compact
pool; the memory is updated for a batch in rounds (the r-th candidate of every label at once, in batch
order within a label, labels being independent). The negatives are laid out once in group order,
so neither grouped score gathers columns; s0's logits are reused by s1 for the labels without images.
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
from .scorers import ZeroShotScorer, _check_unit, _prepare, negative_groups, register, share_of_groups

__all__ = ["AdaNeg", "MemoryBank"]

#: float64 values per work array in the proxies' loop (8 MB, whatever the memory's size)
_CACHE_ELEMENTS = 1048576
#: exponentials of logits shifted by each image's largest static logit are taken directly (sums of
#: exponentials, no log-sum-exp per group) while the logits' possible spread, 2.01 / tau for cosines of
#: unit vectors (norms within 1e-3), is at most this: exp(-600) is still a normal float64, exp(600) finite
_EXP_SPAN = 600.0


def _entropy(logits: np.ndarray) -> np.ndarray:
    """-sum p log(p + 1e-8) of softmax(logits) along the last axis (the release's entropy)."""
    p = np.exp(log_softmax(logits, axis=-1))
    return -(p * np.log(p + 1e-8)).sum(axis=-1)


def _occurrence(keys: np.ndarray) -> np.ndarray:
    """For each element, how many earlier elements have the same key (0 for the first)."""
    order = np.argsort(keys, kind="stable")
    ranked = keys[order]
    pos = np.arange(len(keys))
    first = np.maximum.accumulate(np.where(np.r_[True, ranked[1:] != ranked[:-1]], pos, 0))
    out = np.empty_like(pos)
    out[order] = pos - first
    return out


class MemoryBank:
    """Per-label slots of test-image embeddings (AdaNeg's memory) for label embeddings ``text`` (K, E).

    Each slot keeps at most ``capacity`` images with their entropies, its Gram matrix ``gram`` (K, capacity,
    capacity) and the images' dot products with its label, ``gram_text`` (K, capacity). A full slot's
    images are a row of ``full`` (slots, capacity, E); a filling slot's are rows ``rows[k, :count[k]]`` of
    ``pool`` (rows freed when the slot fills up are reused).
    """

    def __init__(self, text: np.ndarray, capacity: int) -> None:
        k, e = text.shape
        self.text = text
        self.text_norm2 = np.einsum("ke,ke->k", text, text)
        self.capacity = capacity
        self.count = np.zeros(k, dtype=np.int64)
        self.entropy = np.zeros((k, capacity))
        self.gram = np.zeros((k, capacity, capacity))  # m_kj . m_kj'
        self.gram_text = np.zeros((k, capacity))  # t_k . m_kj
        self.rows = np.full((k, capacity), -1, dtype=np.int64)  # pool row of each image of a filling slot
        self.pool = np.empty((0, e))
        self.free = np.empty(0, dtype=np.int64)  # pool rows to reuse, taken from the end
        self.top = 0  # pool rows ever handed out
        self.full = np.empty((0, capacity, e))
        self.full_slots = np.empty(0, dtype=np.int64)
        self.full_at = np.full(k, -1, dtype=np.int64)  # position of a full slot in ``full``

    @property
    def used(self) -> int:
        """Images held."""
        return int(self.count.sum())

    def images(self, slot: int) -> np.ndarray:
        """The images stored for ``slot`` (count, E), in slot order."""
        if self.full_at[slot] >= 0:
            return self.full[self.full_at[slot]]
        return self.pool[self.rows[slot, : self.count[slot]]]

    def add(self, slot: int, x: np.ndarray, h: float) -> None:
        """Store ``x`` (entropy ``h``) in ``slot``: appended while there is room, else replacing the
        highest-entropy image when ``h`` is lower (the release's rule)."""
        self.add_many(np.array([slot]), np.asarray(x, dtype=np.float64)[None], np.array([h], dtype=np.float64))

    def add_many(self, slots: np.ndarray, x: np.ndarray, h: np.ndarray) -> None:
        """``add`` of each (slot, row of x, h) in order: round r stores the r-th image of every slot at
        once (a slot's images in their order; different slots do not interact)."""
        rank = _occurrence(slots)
        for r in range(int(rank.max(initial=-1)) + 1):
            sel = np.flatnonzero(rank == r)
            self._round(slots[sel], x[sel], h[sel])

    def _take_rows(self, n: int) -> np.ndarray:
        reuse = self.free[len(self.free) - min(n, len(self.free)) :]
        self.free = self.free[: len(self.free) - len(reuse)]
        fresh = np.arange(self.top, self.top + n - len(reuse))
        self.top += len(fresh)
        if self.top > len(self.pool):
            self.pool = _grown(self.pool, self.top)
        return np.r_[reuse, fresh].astype(np.int64)

    def _set_gram(self, slots: np.ndarray, j: np.ndarray, x: np.ndarray, stored: np.ndarray) -> None:
        """Row and column j of the slots' Gram matrices from the stored images (s, capacity, E),
        image j being x; entries of images not yet stored are 0."""
        g = np.einsum("sce,se->sc", stored, x)
        g[np.arange(self.capacity) >= self.count[slots][:, None]] = 0.0
        self.gram[slots, j, :] = g
        self.gram[slots, :, j] = g
        self.gram_text[slots, j] = np.einsum("se,se->s", self.text[slots], x)

    def _round(self, slots: np.ndarray, x: np.ndarray, h: np.ndarray) -> None:
        """Store one image in each of the distinct ``slots``."""
        n = self.count[slots]
        grow = n < self.capacity
        if grow.any():
            s, j, xs = slots[grow], n[grow], x[grow]
            rows = self._take_rows(len(s))
            self.pool[rows] = xs
            self.rows[s, j] = rows
            self.entropy[s, j] = h[grow]
            self.count[s] += 1
            self._set_gram(s, j, xs, self.pool[self.rows[s]])
            self._promote(s[self.count[s] == self.capacity])
        full = ~grow
        if full.any():
            s, xs, hs = slots[full], x[full], h[full]
            j = np.argmax(self.entropy[s], axis=1)
            better = hs < self.entropy[s, j]
            s, j, xs = s[better], j[better], xs[better]
            at = self.full_at[s]
            self.full[at, j] = xs
            self.entropy[s, j] = hs[better]
            self._set_gram(s, j, xs, self.full[at])

    def _promote(self, slots: np.ndarray) -> None:
        """Move slots that just filled up from the pool to ``full``."""
        if not len(slots):
            return
        at = np.arange(len(self.full_slots), len(self.full_slots) + len(slots))
        if at[-1] >= len(self.full):
            self.full = _grown(self.full, at[-1] + 1)
        self.full[at] = self.pool[self.rows[slots]]
        self.full_slots = np.r_[self.full_slots, slots]
        self.full_at[slots] = at
        self.free = np.r_[self.free, self.rows[slots].ravel()]
        self.rows[slots] = -1

    def _groups(self):
        """(slots, their images (s, n, E)) of every set of slots holding the same number n of images:
        the full slots (a view of ``full``), then the filling ones by n (gathered from the pool)."""
        out = [(self.full_slots, self.full[: len(self.full_slots)])] if len(self.full_slots) else []
        filling = np.flatnonzero((self.count > 0) & (self.full_at < 0))
        counts = self.count[filling]
        for n in np.unique(counts):
            slots = filling[counts == n]
            out.append((slots, self.pool[self.rows[slots, :n]]))
        return out

    def proxy_cosines(self, x: np.ndarray, cos_t: np.ndarray, beta: float, sample_adaptive: bool):
        """(slots, cosines (slots, N)): cos(x, p_k) of every slot k holding images and each row of x;
        ``cos_t`` = text @ x.T (the other slots' proxies are their text embeddings).

        With w0 = w(t_k'x), w_j = w(m_kj'x) (w = exp(-beta (1 - .)), or 1 task-adaptively):
        x'p_k = (w0 t_k'x + sum_j w_j m_kj'x) / sqrt(w0^2 t_k't_k + 2 w0 sum_j w_j t_k'm_kj + w'G_k w),
        G_k the Gram matrix of slot k's images. Worked per group of slots with the same number n of
        images, as (slots, n, rows of x) arrays."""
        groups = self._groups()
        held = np.concatenate([g[0] for g in groups]) if groups else np.empty(0, dtype=np.int64)
        out = np.empty((len(held), len(x)))
        rows = min(len(x), 1024)
        done = 0
        for slots, images in groups:
            n, e = images.shape[1:]
            step = max(1, _CACHE_ELEMENTS // (n * rows))  # slots at a time: bounded work arrays
            for a in range(0, len(slots), step):
                sl = slots[a : a + step]
                at = slice(done + a, done + a + len(sl))
                flat = images[a : a + step].reshape(-1, e)
                gram, gram_text, tt = self.gram[sl, :n, :n], self.gram_text[sl, None, :n], self.text_norm2[sl, None]
                for start in range(0, len(x), rows):
                    part = slice(start, start + rows)
                    c = (flat @ x[part].T).reshape(len(sl), n, -1)  # m_kj'x
                    c0 = cos_t[sl, part]  # t_k'x
                    w0, w = _weights(c0, beta, sample_adaptive), _weights(c, beta, sample_adaptive)
                    num = w0 * c0 + np.einsum("snr,snr->sr", w, c)
                    norm2 = w0 * (w0 * tt + 2.0 * (gram_text @ w)[:, 0]) + np.einsum("snr,snr->sr", gram @ w, w)
                    np.divide(num, np.sqrt(norm2), out=out[at, part])
            done += len(slots)
        return held, out


def _members(c: int, k: int, groups: int, keep: int) -> np.ndarray:
    """(K, 1 + G) float64 indicator of the grouped Eq. 3's sums: column 0 the C ID labels, column 1 + g
    the g-th run of keep / G negatives (in group order, after the ID labels); dropped negatives in none."""
    out = np.zeros((k, 1 + groups))
    out[:c, 0] = 1.0
    out[np.arange(c, c + keep), 1 + np.arange(keep) // (keep // groups)] = 1.0
    return out


def _share_of_sums(sums: np.ndarray) -> np.ndarray:
    """Mean over groups of a_ID / (a_ID + a_g), from the (N, 1 + G) sums of exponentials."""
    return (sums[:, :1] / (sums[:, :1] + sums[:, 1:])).mean(axis=1)


def _weights(cos: np.ndarray, beta: float, sample_adaptive: bool) -> np.ndarray:
    """exp(-beta (1 - cos)) (sample-adaptive), else ones."""
    if not sample_adaptive:
        return np.ones_like(cos)
    w = np.subtract(cos, 1.0)
    w *= beta
    return np.exp(w, out=w)


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    """``a`` with at least ``size`` rows (zeros after the old ones), doubling."""
    new = np.zeros((max(64, size, 2 * len(a)), *a.shape[1:]), dtype=a.dtype)
    new[: len(a)] = a
    return new


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
        c, m = len(id_text), len(negatives)
        groups, order = negative_groups(m, self.n_groups, self.seed) if m else (0, np.empty(0, dtype=np.int64))
        # the negatives laid out in group order (kept ones permuted, then the dropped ones): a slot is a
        # label in this layout; at_negative[j] is the slot of negative j (vocabulary order)
        layout = np.r_[order, np.arange(len(order), m)].astype(np.int64)
        at_negative = np.empty(m, dtype=np.int64)
        at_negative[layout] = c + np.arange(m)
        text = np.concatenate([id_text, negatives[layout]])
        bank = MemoryBank(text, int(self.memory_size) - 1)
        members = _members(c, len(text), groups, len(order)) if groups and 2.01 / self.tau <= _EXP_SPAN else None
        n = len(image)
        out = np.empty(n)
        for part, chunk in iter_chunks({"features": image}, int(self.batch_size)):
            x = _prepare("image embeddings", chunk["features"], normalize)
            out[part] = self._batch(bank, x, c, groups, len(order), at_negative, members)
        return as_scores(out, n, type(self).__name__)

    def _batch(self, bank: MemoryBank, x: np.ndarray, c: int, groups: int, keep: int,
               at_negative: np.ndarray, members: np.ndarray | None) -> np.ndarray:
        """Scores of one batch: static score, memory update, then the adaptive score. Worked with labels
        along the first axis and the batch's images along the last. With ``members`` (:func:`_members`)
        the grouped sums are products of the exponentials with it, and the adaptive score reuses the
        static exponentials of the labels without images."""
        cos_t = bank.text @ x.T
        logits = cos_t / self.tau
        b = len(x)

        def share(logits):  # the grouped Eq. 3; the negatives are in group order already
            if groups == 0:
                return np.ones(b)
            return share_of_groups(logits[:c].T, logits[c : c + keep].reshape(groups, keep // groups, b).transpose(2, 0, 1))

        if members is not None:
            shift = logits.max(axis=0)
            exps = np.exp(logits - shift)
            s0 = _share_of_sums(exps.T @ members)
        else:
            s0 = share(logits)
        hi = self.thres + self.gap * (1.0 - self.thres)
        lo = self.thres - self.gap * self.thres
        slots, rows, ent = [], [], []
        idx = np.flatnonzero(s0 > hi)
        if idx.size:  # to the top ID label's slot
            sub = logits[:c, idx].T
            slots.append(np.argmax(sub, axis=1))
            rows.append(idx)
            ent.append(_entropy(sub))
        idx = np.flatnonzero(s0 < lo)
        if idx.size and len(at_negative):  # to the top negative's slot, the negatives in vocabulary order
            sub = logits[np.ix_(at_negative, idx)].T
            slots.append(at_negative[np.argmax(sub, axis=1)])
            rows.append(idx)
            ent.append(_entropy(sub))
        if slots:
            idx = np.concatenate(rows)
            bank.add_many(np.concatenate(slots), x[idx], np.concatenate(ent))
        held, ada = bank.proxy_cosines(x, cos_t, self.beta, bool(self.sample_adaptive))
        if members is not None:  # the labels without images keep s0's exponentials
            kept = members.copy()
            kept[held] = 0.0
            ada /= self.tau
            ada -= shift
            sums = exps.T @ kept + np.exp(ada, out=ada).T @ members[held]
            return _share_of_sums(sums) + self.lam * s0
        logits[held] = ada / self.tau  # the labels without images keep s0's logits
        return share(logits) + self.lam * s0
