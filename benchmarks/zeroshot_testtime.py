"""AdaNeg's time against NegLabel's on the same embeddings (issue 43: at most 2x on 2 cores).

Synthetic CLIP-like unit embeddings (E = 512): C ID label embeddings, M negatives, and N images of
which ``--id-share`` lie near an ID label (cosine ~0.3 to it, as CLIP images to their class prompt)
and the rest near a negative label; the images are streamed in one seeded order. Both scorers run
with their defaults (NegLabel: 100 groups; AdaNeg: the ImageNet script's, batch 256) on the same
arrays; printed: CPU seconds (``time.process_time``, all threads) and wall seconds of each, their
ratio (NegLabel is timed before and after AdaNeg, against load drift on a shared machine;
the ratio uses the mean of the two), AdaNeg's memory-bank fill (images held, of at most K (memory_size - 1)) and with ``--heap`` the peak
Python heap of each (``tracemalloc``, which numpy reports its buffers to) from separate runs, tracing
being left out of the timed ones. Both use the same threads: NegLabel's products run on BLAS's threads,
AdaNeg holds BLAS to one thread and runs blocks of each batch on as many threads. The machine lines
(benchmarks/_machine.py) are printed after the timed runs (they load torch).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/zeroshot_testtime.py --n 50000 --classes 1000 --negatives 10000
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc

import numpy as np


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def embeddings(n: int, c: int, m: int, e: int, id_share: float, seed: int):
    rng = np.random.default_rng(seed)
    id_text, neg = unit(rng.normal(size=(c, e))), unit(rng.normal(size=(m, e)))
    n_id = int(round(n * id_share))
    anchors = np.r_[id_text[rng.integers(0, c, n_id)], neg[rng.integers(0, m, n - n_id)]]
    x = unit(0.3 * anchors + unit(rng.normal(size=(n, e))) * np.sqrt(1 - 0.3**2))
    return x[rng.permutation(n)], id_text, neg


def timed(fn, heap: bool):
    """fn's result, CPU and wall seconds, and (``heap``) its peak traced heap. Tracing every allocation
    costs time, more for code with more small allocations, so times come from untraced runs."""
    if heap:
        tracemalloc.start()
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    peak = tracemalloc.get_traced_memory()[1] if heap else 0
    if heap:
        tracemalloc.stop()
    return out, cpu, wall, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--negatives", type=int, default=10000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--id-share", type=float, default=5 / 6, help="ID fraction of the stream (default 5/6: ImageNet val + a 10k OOD set)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heap", action="store_true", help="also measure each scorer's peak heap (tracemalloc), in separate runs")
    args = ap.parse_args()

    from oodeval.zeroshot import create_scorer
    from oodeval.zeroshot.adaneg import MemoryBank

    x, id_text, neg = embeddings(args.n, args.classes, args.negatives, args.dim, args.id_share, args.seed)
    print(f"N={args.n} C={args.classes} M={args.negatives} E={args.dim}, ID share {args.id_share:.3f}")
    rows = {}
    fill = {}
    original = MemoryBank.proxy_cosines

    def spy(self, *a, **k):  # record how full the bank got (the last batch's view)
        fill["used"], fill["cap"] = self.used, len(self.text) * self.capacity
        return original(self, *a, **k)

    MemoryBank.proxy_cosines = spy
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    for name, run in (("neglabel", "neglabel"), ("adaneg", "adaneg"), ("neglabel", "neglabel again")):
        det = create_scorer(name)
        _, cpu, wall, _ = timed(lambda: det.score(x, id_text, neg), heap=False)  # noqa: B023 - called at once
        rows[run] = (cpu, wall)
        print(f"{run:<15} cpu {cpu:8.1f} s   wall {wall:8.1f} s   load {os.getloadavg()[0]:.1f}")
    if args.heap:
        for name in ("neglabel", "adaneg"):
            det = create_scorer(name)
            peak = timed(lambda: det.score(x, id_text, neg), heap=True)[3]  # noqa: B023 - called at once
            print(f"{name:<15} peak heap {peak / 2**20:8.0f} MiB (a separate, traced run)")
    MemoryBank.proxy_cosines = original
    base = [(rows["neglabel"][i] + rows["neglabel again"][i]) / 2 for i in (0, 1)]
    print(f"AdaNeg / NegLabel CPU time: {rows['adaneg'][0] / base[0]:.2f}x (wall {rows['adaneg'][1] / base[1]:.2f}x; "
          f"NegLabel timed before and after AdaNeg, mean of the two); "
          f"memory bank {fill.get('used', 0)} of at most {fill.get('cap', 0)} images")
    from _machine import describe

    print("\n".join(describe()))


if __name__ == "__main__":
    main()
