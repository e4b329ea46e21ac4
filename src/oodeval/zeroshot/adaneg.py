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
A batch's scores are worked in blocks of 128 images, images along the rows (x @ labels', the faster
orientation of the product), one block per core with BLAS held to one thread. While 2.01 / tau <= 600
the logits are exponentiated as they are (no shift: |l| <= 300), the grouped sums are sums of those
exponentials and an entropy's softmax is the exponentials over their sum (no second pass of exp).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
from scipy.special import log_softmax

from .._blas import one_blas_thread
from ..detectors.base import as_scores
from ..errors import InputError
from ..features import FeatureSet
from ..features.stream import iter_chunks
from ..params import BOOLEAN, POSITIVE, SEED, Integral, Interval, Real
from .scorers import ZeroShotScorer, _check_unit, _prepare, negative_groups, register, share_of_groups

__all__ = ["AdaNeg", "MemoryBank"]

#: images per block of a batch: a block's products (BLAS held to one thread) and its passes over them run on
#: one core, the blocks of a batch on all cores; a fixed size, so the scores do not depend on the thread count
_BLOCK_ROWS = 128
#: float64 values per work array in the proxies' loop (8 MB, whatever the memory's size)
_CACHE_ELEMENTS = 1048576
#: logits are exponentiated directly, unshifted (sums of exponentials, no log-sum-exp per group), while
#: their possible spread, 2.01 / tau for cosines of unit vectors (norms within 1e-3), is at most this:
#: then |l| <= 1.002 / tau <= 300, and exp(+-300) and the sums of K of them are normal, finite floats
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

    def groups(self) -> list:
        """(slots, their images (s, n, E)) of every set of slots holding the same number n of images:
        the full slots (a view of ``full``), then the filling ones by n (gathered from the pool)."""
        out = [(self.full_slots, self.full[: len(self.full_slots)])] if len(self.full_slots) else []
        filling = np.flatnonzero((self.count > 0) & (self.full_at < 0))
        counts = self.count[filling]
        for n in np.unique(counts):
            slots = filling[counts == n]
            out.append((slots, self.pool[self.rows[slots, :n]]))
        return out

    def proxy_cosines(self, x: np.ndarray, text_cos: np.ndarray, beta: float, sample_adaptive: bool, scale: float = 1.0,
                      groups: list | None = None):
        """(slots, cosines (N, slots)): cos(x, p_k) of each row of x and every slot k holding images;
        ``text_cos * scale`` = x @ text.T (N, K) (the other slots' proxies are their text embeddings);
        ``groups``: :meth:`groups`, when the caller took it already.

        With w0 = w(t_k'x), w_j = w(m_kj'x) (w = exp(beta (. - 1)), or 1 task-adaptively):
        x'p_k = (w0 t_k'x + sum_j w_j m_kj'x) / sqrt(w0^2 t_k't_k + 2 w0 sum_j w_j t_k'm_kj + w'G_k w),
        G_k the Gram matrix of slot k's images. The ratio does not change when all of a slot's weights
        share a factor, so exp(-beta) is left out (:func:`_weights`). Worked per group of slots with the
        same number n of images, as (rows of x, slots, n) arrays of bounded size."""
        groups = self.groups() if groups is None else groups
        held = np.concatenate([g[0] for g in groups]) if groups else np.empty(0, dtype=np.int64)
        r = len(x)
        out = np.empty((r, len(held)))
        done = 0
        for slots, images in groups:
            n, e = images.shape[1:]
            step = max(1, _CACHE_ELEMENTS // (n * max(r, 1)))  # slots at a time: bounded work arrays
            for a in range(0, len(slots), step):
                sl = slots[a : a + step]
                c = (x @ images[a : a + step].reshape(-1, e).T).reshape(r, len(sl), n)  # m_kj'x
                c0 = text_cos[:, sl] * scale  # t_k'x
                w0, w = _weights(c0, beta, sample_adaptive), _weights(c, beta, sample_adaptive)
                num = w0 * c0 + np.einsum("rsn,rsn->rs", w, c)
                ws = w.transpose(1, 0, 2)  # (slots, rows, n): one (rows, n) @ (n, n) product per slot
                quad = np.einsum("srn,srn->rs", ws @ self.gram[sl, :n, :n], ws)  # w'G_k w
                cross = np.einsum("rsn,sn->rs", w, self.gram_text[sl, :n])
                norm2 = w0 * (w0 * self.text_norm2[sl] + 2.0 * cross) + quad
                np.divide(num, np.sqrt(norm2), out=out[:, done + a : done + a + len(sl)])
            done += len(slots)
        return held, out


def _group_sums(exps: np.ndarray, c: int, groups: int, keep: int) -> np.ndarray:
    """(N, 1 + G) sums of exponentials (N, K) over the C ID labels (column 0) and over each run of
    keep / G negatives in group order (column 1 + g); the dropped negatives in none."""
    out = np.empty((len(exps), 1 + groups))
    exps[:, :c].sum(axis=1, out=out[:, 0])
    exps[:, c : c + keep].reshape(len(exps), groups, keep // groups).sum(axis=2, out=out[:, 1:])
    return out


def _share_of_sums(sums: np.ndarray) -> np.ndarray:
    """Mean over groups of a_ID / (a_ID + a_g), from the (N, 1 + G) sums of exponentials."""
    return (sums[:, :1] / (sums[:, :1] + sums[:, 1:])).mean(axis=1)


def _entropy_of(exps: np.ndarray, total: np.ndarray) -> np.ndarray:
    """The release's entropy -sum p log(p + 1e-8) of p = exps / total (rows: softmax's exponentials, their sums)."""
    p = exps / total[:, None]
    h = np.add(p, 1e-8)
    np.log(h, out=h)
    h *= p
    return -h.sum(axis=1)


def _weights(cos: np.ndarray, beta: float, sample_adaptive: bool) -> np.ndarray:
    """exp(beta (cos - 1)) up to a factor shared by all (sample-adaptive), else ones: exp(beta cos)
    while beta <= :data:`_EXP_SPAN` / 2.01 (then within exp(+-300), normal floats), else exp(beta cos - beta)."""
    if not sample_adaptive:
        return np.ones_like(cos)
    w = np.multiply(cos, beta)
    if 2.01 * beta > _EXP_SPAN:
        w -= beta
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
        direct = bool(groups) and 2.01 / self.tau <= _EXP_SPAN
        lay = _Layout(c, groups, len(order), at_negative, text / self.tau, direct)
        n = len(image)
        out = np.empty(n)
        with one_blas_thread() as threads, ThreadPoolExecutor(max(1, min(threads, os.cpu_count() or 1))) as pool:
            for part, chunk in iter_chunks({"features": image}, int(self.batch_size)):
                x = _prepare("image embeddings", chunk["features"], normalize)
                out[part] = self._batch(bank, x, lay, pool)
        return as_scores(out, n, type(self).__name__)

    def _batch(self, bank: MemoryBank, x: np.ndarray, lay: _Layout, pool: ThreadPoolExecutor) -> np.ndarray:
        """Scores of one batch: static score, memory update, then the adaptive score, each score
        worked per block of :data:`_BLOCK_ROWS` images (images along the first axis, labels along
        the last), the blocks on the pool's threads."""
        blocks = [slice(a, min(a + _BLOCK_ROWS, len(x))) for a in range(0, len(x), _BLOCK_ROWS)]
        static = list(pool.map(lambda sl: self._static(x[sl], lay), blocks))  # noqa: B023 - consumed at once
        slots, rows, ent = [], [], []
        for i in (0, 1):  # the ID candidates of the batch, in batch order, then the negative ones
            for sl, part in zip(blocks, static):
                slots.append(part[3 + i][0])
                rows.append(part[3 + i][1] + sl.start)
                ent.append(part[3 + i][2])
        idx = np.concatenate(rows)
        if idx.size:
            bank.add_many(np.concatenate(slots), x[idx], np.concatenate(ent))
        groups = bank.groups()
        parts = pool.map(lambda sl, part: self._adaptive(bank, groups, x[sl], part, lay), blocks, static)  # noqa: B023
        return np.concatenate(list(parts))

    def _static(self, x: np.ndarray, lay: _Layout):
        """(logits, exponentials or None, s0, (slots, rows, entropies) of the ID candidates, the same of
        the negative ones) of a block of images. While ``lay.direct`` the logits are exponentiated as
        they are (|l| <= 1.002 / tau <= 300: normal floats, finite sums), the grouped sums taken of the
        exponentials, and the softmax of an entropy is the exponentials over their sum."""
        logits = x @ lay.scaled.T
        c = lay.c
        exps = None
        if lay.direct:
            exps = np.exp(logits)
            sums = _group_sums(exps, c, lay.groups, lay.keep)
            s0 = _share_of_sums(sums)
        else:
            s0 = _share(logits, lay)
        hi = self.thres + self.gap * (1.0 - self.thres)
        lo = self.thres - self.gap * self.thres
        idx = np.flatnonzero(s0 > hi)  # to the top ID label's slot
        ent = _entropy_of(exps[idx, :c], sums[idx, 0]) if exps is not None else _entropy(logits[idx, :c])
        to_id = (np.argmax(logits[idx, :c], axis=1), idx, ent)
        idx = np.flatnonzero(s0 < lo) if len(lay.at_negative) else np.empty(0, dtype=np.int64)
        if not idx.size:
            return logits, exps, s0, to_id, (idx, idx, np.empty(0))
        # to the top negative's slot, the negatives in vocabulary order (the entropy does not depend on the order)
        ent = (_entropy_of(exps[idx, c:], exps[idx, c:].sum(axis=1)) if exps is not None
               else _entropy(logits[idx, c:]))
        to_neg = (lay.at_negative[np.argmax(logits[np.ix_(idx, lay.at_negative)], axis=1)], idx, ent)
        return logits, exps, s0, to_id, to_neg

    def _adaptive(self, bank: MemoryBank, groups: list, x: np.ndarray, static: tuple, lay: _Layout) -> np.ndarray:
        """s1 + lambda s0 of a block of images from its :meth:`_static` part, after the memory update:
        the labels without images keep their static logits (exponentials)."""
        logits, exps, s0 = static[:3]
        held, ada = bank.proxy_cosines(x, logits, self.beta, bool(self.sample_adaptive), self.tau, groups)
        ada /= self.tau
        if exps is not None:
            exps[:, held] = np.exp(ada, out=ada)
            return _share_of_sums(_group_sums(exps, lay.c, lay.groups, lay.keep)) + self.lam * s0
        logits[:, held] = ada
        return _share(logits, lay) + self.lam * s0


class _Layout(NamedTuple):
    """The labels of one :meth:`AdaNeg.score` call: C ID labels, G groups of keep / G negatives in group
    order (then the dropped ones), the slot of each negative in vocabulary order, the label embeddings
    over tau, and whether the logits are exponentiated directly."""

    c: int
    groups: int
    keep: int
    at_negative: np.ndarray
    scaled: np.ndarray
    direct: bool


def _share(logits: np.ndarray, lay: _Layout) -> np.ndarray:
    """The grouped Eq. 3 of logits (N, K) per group's log-sum-exp; the negatives are in group order already."""
    if lay.groups == 0:
        return np.ones(len(logits))
    grouped = logits[:, lay.c : lay.c + lay.keep].reshape(len(logits), lay.groups, lay.keep // lay.groups)
    return share_of_groups(logits[:, : lay.c], grouped)
