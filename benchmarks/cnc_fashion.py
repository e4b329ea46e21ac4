"""CnC vs a plain model on the demo's Fashion-MNIST benchmark (CPU, reduced epochs).

ID = six Fashion-MNIST classes, OOD = the four held-out classes (near) and digits, photos,
uniform and Gaussian noise (far), built offline by :func:`oodeval.demo.data.build_benchmark`.
For each seed a plain K-way model and a CnC K+1 model (same timm architecture, data order,
epochs and optimiser) are trained; the plain model is scored with MSP and energy, the CnC model
with its own detector (1 - p(K+1)) and with MSP / energy on its first K logits. Printed: mean ±
std over seeds (ddof = 1) of TNR@TPR95, AUROC, detection error (mean over the five OOD sets
and per near / far group) and ID accuracy, in percent.

    .venv/bin/python benchmarks/cnc_fashion.py --epochs 5 --seeds 0 1 2 --recipe release

``--recipe release`` trains with the data side of the CnC release's recipe (random crop + flip for
ID images, crop / flips / rotation of the outlier sources, a separately shuffled source batch,
the release's corruption pool, 64 ID + 64 outliers per step); ``--recipe plain-data`` without
ID / source augmentation, outliers on the ID batch. The model keeps timm's stem (a CIFAR stem
costs ~16x the first stage's compute, too much for this CPU comparison).

Checkpoints go to ``--work`` and are resumed when the script is rerun.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/oodeval-cnc-fashion"), help="data root + checkpoints")
    ap.add_argument("--model", default="test_resnet", help="timm model (random init)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--train-size", type=int, default=6000)
    ap.add_argument("--test-size", type=int, default=2000)
    ap.add_argument("--ood-size", type=int, default=1000, help="images per OOD set")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--recipe", choices=("release", "plain-data"), default="release")
    args = ap.parse_args()

    import torch

    from oodeval.cnc.evaluate import aggregate, evaluate_run, format_cnc_table
    from oodeval.cnc.suites import suite
    from oodeval.cnc.train import CnCTrainConfig, extract_in_memory, load_checkpoint, train
    from oodeval.demo.data import DemoSizes, build_benchmark, read_set

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    t_start = time.time()
    n_ood = args.ood_size
    sizes = DemoSizes(id_train=args.train_size, id_test=args.test_size, near_ood=n_ood, digits=min(n_ood, 1797),
                      photos=n_ood, uniform=n_ood, gaussian=n_ood)  # fmt: skip
    root = args.work / "data"
    folders = build_benchmark(root, sizes, seed=0, progress=False)
    s = suite("demo-fmnist")
    x_train, y_train, _ = read_set(folders["id_train"])
    x_test, y_test, _ = read_set(folders["id_test"])
    ood = {name: read_set(root / name)[0] for name in s.ood}
    k = int(y_train.max()) + 1
    print(f"data: train {x_train.shape}, test {x_test.shape}, OOD " + ", ".join(f"{n} {len(a)}" for n, a in ood.items()))

    runs: dict[str, list[dict]] = {"plain": [], "cnc": []}
    for seed in args.seeds:
        for kind in ("plain", "cnc"):
            data_side = dict(augment="crop_flip", outlier_augment="release", outlier_pairing="shuffled")
            cfg = CnCTrainConfig(model=args.model, num_classes=k, in_chans=1, cnc=kind == "cnc", epochs=args.epochs,
                              batch_size=args.batch_size, lr=args.lr, seed=seed,
                              **(data_side if args.recipe == "release" else {}))  # fmt: skip
            folder = args.work / f"{kind}-{args.model}-{args.recipe}-e{args.epochs}-s{seed}"
            t0 = time.time()
            prog = train(cfg, x_train, y_train, folder, progress=False)
            model, cfg, _ = load_checkpoint(folder)
            fs_test = extract_in_memory(model, x_test, cfg, y_test)
            fs_ood = {n: extract_in_memory(model, a, cfg) for n, a in ood.items()}
            dets = ["cnc", "msp", "energy"] if kind == "cnc" else ["msp", "energy"]
            runs[kind].append(evaluate_run(fs_test, fs_ood, dets, groups=s.groups))
            last = prog["history"][-1]
            print(f"seed {seed} {kind:5s}: loss {prog['history'][0]['loss']:.3f} -> {last['loss']:.3f}, "
                  f"train acc {last['train_acc']:.3f}, {time.time() - t0:.0f}s")  # fmt: skip

    agg = {kind: aggregate(r) if len(r) > 1 else r[0] for kind, r in runs.items()}
    for kind in ("plain", "cnc"):
        print()
        print(format_cnc_table(agg[kind], title=f"== {kind} {args.model}, {args.recipe}, {args.epochs} epochs, seeds {args.seeds}"))
    print()
    print(summary(agg, args))
    print(f"\ntotal wall time {time.time() - t_start:.0f}s")


def summary(agg: dict, args: argparse.Namespace) -> str:
    """One row per (model, detector): mean-over-sets metrics and ID accuracy, mean ± std."""

    def f(v) -> str:
        return f"{100 * v['mean']:.2f} ± {100 * v['std']:.2f}" if isinstance(v, dict) and "std" in v else f"{100 * v:.2f}"

    head = ["model", "detector", "TNR@TPR95", "AUROC", "DetErr", "TNR near", "TNR far", "ID Acc"]
    rows = []
    for kind in ("plain", "cnc"):
        for det, e in agg[kind]["detectors"].items():
            m, g = e["mean"], e["groups"]
            rows.append([kind, det if not (kind == "cnc" and det != "cnc") else f"{det} (first K)",
                         f(m["tnr95"]), f(m["auroc"]), f(m["detection_error"]),
                         f(g["near"]["tnr95"]), f(g["far"]["tnr95"]), f(agg[kind]["id_accuracy"])])  # fmt: skip
    w = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    out = [f"== summary: mean over 5 OOD sets, percent, mean ± std over seeds {args.seeds} (ddof=1)"]
    out.append("| " + " | ".join(h.ljust(x) for h, x in zip(head, w)) + " |")
    out.append("|" + "|".join("-" * (x + 2) for x in w) + "|")
    out += ["| " + " | ".join(c.ljust(x) for c, x in zip(r, w)) + " |" for r in rows]
    return "\n".join(out)


if __name__ == "__main__":
    main()
