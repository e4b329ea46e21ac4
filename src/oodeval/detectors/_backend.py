"""Where and in what precision the detectors' dense products run: numpy or torch, float32 or float64.

``precision="float32"`` (every detector's default): matrix products in float32 (sgemm), and every
reduction that becomes a score or a fitted statistic (row sums, norms, log-sum-exp, scatter
matrices, means) accumulated in float64, or, where a detector says so, in float32 runs of
:data:`RUN` entries whose sums are added in float64 (:meth:`Compute.runsum`: for sums of centred
values or of magnitudes, whose error that bounds relative to the sum of the terms' magnitudes);
scores come back float64. ``"float64"``: everything in
float64 (the reference path). ``device=None`` (default) computes with numpy; ``"cpu"``, ``"cuda"``
or ``"cuda:N"`` with torch on that device, in row chunks whose size is fixed by
:data:`TORCH_CHUNK_ELEMENTS`, so the device memory needed does not grow with N.

``Compute(precision, device)`` is the numpy or the torch backend (as ``pathlib.Path`` is a
``PosixPath`` or a ``WindowsPath``): the detectors call its operations and never branch on which
one it is. Nothing a call does outlives it: the numpy backend's worker threads are started and
joined within each :meth:`Compute.by_rows` call, BLAS's thread count (process-wide, as BLAS's
setting is) is held to one only while such a call runs and is then restored, and scratch buffers
are dropped when the call returns. Why each hand-written part is there, with its measurements:
docs/performance.md.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from .._extras import optional
from .._arrays import chunk_rows
from .._blas import one_blas_thread
from ..errors import InputError

__all__ = ["Compute", "one_blas_thread", "PRECISIONS", "TORCH_CHUNK_ELEMENTS"]

PRECISIONS = ("float32", "float64")
#: values per row chunk on a torch device (64M: 256 MB of float32 per chunk operand)
TORCH_CHUNK_ELEMENTS = 64_000_000
#: rows per block in :meth:`Compute.by_rows` (512 x 1000 float32: 2 MB, about a core's cache)
PARALLEL_ROWS = 512
#: largest value that numpy's softmax sums exponentiate unshifted (float32 exp overflows past 88.7)
UNSHIFTED_MAX = 80.0
#: entries per float32 partial sum of :meth:`Compute.runsum` and :meth:`Compute.rundot` (each run's
#: sum is off by at most about RUN u of the sum of its terms' magnitudes, u = 2^-24: 3.8e-6)
RUN = 64
#: a row whose max lies further below its block's shift gets its own (float32 exp underflows
#: below -87.3; terms that far below the row's max, exp(-47) of it, are below float64's resolution)
UNDERFLOW_MARGIN = 40.0
#: rows per sub-block of :meth:`Compute.centred_unit` (64 x 1024 float64: 512 KB)
UNIT_ROWS = 64


@dataclass(frozen=True)
class Compute:
    """A precision and a device; ``put`` moves a host array there, ``get`` brings a result back
    as float64 numpy, and the row reductions accumulate in float64 on either backend.
    ``Compute(...)`` returns the numpy backend for ``device=None``, else the torch one."""

    precision: str = "float32"
    device: str | None = None

    def __new__(cls, precision: str = "float32", device: str | None = None):
        if cls is Compute:
            cls = _NumpyCompute if device is None else _TorchCompute
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise InputError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")

    def chunks(self, n: int, width: int) -> Iterator[slice]:
        """Consecutive row slices of :meth:`rows` (``width``) rows covering ``n`` rows."""
        step = self.rows(width)
        for start in range(0, n, step):
            yield slice(start, min(n, start + step))

    def rownorm(self, a):
        """Euclidean row norms, accumulated in float64."""
        return self.rowdot(a, a) ** 0.5

    def normalise(self, a, eps: float = 1e-12):
        """Rows divided by their Euclidean norm (norm accumulated in float64)."""
        return self.scale_rows(a, self.inverse_norm(a, eps))

    def _weights(self, group: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
        return np.ones(len(group)) if weights is None else np.asarray(weights, dtype=np.float64)


class _NumpyCompute(Compute):
    """numpy: row blocks on one thread per core (:meth:`by_rows`), exp sums shifted per block."""

    @property
    def dtype(self):
        """The product dtype."""
        return np.dtype(self.precision)

    def rows(self, width: int) -> int:
        """Rows per chunk for rows of ``width`` values: a whole number of :data:`PARALLEL_ROWS`
        blocks, so the blocks of a chunk share the cores evenly."""
        return -(-chunk_rows(width) // PARALLEL_ROWS) * PARALLEL_ROWS

    def put(self, a, dtype=None):
        """Host array -> array in the product dtype (or ``dtype``, e.g. "float64")."""
        return np.asarray(a, dtype=dtype or self.dtype)

    def get(self, a) -> np.ndarray:
        """Backend array -> float64 numpy."""
        return np.asarray(a, dtype=np.float64)

    def host(self, a) -> np.ndarray:
        """Backend array -> numpy, its dtype kept (indices stay integers)."""
        return np.asarray(a)

    def rowsum(self, a):
        """Row sums accumulated in float64 (einsum casts in its inner loop)."""
        return np.einsum("ij->i", a, dtype=np.float64)

    def rowdot(self, a, b):
        """sum_j a_ij b_ij per row of two arrays of one shape, accumulated in float64 (float32
        products are exact in float64, so each product is rounded only when added)."""
        return np.einsum("ij,ij->i", a, b, dtype=np.float64)

    def runsum(self, a):
        """Row sums as float64 from float32 partial sums over runs of :data:`RUN` consecutive entries
        (float64 precision: :meth:`rowsum`). Each run's sum is off by at most about RUN u times
        the sum of its entries' magnitudes (u = 2^-24), so a row sum by as much relative to
        sum_j |a_ij|: for a pass whose entries share no offset (centred values, magnitudes),
        where it costs a float32 sum's time instead of a float64 one's 2-3x."""
        return self._runs(a, None)

    def rundot(self, a, b):
        """sum_j a_ij b_ij per row as :meth:`runsum`: the products rounded to float32 (one more
        u of each), summed in float32 over runs, the runs' sums in float64 (float64 precision:
        :meth:`rowdot`). Its error is relative to sum_j |a_ij b_ij|: centre first."""
        return self._runs(a, b)

    def _runs(self, a, b):
        if a.dtype == np.float64:
            return self.rowsum(a) if b is None else self.rowdot(a, b)
        n, d = a.shape
        full = d - d % RUN

        def runs(x):  # (n, full / RUN, RUN) view of the first full columns, no copy
            return np.lib.stride_tricks.as_strided(x, (n, full // RUN, RUN), (x.strides[0], RUN * x.strides[1], x.strides[1]))

        part = np.einsum("ijk->ij", runs(a)) if b is None else np.einsum("ijk,ijk->ij", runs(a), runs(b))
        total = part.sum(axis=1, dtype=np.float64)
        if full < d:
            total += self.rowsum(a[:, full:]) if b is None else self.rowdot(a[:, full:], b[:, full:])
        return total

    def centred(self, a, centre):
        """a - centre (broadcast), inside :meth:`by_rows` in a per-thread scratch buffer: valid
        until the next use of that buffer on this thread (another ``centred``, ``logsumexp`` or
        ``max_softmax``)."""
        return np.subtract(a, centre, out=_scratch(a.shape, a.dtype))

    def centred_unit(self, a, centre, eps: float = 1e-12):
        """a_i / max(||a_i||, eps) - centre per row, in float64 (the norm accumulated in float64,
        the float32 values widened exactly), rounded once to the product dtype: as
        ``put(subtract(normalise(put(a, "float64")), centre))``, value for value, in one pass per
        sub-block of :data:`UNIT_ROWS` rows whose float64 temporary stays in a core's cache. Inside
        :meth:`by_rows` the result is a per-thread scratch buffer (as :meth:`centred`)."""
        a = np.asarray(a)
        out = _scratch(a.shape, self.dtype)
        out = np.empty(a.shape, self.dtype) if out is None else out
        wide = np.empty((min(UNIT_ROWS, len(a)), a.shape[1]))
        for i in range(0, len(a), UNIT_ROWS):
            t = wide[: min(UNIT_ROWS, len(a) - i)]
            t[...] = a[i : i + UNIT_ROWS]  # widened first: float64 loops from here (a mixed-type loop casts per element)
            t *= (1.0 / np.maximum(np.einsum("ij,ij->i", t, t) ** 0.5, eps))[:, None]
            t -= centre
            out[i : i + UNIT_ROWS] = t
        return out

    def pick(self, a, index):
        """a[i, index_i] per row."""
        return a[np.arange(len(index)), index]

    def take_rows(self, a, index):
        """a[index] for valid row indices (an argmax's), inside :meth:`by_rows` in a per-thread
        scratch buffer (valid until the next ``take_rows`` on this thread)."""
        return np.take(a, index, axis=0, out=_scratch((len(index), a.shape[1]), a.dtype, "take"), mode="clip")

    def absolute(self, a, out=None):
        """|a|, written into ``out`` (an array shaped like ``a``, possibly a scratch one) when given."""
        return np.abs(a, out=out)

    def scratch_like(self, a, slot: str = "like"):
        """An uninitialised array shaped like ``a`` in its dtype: inside :meth:`by_rows` a
        per-thread scratch buffer of ``slot`` (valid until its next use on this thread)."""
        out = _scratch(a.shape, a.dtype, slot)
        return np.empty_like(a) if out is None else out

    def rowmax(self, a):
        """The largest value of each row, read at its argmax: numpy's argmax along rows is
        vectorised and its row max is not (1.6-4x the time over rows of 10 to 1000 values)."""
        return self.pick(a, a.argmax(axis=1))

    def rowmin(self, a):
        """The smallest value of each row, read at its argmin (as :meth:`rowmax`)."""
        return self.pick(a, a.argmin(axis=1))

    def argmax(self, a):
        return a.argmax(axis=1)

    def exp(self, a):
        return np.exp(a)

    def log(self, a):
        return np.log(a)

    def shifted_exp(self, a, out=None, m=None):
        """(max_c a_c, exp(a - max), sum_c exp(a_c - max)) per row: the exp in the product dtype,
        written into ``out`` (an array shaped like ``a``, possibly ``a`` itself; default a new
        one) and exponentiated there in place, the sum in float64. ``m``: the row maxima, when
        the caller has them already (e.g. from a partition of each row), saving their pass."""
        m = self.rowmax(a) if m is None else m
        e = np.subtract(a, m[:, None], out=out)
        np.exp(e, out=e)
        return m, e, self.rowsum(e)

    def _block_exp(self, a, out, top=None):
        """(shift, exp(a - shift), its row sums in float64, rows with their own shift), one
        shift for the whole block: 0 when the block's max is at most :data:`UNSHIFTED_MAX`, else
        that max. A row whose max lies more than :data:`UNDERFLOW_MARGIN` below the shift (its
        small terms could underflow) is summed with its own max as its shift: found from the row
        maxima ``top`` and summed from a copy before ``out`` (possibly ``a``) is written, or,
        without ``top`` (then ``out`` must not be ``a``), found afterwards by a sum below
        C exp(-margin)."""
        s = float(a.max() if top is None else top.max())
        s = 0.0 if s <= UNSHIFTED_MAX else s

        def own_sums(rows):  # read from a, so before out (possibly a) is written when top is given
            peak = a[rows].max(axis=1) if top is None else top[rows]
            return peak, self.rowsum(np.exp(a[rows] - peak[:, None]))

        if top is not None:
            rows = np.flatnonzero(top < s - UNDERFLOW_MARGIN)
            own = own_sums(rows) if rows.size else None
        if s == 0.0:
            e = np.exp(a, out=out)
        else:
            e = np.subtract(a, a.dtype.type(s), out=out)
            np.exp(e, out=e)
        total, shift = self.rowsum(e), np.full(len(a), s)
        if top is None:
            rows = np.flatnonzero(total < a.shape[1] * np.exp(-UNDERFLOW_MARGIN))
            own = own_sums(rows) if rows.size else None
        if own is not None:
            shift[rows], total[rows] = own
        return shift, e, total, rows

    def _exp_out(self, a, overwrite: bool):
        """Where a softmax sum writes its exp: ``a`` itself, else a scratch buffer (or new)."""
        return a if overwrite else _scratch(a.shape, a.dtype)

    def logsumexp(self, a, overwrite: bool = False, own_max: bool = False, row_max=None):
        """log sum_c exp(a_c) per row, float64: s + log sum_c exp(a_c - s), the exp in the
        product dtype, the sum in float64, s the row max with ``own_max`` and else a shift per
        block (see :meth:`_block_exp`). ``own_max`` makes the row max's term exactly 1, so that
        max a - logsumexp a = -log(1 + rest) <= 0 resolves p_max close to 1. ``row_max``: the
        row maxima, already known (implies ``own_max``). ``overwrite``: the exp is taken in ``a``
        itself."""
        out = self._exp_out(a, overwrite)
        if own_max or row_max is not None:
            m, _, total = self.shifted_exp(a, out, row_max)
            return m + np.log(total)
        shift, _, total, _ = self._block_exp(a, out, None if out is not a else self.rowmax(a))
        return shift + np.log(total)

    def max_softmax(self, a, overwrite: bool = False):
        """max_c softmax(a)_c = exp(a_y - s) / sum_c exp(a_c - s) per row, y the argmax, float64,
        the sum in float64 (s as in :meth:`logsumexp`). The numerator is the sum's own largest
        term, so a confident row keeps its distance to 1 (1 + the rest of the sum, the rest
        resolved to float64, not rounded away in a float32 total)."""
        out = self._exp_out(a, overwrite)
        y = self.argmax(a)
        shift, e, total, own = self._block_exp(a, out, self.pick(a, y))
        top = self.pick(e, y).astype(np.float64)
        top[own] = 1.0  # exp(0): a row shifted by its own max
        return top / total

    def by_rows(self, fn: Callable, *arrays):
        """fn(*arrays) for a row-wise fn of arrays with equal row counts (fn may return a tuple of
        row-wise arrays, or None when it writes into one of the arrays): fn of each block of
        :data:`PARALLEL_ROWS` rows, the blocks taken in turn by one thread per core (the calling
        thread and threads started for this call and joined before it returns; no more threads
        than BLAS was allowed when the call began, so a user's ``threadpool_limits`` bounds them
        too), while BLAS is held to one thread (:func:`one_blas_thread`), so each core runs its
        own block's product and then its passes over the product. The blocks do not depend on the
        number of threads, so neither does any result."""
        starts = range(0, len(arrays[0]), PARALLEL_ROWS)
        with one_blas_thread() as threads:
            if len(starts) <= 1:
                with _scratch_scope():
                    return fn(*arrays)
            parts = _run_blocks(fn, arrays, starts, min(len(starts), os.cpu_count() or 1, threads))
        if parts[0] is None:  # fn wrote its result into an array it was given
            return None
        if isinstance(parts[0], tuple):
            return tuple(np.concatenate(column) for column in zip(*parts))
        return np.concatenate(parts)

    def map_rows(self, fn: Callable, *arrays, width: int = 0, dtype: str | None = None):
        """fn(*blocks) over the rows of host arrays with one row count (features and logits, say),
        each block first made an array in the product dtype (or ``dtype``, e.g. "float64" for a
        block that is centred before its product) on its own thread (a float32 array is not
        copied for float32), the results as float64 numpy (a tuple of them when fn returns a
        tuple): :meth:`by_rows` over the whole arrays, so no chunk is copied whole and memory stays
        a block per core. ``width`` (the torch backend's chunk width) is not needed here."""
        out = self.by_rows(lambda *blocks: fn(*(self.put(b, dtype) for b in blocks)), *arrays)
        return tuple(map(self.get, out)) if isinstance(out, tuple) else self.get(out)

    def sum_chunks(self, fn: Callable, n: int, width: int):
        """sum over the row chunks sl of :meth:`chunks` (``n``, ``width``) of fn(sl), a fit's pass
        (a scatter's syrk per chunk): the chunks taken in turn by one thread per core, each
        running its chunk's product on one BLAS thread (:func:`one_blas_thread`; a
        multi-threaded BLAS's idle threads spin between a chunk's products, and on a loaded
        machine a factorisation's took 5x its CPU time), and the parts added in chunk order,
        so the sum is the sequential one, bit for bit, whatever the number of threads."""
        slices = list(self.chunks(n, width))
        with one_blas_thread() as threads:
            return _ordered_sum(fn, slices, min(len(slices), os.cpu_count() or 1, threads))

    def inverse_norm(self, a, eps: float = 1e-12):
        """1 / max(||a_i||, eps) per row, float64 (norm accumulated in float64)."""
        return 1.0 / np.maximum(self.rownorm(a), eps)

    def scale_rows(self, a, s):
        """a_i * s_i for a float64 vector s, in a's dtype."""
        return a * s[:, None].astype(a.dtype)

    def topk(self, a, k: int):
        """The k largest values of each row (in no particular order)."""
        return np.partition(a, a.shape[1] - k, axis=1)[:, a.shape[1] - k :]

    def colsum(self, a):
        """Column sums accumulated in float64."""
        return a.sum(axis=0, dtype=np.float64)

    def zeros(self, shape: tuple[int, ...]):
        """A float64 accumulator."""
        return np.zeros(shape)

    def groupsum(self, a, group: np.ndarray, n_groups: int, weights: np.ndarray | None = None, rows: np.ndarray | None = None):
        """(n_groups, D) sums of the rows of ``a`` (one chunk; only its rows ``rows``, host ints,
        when given), each times its ``weights`` entry (host floats; default 1), by their group
        index (host ints), to be added into a float64 accumulator: one sparse product in ``a``'s
        dtype (a float32 chunk is not copied to float64 first, nor its rows picked out)."""
        import scipy.sparse

        w = self._weights(group, weights)
        rows = np.arange(len(group)) if rows is None else rows
        pick = scipy.sparse.csr_matrix((w.astype(a.dtype), (group, rows)), shape=(n_groups, len(a)))
        return np.asarray(pick @ a)

    def subtract(self, a, b, out=None):
        """a - b (broadcast), written into ``out`` when given."""
        return np.subtract(a, b, out=out)

    def empty(self, shape: tuple[int, ...]):
        """An uninitialised array of the product dtype."""
        return np.empty(shape, dtype=self.dtype)

    def concat(self, parts: list, axis: int = 1):
        return np.concatenate(parts, axis=axis)


class _TorchCompute(Compute):
    """torch on ``device``: the operations of :class:`_NumpyCompute` as torch ops (which use
    torch's own intra-op threads), over row chunks of :meth:`rows` rows; softmax sums shift each
    row by its own max."""

    def __post_init__(self) -> None:
        super().__post_init__()
        torch = _torch()
        try:
            dev = torch.device(self.device)
        except (RuntimeError, TypeError):
            dev = None
        if dev is None or dev.type not in ("cpu", "cuda"):
            raise InputError(f"device must be None, 'cpu' or 'cuda[:N]', got {self.device!r}")
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise InputError(f"device {self.device!r} requested but torch sees no CUDA device")

    @property
    def dtype(self):
        return getattr(_torch(), self.precision)

    def rows(self, width: int) -> int:
        """Rows per chunk: :data:`TORCH_CHUNK_ELEMENTS` values (at least 256 rows)."""
        return max(256, TORCH_CHUNK_ELEMENTS // max(1, int(width)))

    def put(self, a, dtype=None):
        torch = _torch()
        dt = self.dtype if dtype is None else getattr(torch, dtype)
        if isinstance(a, torch.Tensor):
            return a.to(device=self.device, dtype=dt)
        arr = np.asarray(a)
        if not arr.flags.writeable:  # read-only (a memory-mapped FeatureSet): a tensor must not share it
            arr = arr.astype(str(dt).removeprefix("torch."))
        return torch.as_tensor(arr).to(device=self.device, dtype=dt)

    def get(self, a) -> np.ndarray:
        return a.detach().to("cpu", dtype=_torch().float64).numpy()

    def host(self, a) -> np.ndarray:
        return np.asarray(a.detach().cpu())

    def rowsum(self, a):
        return a.sum(dim=1, dtype=_torch().float64)

    def rowdot(self, a, b):
        return self.rowsum(a * b)

    def runsum(self, a):
        return self._runs(a)

    def rundot(self, a, b):
        return self._runs(a * b)

    def _runs(self, a):
        """:meth:`_NumpyCompute.runsum` of ``a`` in torch (float64: :meth:`rowsum`)."""
        if a.dtype == _torch().float64:
            return self.rowsum(a)
        n, d = a.shape
        full = d - d % RUN
        total = a[:, :full].reshape(n, -1, RUN).sum(dim=2).sum(dim=1, dtype=_torch().float64)
        return total + self.rowsum(a[:, full:]) if full < d else total

    def centred(self, a, centre):
        return a - centre

    def centred_unit(self, a, centre, eps: float = 1e-12):
        return self.put(self.subtract(self.normalise(self.put(a, "float64"), eps), self.put(centre, "float64")))

    def pick(self, a, index):
        return a.gather(1, index[:, None])[:, 0]

    def take_rows(self, a, index):
        return a[index]

    def absolute(self, a, out=None):
        return _torch().abs(a, out=out) if out is not None else a.abs()

    def scratch_like(self, a, slot: str = "like"):
        return _torch().empty_like(a)

    def rowmax(self, a):
        return a.amax(dim=1)

    def rowmin(self, a):
        return a.amin(dim=1)

    def argmax(self, a):
        return a.argmax(dim=1)

    def exp(self, a):
        return a.exp()

    def log(self, a):
        return a.log()

    def shifted_exp(self, a, out=None, m=None):
        m = self.rowmax(a) if m is None else m
        e = _torch().sub(a, m[:, None], out=out).exp_() if out is not None else (a - m[:, None]).exp_()
        return m, e, self.rowsum(e)

    def logsumexp(self, a, overwrite: bool = False, own_max: bool = False, row_max=None):
        """Each row shifted by its own max (``own_max`` is always so here; ``row_max``: known)."""
        m, _, total = self.shifted_exp(a, a if overwrite else None, row_max)
        return m + total.log()

    def max_softmax(self, a, overwrite: bool = False):
        return 1.0 / self.shifted_exp(a, a if overwrite else None)[2]

    def by_rows(self, fn: Callable, *arrays):
        return fn(*arrays)

    def map_rows(self, fn: Callable, *arrays, width: int = 0, dtype: str | None = None):
        """fn per chunk of :meth:`chunks` rows of the host arrays (``width``: the widest row a
        chunk holds at once, by default the arrays' widths summed)."""
        width = width or sum(a.shape[1] for a in arrays)
        parts = [fn(*(self.put(a[sl], dtype) for a in arrays)) for sl in self.chunks(len(arrays[0]), width)]
        if isinstance(parts[0], tuple):
            return tuple(np.concatenate([self.get(p[i]) for p in parts]) for i in range(len(parts[0])))
        return np.concatenate([self.get(p) for p in parts])

    def sum_chunks(self, fn: Callable, n: int, width: int):
        """sum over the row chunks sl of :meth:`chunks` of fn(sl), in chunk order (torch's ops use its own threads)."""
        parts = (fn(sl) for sl in self.chunks(n, width))
        total = next(parts)
        for part in parts:
            total += part
        return total

    def inverse_norm(self, a, eps: float = 1e-12):
        return 1.0 / self.rownorm(a).clamp_min(eps)

    def scale_rows(self, a, s):
        return a * s[:, None].to(a.dtype)

    def topk(self, a, k: int):
        return a.topk(k, dim=1, sorted=False).values

    def colsum(self, a):
        return a.sum(dim=0, dtype=_torch().float64)

    def zeros(self, shape: tuple[int, ...]):
        return _torch().zeros(shape, dtype=_torch().float64, device=self.device)

    def groupsum(self, a, group: np.ndarray, n_groups: int, weights: np.ndarray | None = None, rows: np.ndarray | None = None):
        w = self._weights(group, weights)
        a = a if rows is None else a[_torch().as_tensor(rows, device=self.device)]
        out = self.zeros((n_groups, a.shape[1]))
        idx = _torch().as_tensor(group, device=self.device)
        return out.index_add_(0, idx, a.to(_torch().float64) * self.put(w, "float64")[:, None])

    def subtract(self, a, b, out=None):
        return a - b if out is None else _torch().sub(a, b, out=out)

    def empty(self, shape: tuple[int, ...]):
        return _torch().empty(shape, dtype=self.dtype, device=self.device)

    def concat(self, parts: list, axis: int = 1):
        return _torch().cat(parts, dim=axis)


def _pool(task: Callable[[int], None], n: int, threads: int, name: str, wrap=contextlib.nullcontext) -> None:
    """``task(i)`` for i in 0..n-1, on the calling thread and ``threads - 1`` threads started here
    (joined before it returns), each taking the next pending i inside ``wrap()``; the first error
    stops the others taking more and is raised."""
    pending, lock, errors = iter(range(n)), threading.Lock(), []

    def work() -> None:
        with wrap():
            while True:
                with lock:
                    i = next(pending, None)
                if i is None:
                    return
                try:
                    task(i)
                except BaseException as error:
                    with lock:
                        collections.deque(pending, maxlen=0)  # the other threads take no more
                        errors.append(error)
                    return

    helpers = [threading.Thread(target=work, name=f"oodeval-{name}-{i}") for i in range(1, threads)]
    for t in helpers:
        t.start()
    try:
        work()
    finally:
        with lock:
            collections.deque(pending, maxlen=0)
        for t in helpers:
            t.join()
    if errors:
        raise errors[0]


def _run_blocks(fn: Callable, arrays: tuple, starts: range, threads: int) -> list:
    """[fn(block) for each block of rows beginning at ``starts``], by :func:`_pool`."""
    parts: list = [None] * len(starts)

    def task(i: int) -> None:
        parts[i] = fn(*(a[starts[i] : starts[i] + PARALLEL_ROWS] for a in arrays))

    _pool(task, len(starts), threads, "rows", _scratch_scope)
    return parts


def _ordered_sum(fn: Callable, slices: list, threads: int):
    """fn(slices[0]) + fn(slices[1]) + ... added in that order, the parts computed by :func:`_pool`;
    a part waits only until those before it are added, so at most about ``threads`` parts are held
    at once."""
    done: dict = {}
    state = {"next": 0, "total": None}
    lock = threading.Lock()

    def task(i: int) -> None:
        part = fn(slices[i])
        with lock:  # add every part that is now next in order
            done[i] = part
            while state["next"] in done:
                part = done.pop(state["next"])
                if state["total"] is None:
                    state["total"] = part
                else:
                    state["total"] += part
                state["next"] += 1

    _pool(task, len(slices), threads, "sum")
    return state["total"]


_SCRATCH = threading.local()
#: largest scratch buffer, in values (a block of PARALLEL_ROWS rows is far smaller)
SCRATCH_ELEMENTS = 1 << 22


@contextlib.contextmanager
def _scratch_scope() -> Iterator[None]:
    """Scratch buffers for this thread while a :meth:`Compute.by_rows` call runs (the outermost
    scope owns them, and drops them on exit)."""
    if getattr(_SCRATCH, "buffers", None) is not None:
        yield
        return
    _SCRATCH.buffers = {}
    try:
        yield
    finally:
        _SCRATCH.buffers = None


def _scratch(shape: tuple[int, ...], dtype, slot: str = "") -> np.ndarray | None:
    """A numpy buffer of ``shape`` from this thread's scratch scope, for a temporary that no
    caller keeps, reused across the blocks of a :meth:`Compute.by_rows` call (one per dtype and
    ``slot``, so that temporaries of different slots can be held at once); None (a new array)
    outside a scope or when larger than :data:`SCRATCH_ELEMENTS`."""
    kept = getattr(_SCRATCH, "buffers", None)
    size = int(np.prod(shape))
    if kept is None or size > SCRATCH_ELEMENTS:
        return None
    dtype = np.dtype(dtype)
    buf = kept.get((dtype, slot))
    if buf is None or buf.size < size:
        buf = kept[(dtype, slot)] = np.empty(max(size, PARALLEL_ROWS * 1024), dtype=dtype)
    return buf[:size].reshape(shape)


def _torch():
    return optional("torch")
