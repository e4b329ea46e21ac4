"""The machine a benchmark ran on, and running it under another kernel variant.

:func:`describe` returns the lines a benchmark prints first: the CPU model and the vector ISA it
offers (AVX2, AVX-512, AMX, from /proc/cpuinfo's flags), each BLAS library loaded with the kernel
it chose (threadpoolctl's ``architecture``, e.g. OpenBLAS's ``SkylakeX``, ``Haswell``), torch's CPU
capability (``torch.backends.cpu.get_cpu_capability()``), the environment variables that pick
those kernels, and the measured sgemm GFLOP/s. A CPU kind is this tuple; docs/performance.md keeps
one table per kind.

:func:`add_kernel_arguments` / :func:`use_kernel` give a benchmark ``--openblas-coretype`` and
``--aten-capability``: both libraries read their variable once, when they load, so the script
runs itself again with the variable set (a proxy for a CPU with only that ISA, e.g. Haswell's
AVX2 sgemm on an AVX-512 machine).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

#: the environment variables that choose the kernels (OpenBLAS, PyTorch's ATen) or their threads
KERNEL_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS",
                    "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # fmt: skip
#: /proc/cpuinfo flags -> the ISA names printed (the widest vector extensions a kernel may use)
ISA_FLAGS = {"avx2": "AVX2", "fma": "FMA", "avx512f": "AVX-512", "avx512_bf16": "AVX-512-BF16",
             "avx512_fp16": "AVX-512-FP16", "amx_tile": "AMX", "amx_bf16": "AMX-BF16"}  # fmt: skip


def cpu() -> tuple[str, list[str]]:
    """(CPU model name, the ISA extensions of :data:`ISA_FLAGS` it offers), from /proc/cpuinfo
    (platform.processor() elsewhere, with no ISA list)."""
    try:
        with open("/proc/cpuinfo") as fh:
            info = fh.read()
    except OSError:
        return platform.processor() or platform.machine(), []
    fields = dict(line.split(":", 1) for line in info.split("\n\n")[0].splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    return fields.get("model name", platform.machine()), [name for flag, name in ISA_FLAGS.items() if flag in flags]


def blas() -> list[str]:
    """One line per BLAS/OpenMP library loaded (threadpoolctl): its name and version, the kernel
    it runs (``architecture``) and its thread count."""
    from threadpoolctl import threadpool_info

    out = []
    for lib in threadpool_info():
        name = os.path.basename(lib.get("filepath", "?"))
        arch = lib.get("architecture")
        out.append(f"{lib.get('internal_api')} {lib.get('version') or ''} ({name})".replace("  ", " ")
                   + (f", kernel {arch}" if arch else "") + f", {lib.get('num_threads')} threads")  # fmt: skip
    return out


def torch_capability() -> str:
    """torch's CPU capability (the ATen kernels' ISA: DEFAULT, AVX2, AVX512), or why none."""
    try:
        import torch
    except ImportError:
        return "torch not installed"
    return f"torch {torch.__version__} CPU capability {torch.backends.cpu.get_cpu_capability()}"


def sgemm_gflops(n: int = 2048, runs: int = 3) -> float:
    """numpy's float32 matmul GFLOP/s on n x n (best of ``runs``, after one warm-up)."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def describe(gflops: float | None = None) -> list[str]:
    """The machine lines: CPU and ISA, BLAS kernels, torch's capability, the kernel variables,
    sgemm GFLOP/s (measured here unless given). numpy is imported first, so its BLAS is listed."""
    import numpy  # noqa: F401  (loads numpy's BLAS, so that threadpoolctl lists it)

    model, isa = cpu()
    capability = torch_capability()  # first: torch's OpenMP (and MKL) are then listed with the BLAS
    env = ", ".join(f"{k}={os.environ[k]}" for k in KERNEL_VARIABLES if k in os.environ) or "none set"
    return [
        f"machine: {model}; ISA {'/'.join(isa) or 'unknown'}; {os.cpu_count()} CPUs; {platform.python_version()}",
        *(f"machine: BLAS {line}" for line in blas()),
        f"machine: {capability}; kernel variables: {env}",
        f"machine: sgemm {gflops if gflops is not None else sgemm_gflops():.0f} GFLOP/s (numpy, 2048^3)",
    ]


def add_kernel_arguments(ap: argparse.ArgumentParser) -> None:
    """``--openblas-coretype`` and ``--aten-capability``: run under that kernel variant."""
    ap.add_argument("--openblas-coretype", default=None,
                    help="run under OPENBLAS_CORETYPE=NAME (e.g. Haswell, SkylakeX, Zen; OpenBLAS's kernel)")  # fmt: skip
    ap.add_argument("--aten-capability", default=None,
                    help="run under ATEN_CPU_CAPABILITY=NAME (default, avx2, avx512; torch's kernels)")  # fmt: skip


def use_kernel(args: argparse.Namespace) -> None:
    """Run this script again under the kernel variant ``args`` ask for, unless already under it:
    OpenBLAS and ATen read their variable only when they load."""
    wanted = {"OPENBLAS_CORETYPE": args.openblas_coretype, "ATEN_CPU_CAPABILITY": args.aten_capability}
    wanted = {k: v for k, v in wanted.items() if v is not None and os.environ.get(k) != v}
    if wanted:
        os.environ.update(wanted)
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, *sys.argv])
