"""Where and in what precision the detectors' dense products run: numpy or torch, float32 or float64.

``precision="float32"`` (every detector's default): matrix products in float32 (sgemm), and every
reduction that becomes a score or a fitted statistic (row sums, norms, log-sum-exp, scatter
matrices, means) accumulated in float64; scores come back float64. ``"float64"``: everything in
float64 (the reference path). ``device=None`` (default) computes with numpy; ``"cpu"``, ``"cuda"``
or ``"cuda:N"`` with torch on that device, in row chunks whose size is fixed by
:data:`TORCH_CHUNK_ELEMENTS`, so the device memory needed does not grow with N.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .._arrays import chunk_rows
from ..errors import InputError

__all__ = ["Compute", "compute_of", "one_blas_thread", "PRECISIONS", "TORCH_CHUNK_ELEMENTS"]

PRECISIONS = ("float32", "float64")
#: values per row chunk on a torch device (64M: 256 MB of float32 per chunk operand)
TORCH_CHUNK_ELEMENTS = 64_000_000
#: rows per block in :meth:`Compute.by_rows` (512 x 1000 float32: 2 MB, about a core's cache)
PARALLEL_ROWS = 512
#: largest value that numpy's softmax sums exponentiate unshifted (float32 exp overflows past 88.7)
UNSHIFTED_MAX = 80.0
#: a row whose max lies further below its block's shift gets its own (float32 exp underflows
#: below -87.3; terms that far below the row's max, exp(-47) of it, are below float64's resolution)
UNDERFLOW_MARGIN = 40.0


@dataclass(frozen=True)
class Compute:
    """A precision and a device; ``put`` moves a host array there, ``get`` brings a result back
    as float64 numpy, and the row reductions accumulate in float64 on either backend."""

    precision: str = "float32"
    device: str | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise InputError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.device is not None:
            import torch

            dev = torch.device(self.device)  # raises on a malformed name
            if dev.type == "cuda" and not torch.cuda.is_available():
                raise InputError(f"device {self.device!r} requested but torch sees no CUDA device")
            if dev.type not in ("cpu", "cuda"):
                raise InputError(f"device must be None, 'cpu' or 'cuda[:N]', got {self.device!r}")

    @property
    def dtype(self):
        """The product dtype (numpy or torch)."""
        if self.device is None:
            return np.dtype(self.precision)
        import torch

        return getattr(torch, self.precision)

    def rows(self, width: int) -> int:
        """Rows per chunk for rows of ``width`` values (numpy: a whole number of
        :data:`PARALLEL_ROWS` blocks, so the blocks of a chunk share the cores evenly)."""
        if self.device is None:
            return -(-chunk_rows(width) // PARALLEL_ROWS) * PARALLEL_ROWS
        return max(256, TORCH_CHUNK_ELEMENTS // max(1, int(width)))

    def chunks(self, n: int, width: int) -> Iterator[slice]:
        step = self.rows(width)
        for start in range(0, n, step):
            yield slice(start, min(n, start + step))

    def put(self, a, dtype=None):
        """Host (or backend) array -> backend array in the product dtype (or ``dtype``, e.g. "float64")."""
        if self.device is None:
            return np.asarray(a, dtype=dtype or self.dtype)
        import torch

        dt = self.dtype if dtype is None else getattr(torch, dtype)
        t = a if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a))
        return t.to(device=self.device, dtype=dt)

    def get(self, a) -> np.ndarray:
        """Backend array -> float64 numpy."""
        if self.device is None:
            return np.asarray(a, dtype=np.float64)
        return a.detach().to("cpu", dtype=_torch().float64).numpy()

    def rowsum(self, a):
        """Row sums accumulated in float64 (numpy: einsum, which casts in its inner loop and
        takes 0.8x the time of ``sum(dtype=float64)``)."""
        if self.device is None:
            return np.einsum("ij->i", a, dtype=np.float64)
        return a.sum(dim=1, dtype=_torch().float64)

    def rowdot(self, a, b):
        """sum_j a_ij b_ij per row of two arrays of one shape, accumulated in float64 (numpy:
        float32 products are exact in float64, so each product is rounded only when added)."""
        if self.device is None:
            return np.einsum("ij,ij->i", a, b, dtype=np.float64)
        return self.rowsum(a * b)

    def rownorm(self, a):
        """Euclidean row norms, accumulated in float64."""
        return self.rowdot(a, a) ** 0.5

    def centred(self, a, centre):
        """a - centre (broadcast), with numpy in a per-thread scratch buffer: valid until the next
        use of that buffer on this thread (another ``centred``, ``logsumexp`` or ``max_softmax``)."""
        if self.device is None:
            return np.subtract(a, centre, out=_scratch(a.shape, a.dtype))
        return a - centre

    def pick(self, a, index):
        """a[i, index_i] per row."""
        if self.device is None:
            return np.take_along_axis(a, index[:, None], axis=1)[:, 0]
        return a.gather(1, index[:, None])[:, 0]

    def rowmax(self, a):
        return a.max(axis=1) if self.device is None else a.amax(dim=1)

    def rowmin(self, a):
        return a.min(axis=1) if self.device is None else a.amin(dim=1)

    def argmax(self, a):
        return a.argmax(axis=1) if self.device is None else a.argmax(dim=1)

    def exp(self, a):
        return np.exp(a) if self.device is None else a.exp()

    def shifted_exp(self, a, out=None):
        """(max_c a_c, exp(a - max), sum_c exp(a_c - max)) per row: the exp in the product dtype,
        written into ``out`` (an array shaped like ``a``, possibly ``a`` itself; default a new
        one) and exponentiated there in place, the sum in float64."""
        m = self.rowmax(a)
        if self.device is None:
            e = np.subtract(a, m[:, None], out=out)
            np.exp(e, out=e)
        else:
            e = _torch().sub(a, m[:, None], out=out).exp_() if out is not None else (a - m[:, None]).exp_()
        return m, e, self.rowsum(e)

    def _block_exp(self, a, out, top=None):
        """numpy: (shift, exp(a - shift), its row sums in float64, rows with their own shift),
        one shift for the whole block (a scalar subtraction, or none, costs 0.2 ns per value
        against 0.5 for a per-row one): 0 when the block's max is at most :data:`UNSHIFTED_MAX`,
        else that max. A row whose max lies more than :data:`UNDERFLOW_MARGIN` below the shift
        (its small terms could underflow) is summed with its own max as its shift: found from the
        row maxima ``top`` and summed from a copy before ``out`` (possibly ``a``) is written, or,
        without ``top`` (then ``out`` must not be ``a``), found afterwards by a sum below
        C exp(-margin)."""
        s = float(a.max() if top is None else top.max())
        s = 0.0 if s <= UNSHIFTED_MAX else s

        def own_sums(rows):  # read from a, so before out (possibly a) is written when top is given
            peak = a[rows].max(axis=1) if top is None else top[rows]
            return peak, self.rowsum(np.exp(a[rows] - peak[:, None]))

        if top is not None:
            rows = np.flatnonzero(top < s - UNDERFLOW_MARGIN)
            own = own_sums(rows) if rows.size else None  # skipped when empty: 6-8% of energy
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
        """Where a softmax sum writes its exp: ``a`` itself, else a per-thread scratch buffer
        (numpy) or a new tensor (torch, None)."""
        return a if overwrite else (_scratch(a.shape, a.dtype) if self.device is None else None)

    def logsumexp(self, a, overwrite: bool = False, own_max: bool = False):
        """log sum_c exp(a_c) per row, float64: s + log sum_c exp(a_c - s), the exp in the
        product dtype, the sum in float64, s the row max on torch or with ``own_max`` and else a
        shift per block (see :meth:`_block_exp`). ``own_max`` makes the row max's term exactly
        1, so that max a - logsumexp a = -log(1 + rest) <= 0 resolves p_max close to 1.
        ``overwrite``: the exp is taken in ``a`` itself."""
        out = self._exp_out(a, overwrite)
        if self.device is not None or own_max:
            m, _, total = self.shifted_exp(a, out)
            return m + (total.log() if self.device is not None else np.log(total))
        shift, _, total, _ = self._block_exp(a, out, None if out is not a else self.rowmax(a))
        return shift + np.log(total)

    def max_softmax(self, a, overwrite: bool = False):
        """max_c softmax(a)_c = exp(a_y - s) / sum_c exp(a_c - s) per row, y the argmax, float64,
        the sum in float64 (s as in :meth:`logsumexp`). The numerator is the sum's own largest
        term, so a confident row keeps its distance to 1 (1 + the rest of the sum, the rest
        resolved to float64, not rounded away in a float32 total)."""
        out = self._exp_out(a, overwrite)
        if self.device is not None:
            return 1.0 / self.shifted_exp(a, out)[2]
        y = self.argmax(a)
        shift, e, total, own = self._block_exp(a, out, self.pick(a, y))
        top = self.pick(e, y).astype(np.float64)
        top[own] = 1.0  # exp(0): a row shifted by its own max
        return top / total

    def by_rows(self, fn, *arrays):
        """fn(*arrays) for a row-wise fn of arrays with equal row counts (fn may return a tuple of
        row-wise arrays, or None when it writes into one of the arrays). With numpy: fn of each
        block of :data:`PARALLEL_ROWS` rows, the blocks run on a kept pool of one thread per core,
        each thread taking the next pending block (numpy's elementwise passes are single-threaded
        and release the GIL; one task per core, as a task per block cost 0.1-0.2 ms of wake-ups
        each, 10-20% of a softmax over the logits), and the passes of one fn stay in the core's
        cache; the blocks do not depend on the number of cores, so neither does any result. fn
        may multiply its block by a matrix: BLAS is held to one thread meanwhile, so each core
        runs its own block's product and then its passes over the product while that is in
        cache. (A product on every core, over a whole chunk or over a short last chunk alike,
        leaves BLAS's idle threads spinning for about 0.1 s on the cores the passes then need:
        10-20% more CPU time measured, 50% on NNGuide's small products.)
        On torch (whose ops use every core): fn(*arrays)."""
        if self.device is not None:
            return fn(*arrays)
        n = len(arrays[0])
        with one_blas_thread():
            if n <= PARALLEL_ROWS:
                return fn(*arrays)
            starts = range(0, n, PARALLEL_ROWS)
            parts: list = [None] * len(starts)
            pending, lock = iter(range(len(starts))), threading.Lock()

            def work(_) -> None:  # one per core: takes the next pending block until none is left
                while True:
                    with lock:
                        i = next(pending, None)
                    if i is None:
                        return
                    try:
                        parts[i] = fn(*(a[starts[i] : starts[i] + PARALLEL_ROWS] for a in arrays))
                    except BaseException:
                        with lock:
                            collections.deque(pending, maxlen=0)  # the other cores take no more
                        raise

            list(_pool().map(work, range(min(len(starts), os.cpu_count() or 1))))
        if parts[0] is None:  # fn wrote its result into an array it was given
            return None
        if isinstance(parts[0], tuple):
            return tuple(np.concatenate(column) for column in zip(*parts))
        return np.concatenate(parts)

    def map_rows(self, fn, a, width: int, dtype: str | None = None):
        """fn(block) over the rows of the host array ``a``, each block first made a backend array
        in the product dtype (or ``dtype``, e.g. "float64" for a block that is centred before its
        product), the results as float64 numpy (a tuple of them when fn returns a tuple). With numpy, :meth:`by_rows` over the whole of ``a``: each block is converted on
        its own core, so no chunk is ever copied whole and the pool is started once (a start per
        4096-row chunk cost 7% of a softmax over the logits). On torch, per chunk of
        :meth:`rows` (``width``) rows."""
        if self.device is None:
            out = self.by_rows(lambda block: fn(self.put(block, dtype)), a)
            return tuple(map(self.get, out)) if isinstance(out, tuple) else self.get(out)
        parts = [fn(self.put(a[sl], dtype)) for sl in self.chunks(len(a), width)]
        if isinstance(parts[0], tuple):
            return tuple(np.concatenate([self.get(p[i]) for p in parts]) for i in range(len(parts[0])))
        return np.concatenate([self.get(p) for p in parts])

    def inverse_norm(self, a, eps: float = 1e-12):
        """1 / max(||a_i||, eps) per row, float64 (norm accumulated in float64)."""
        norm = self.rownorm(a)
        return 1.0 / (np.maximum(norm, eps) if self.device is None else norm.clamp_min(eps))

    def scale_rows(self, a, s):
        """a_i * s_i for a float64 vector s, in a's dtype."""
        return a * (s[:, None].astype(a.dtype) if self.device is None else s[:, None].to(a.dtype))

    def normalise(self, a, eps: float = 1e-12):
        """Rows divided by their Euclidean norm (norm accumulated in float64)."""
        return self.scale_rows(a, self.inverse_norm(a, eps))

    def topk(self, a, k: int):
        """The k largest values of each row (in no particular order)."""
        if self.device is None:
            return np.partition(a, a.shape[1] - k, axis=1)[:, a.shape[1] - k :]
        return a.topk(k, dim=1, sorted=False).values

    def colsum(self, a):
        """Column sums accumulated in float64."""
        if self.device is None:
            return a.sum(axis=0, dtype=np.float64)
        return a.sum(dim=0, dtype=_torch().float64)

    def zeros(self, shape: tuple[int, ...]):
        """A float64 accumulator on the backend."""
        if self.device is None:
            return np.zeros(shape)
        return _torch().zeros(shape, dtype=_torch().float64, device=self.device)

    def groupsum(self, a, group: np.ndarray, n_groups: int, weights: np.ndarray | None = None):
        """(n_groups, D) sums of the rows of ``a`` (one chunk), each times its ``weights`` entry
        (host floats; default 1), by their group index (host ints), to be added into a float64
        accumulator. With numpy the sparse product runs in ``a``'s dtype (a float32 chunk is not
        copied to float64 first, which took 7x the product's time)."""
        w = np.ones(len(group)) if weights is None else np.asarray(weights, dtype=np.float64)
        if self.device is None:
            import scipy.sparse

            rows = np.arange(len(group))
            pick = scipy.sparse.csr_matrix((w.astype(a.dtype), (group, rows)), shape=(n_groups, len(group)))
            return np.asarray(pick @ a)
        out = self.zeros((n_groups, a.shape[1]))
        idx = _torch().as_tensor(group, device=self.device)
        return out.index_add_(0, idx, a.to(_torch().float64) * self.put(w, "float64")[:, None])

    def subtract(self, a, b, out=None):
        """a - b (broadcast), written into ``out`` when given."""
        if self.device is None:
            return np.subtract(a, b, out=out)
        return a - b if out is None else _torch().sub(a, b, out=out)

    def empty(self, shape: tuple[int, ...]):
        """An uninitialised array of the product dtype on the backend."""
        if self.device is None:
            return np.empty(shape, dtype=self.dtype)
        return _torch().empty(shape, dtype=self.dtype, device=self.device)

    def concat(self, parts: list, axis: int = 1):
        return np.concatenate(parts, axis=axis) if self.device is None else _torch().cat(parts, dim=axis)


_POOL: list[ThreadPoolExecutor] = []


def _pool() -> ThreadPoolExecutor:
    """One thread per core, started on first use and kept (starting threads per call costs
    milliseconds, as much as a softmax over 10k x 1000 logits)."""
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="oodeval"))
    return _POOL[0]


