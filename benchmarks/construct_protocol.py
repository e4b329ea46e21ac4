"""Annotation-store cost per web-app submission at the paper's size: 2,597 images, both Stage-1 verdicts in,
the disputed images' Stage-3 verdicts partly in (about 6,600 rows).

One UI submission = POST /api/verdict (submit) + GET /api/me (progress) + GET /api/queue (queue).
"incremental" is the store as served (outcomes folded in from the rows added since the last look);
"from scratch" opens a fresh store per call, i.e. recomputes every outcome, as before issue 13.

    python benchmarks/construct_protocol.py [--n 2597] [--submissions 20]
"""

import argparse
import random
import tempfile
import time
from pathlib import Path

from oodeval.construct.candidates import Candidate
from oodeval.construct.protocol import ProtocolStore

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, default=2597)
p.add_argument("--submissions", type=int, default=20)
args = p.parse_args()

rng = random.Random(0)
folder = Path(tempfile.mkdtemp(prefix="oodeval-bench-"))
cands = [Candidate(f"val/{i:05d}.JPEG", f"val/{i:05d}.JPEG", i % 1000, f"c{i % 1000}", "uncertain") for i in range(args.n)]
store, _ = ProtocolStore.create(folder / "p.sqlite", cands, ("alice", "bob"), "carol", 1000)
LABELS = ["tayra", "Eira barbara", "Denison barb", "axolotl", "teapot"]


def random_verdict():
    kind = rng.choice(["ood", "id", "ambiguous"])
    if kind == "ood":
        return {"verdict": "ood", "ood_label": rng.choice(LABELS), "fine_grained": rng.random() < 0.5}
    return {"verdict": "id", "id_class": rng.randrange(3)} if kind == "id" else {"verdict": "ambiguous"}


t = time.perf_counter()
for c in cands:
    for who in ("alice", "bob"):
        store.submit(who, c.image, 1, **random_verdict())
disputed = [img for img, o in store.outcomes().items() if o.status == "stage3"]
for img in disputed[: len(disputed) // 2]:
    for who in ("alice", "bob", "carol"):
        store.submit(who, img, 3, **random_verdict())
print(f"filled {len(store.rows())} rows for {args.n} images in {time.perf_counter() - t:.1f} s; summary {store.summary()}")

pending = [img for img, o in store.outcomes().items() if o.status == "stage3"]
for mode in ("incremental", "from scratch"):
    times = []
    for img in pending[: args.submissions] if mode == "incremental" else pending[args.submissions : 2 * args.submissions]:
        t = time.perf_counter()
        s = store if mode == "incremental" else ProtocolStore(store.path)
        s.submit("carol", img, 3, "ambiguous")
        (s if mode == "incremental" else ProtocolStore(store.path)).progress()
        (s if mode == "incremental" else ProtocolStore(store.path)).queue("alice", 1)
        times.append(time.perf_counter() - t)
    times.sort()
    print(f"{mode:>13}: per UI submission median {1e3 * times[len(times) // 2]:.1f} ms, max {1e3 * times[-1]:.1f} ms ({len(times)} submissions)")