@functools.cache
def _blas():
    """The BLAS libraries loaded when first asked (threadpoolctl), numpy's among them: the one
    that runs the blocks' products."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas")


_HOLDS = {"count": 0, "saved": None}
_HOLDS_LOCK = threading.Lock()


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """A context holding BLAS to one thread (process-wide, as BLAS's setting is): for the
    per-core blocks of :meth:`Compute.by_rows`, and for a short product (tens of ms) just before
    a detector's passes, which would otherwise run beside BLAS's idle threads spinning for ~0.1 s.
    Holds from several threads nest: the first sets one thread, the last restores the setting."""
    with _HOLDS_LOCK:
        if _HOLDS["count"] == 0:
            _HOLDS["saved"] = _blas().limit(limits=1)
        _HOLDS["count"] += 1
    try:
        yield
    finally:
        with _HOLDS_LOCK:
            _HOLDS["count"] -= 1
            if _HOLDS["count"] == 0:
                _HOLDS["saved"].restore_original_limits()


_SCRATCH = threading.local()
#: largest kept per-thread buffer, in values (a block of PARALLEL_ROWS rows is far smaller)
SCRATCH_ELEMENTS = 1 << 22


def _scratch(shape: tuple[int, ...], dtype) -> np.ndarray | None:
    """A per-thread numpy buffer of ``shape`` for a temporary that no caller keeps (None, i.e. a
    new array, when larger than :data:`SCRATCH_ELEMENTS`): a fresh 2 MB temporary per block
    costs page faults that take as long as a pass over it."""
    size = int(np.prod(shape))
    if size > SCRATCH_ELEMENTS:
        return None
    dtype = np.dtype(dtype)
    kept = getattr(_SCRATCH, "buffers", None)
    if kept is None:
        kept = _SCRATCH.buffers = {}
    buf = kept.get(dtype)
    if buf is None or buf.size < size:
        buf = kept[dtype] = np.empty(max(size, PARALLEL_ROWS * 1024), dtype=dtype)
    return buf[:size].reshape(shape)


def _torch():
    import torch

    return torch


def compute_of(det) -> Compute:
    """The Compute of a detector from its ``precision`` / ``device`` hyperparameters."""
    return Compute(getattr(det, "precision", "float64"), getattr(det, "device", None))
