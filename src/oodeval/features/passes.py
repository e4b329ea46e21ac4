"""The network passes of ODIN, Mahalanobis with input preprocessing, Gram, RankFeat, MC dropout, AdaSCALE and i-ODIN.

Each runs per batch beside the plain forward of :func:`oodeval.features.extract.extract` (so it is
cached, sharded and resumable like every extraction; settings in :mod:`.pass_options`), on the
model's input tensor x (after its own preprocessing), in float32 with autocast off, and returns
FeatureSet extras (float32, prefixed with its kind). What each stores:

* ``odin/logits`` (N, C): f(x~), x~ = x - eps sign(grad_x L) / std, L = sum_i CE(f(x_i) / T, argmax
  f(x_i)) (Liang et al., ICLR 2018, eq. 2; one backward pass). The detector takes max softmax(f / T).
* ``mds/<layer>`` (N, C_l): the spatial mean of layer l's output (Lee et al., NeurIPS 2018). With
  noise eps > 0, of the input x~ = x - eps sign(grad_x (1/2) min_c (h - mu_c)' S^+ (h - mu_c)) / std
  perturbed for that layer (one backward and one forward per layer), mu_c, S the layer's class
  means and tied covariance fitted on the ``fit`` set's ``mds/<layer>`` with its labels (float64,
  S^+ from eigh with numpy's pseudo-inverse cutoff, as the ``mahalanobis`` detector; :func:`gaussians`);
  noise 0 is the clean features (the fit set itself).
* ``gram/<layer>`` (N, P, C_l): for p = 1..P, the row sums of the p-th order Gram matrix of the
  feature map F (C_l x HW), G_p = sum_j (F^p F^p')_{.j}, then sign(G_p) |G_p|^(1/p) (Sastry & Oore,
  ICML 2020; computed in float64; the row sums as in both peers' releases).
* ``rankfeat/<block>`` (N, C): the logits when the block's output X (C x HW per image) is replaced by
  X - s_1 u_1 v_1' (its exact SVD in float64, or ``iterations`` steps of the power iteration from
  a seeded start) and the rest of the network runs on (Song et al., NeurIPS 2022); one forward per block.
* ``mcd/probs`` (N, C), ``mcd/logits`` (N, C), ``mcd/var`` (N,): the mean softmax, the mean logits and
  the mean over classes of the per-class variance (N - 1 in the denominator) of T stochastic
  forwards (Gal & Ghahramani, ICML 2016): dropout with rate p on the classifier's input
  (``where="head"``, OpenOOD's ``forward_with_dropout``) or the model's own dropout in train mode
  with BatchNorm kept in eval mode (``where="model"``, pytorch-ood's ``MCD``). The masks come from
  torch's generator seeded with ``seed`` + the batch's first row, so the batch size is part of the key.
* ``adascale/features`` (N, D): the penultimate feature (the classifier's input) at x + step sign(g) on
  the int(o C H W) values of smallest |g|, g = grad_x sum_i max_c f(x_i)_c (AdaSCALE, arXiv 2503.08023;
  OpenOOD's ``adascale_postprocessor.py``): one backward and one forward.
* ``iodin/logits`` (N, C): f(x~), ODIN's loss and step at the one value of each image with the
  largest |grad| (i-ODIN, arXiv 2411.10794; OpenOOD's ``iodin_postprocessor.py``): one backward and one forward.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError
from .featureset import FeatureSet
from .pass_options import PassSpec, fit_digests
from .preprocess import split_transform

__all__ = ["Context", "NetPass", "build_passes", "key_entries", "context_of", "remove_rank1", "gram_rows", "model_logits",
           "perturb", "PREFIX"]

PREFIX = {kind: f"{kind}/" for kind in ("odin", "mds", "gram", "rankfeat", "mcd")}


@dataclass
class Context:
    """What a pass reads of the model: the module, the probe head applied to its output (a frozen
    backbone with a linear probe) or None, the head module (the classifier whose input is the
    pre-logit feature), the input normalisation's std, and the model's stages (default layers)."""

    model: nn.Module
    probe: nn.Module | None
    head: nn.Module | None
    std: tuple[float, ...] | None
    stages: list[str]
    modules: dict[str, nn.Module] = field(default_factory=dict)


def context_of(bb) -> Context:
    """The :class:`Context` of a loaded :class:`~oodeval.features.backbones.Backbone` (its probe
    head, when attached, as a Linear applied to the model's output)."""
    model = bb.model
    probe = None
    if bb._probe is not None:
        w, b = bb._probe
        probe = nn.Linear(w.shape[1], w.shape[0], device=w.device).requires_grad_(False)
        with torch.no_grad():
            probe.weight.copy_(w)
            probe.bias.copy_(b)
    modules = dict(model.named_modules())
    std = None
    if bb.kind == "timm":
        std = tuple(float(s) for s in bb.preprocessing["data_config"]["std"])
        info = getattr(model, "feature_info", None)
        stages = [e["module"] for e in (info.get_dicts() if hasattr(info, "get_dicts") else list(info or []))]
        head = model.get_classifier() if probe is None else probe
    else:
        split = split_transform(bb.transform)  # a transform ending in ToTensor + Normalize: its std
        std = None if split is None else tuple(split.std)
        stages = [n for n in ("layer1", "layer2", "layer3", "layer4") if n in modules]
        head = getattr(bb, "classifier", None) if probe is None else probe
    if bb.kind not in ("timm", "module", "python"):
        raise InputError(f"the network passes ({', '.join(PREFIX)}) need a classifier (timm or your own module), not {bb.kind}")
    return Context(model, probe, head if isinstance(head, nn.Module) else None, std, stages, modules)


def model_logits(ctx: Context, x: Tensor) -> Tensor:
    """The classifier's logits (B, C) on x: the model's output (its first element when a tuple),
    through the probe head when there is one."""
    out = ctx.model(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    if ctx.probe is not None:
        out = ctx.probe(out)
    if not isinstance(out, Tensor) or out.ndim != 2:
        raise InputError(f"the network passes need a model that returns logits (B, C), got {type(out).__name__}")
    return out.float()


def perturb(x: Tensor, grad: Tensor, noise: float, std: Sequence[float] | None) -> Tensor:
    """x - noise * sign(grad) / std (per channel; std None: in model-input units)."""
    step = grad.sign()
    if std is not None:
        if len(std) != x.shape[1]:
            raise InputError(f"std has {len(std)} channels but the input has {x.shape[1]}")
        step = step / torch.tensor(std, dtype=step.dtype, device=step.device).view(1, -1, *([1] * (x.ndim - 2)))
    return x.detach() - noise * step


@contextmanager
def _hooked(ctx: Context, names: Sequence[str], edit: Callable[[str, Tensor], Tensor] | None = None,
            reduce: Callable[[str, Tensor], Tensor] | None = None):
    """Capture the outputs of the named modules into a dict: ``reduce(name, output)`` taken when the
    module returns (before a later in-place operation can change the output), or the output itself;
    ``edit``: replace the output by ``edit(name, output)``."""
    unknown = [n for n in names if n not in ctx.modules]
    if unknown:
        raise InputError(f"unknown layer names {unknown}; the model has e.g. {list(ctx.modules)[1:8]}")
    box: dict[str, Tensor] = {}

    def hook_for(name: str):
        def hook(_m, _inp, out):
            out = out[0] if isinstance(out, tuple) else out
            if edit is not None:
                out = edit(name, out)
            box[name] = out if reduce is None else reduce(name, out)
            return out if edit is not None else None

        return hook

    handles = [ctx.modules[n].register_forward_hook(hook_for(n)) for n in names]
    try:
        yield box
    finally:
        for h in handles:
            h.remove()


def _pooled(t: Tensor, name: str) -> Tensor:
    """The spatial mean (B, C) of a layer output (B, C, H, W); a (B, C) output as is."""
    if t.ndim == 4:
        return t.float().mean(dim=(2, 3))
    if t.ndim == 2:
        return t.float()
    raise InputError(f"layer {name!r} gives outputs of shape {tuple(t.shape)}; the mds pass needs (B, C, H, W) or (B, C)")


def remove_rank1(t: Tensor, iterations: int = 0) -> Tensor:
    """X - s_1 u_1 v_1' for each image's feature matrix X (C x HW) of t (B, C, H, W), in float64: by
    exact SVD (``iterations`` 0), or by that many power-iteration steps v <- X'u / |X'u|, u <- X v / |X v|
    from one start u_0 ~ N(0, I) (seed 0, the same for every image), s_1 = u' X v (the paper's form)."""
    if t.ndim != 4:
        raise InputError(f"rankfeat needs a feature map (B, C, H, W), got {tuple(t.shape)}")
    b, c, h, w = t.shape
    if h * w == 1:
        raise InputError(f"rankfeat: a {c} x 1 x 1 feature map is its own rank-1 part (nothing would be left); "
                         "give a larger input or other blocks (blocks=...)")
    m = t.reshape(b, c, h * w).double()
    if iterations:
        u = torch.randn(c, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(m.device).expand(b, c)[:, None, :]
        for _ in range(iterations):
            v = F.normalize(u @ m, dim=2)  # (B, 1, HW)
            u = F.normalize(v @ m.transpose(1, 2), dim=2)  # (B, 1, C)
        rank1 = (u @ m @ v.transpose(1, 2)) * (u.transpose(1, 2) @ v)
    else:
        u, s, vh = torch.linalg.svd(m, full_matrices=False)
        rank1 = s[:, :1, None] * (u[:, :, :1] @ vh[:, :1, :])
    return (m - rank1).to(t.dtype).reshape(b, c, h, w)


def gram_rows(t: Tensor, powers: int) -> Tensor:
    """(B, P, C): for p = 1..P, sign(G) |G|^(1/p) with G the row sums of (F^p)(F^p)', F = t (B, C, HW), float64."""
    if t.ndim != 4:
        raise InputError(f"gram needs feature maps (B, C, H, W), got {tuple(t.shape)}")
    f = t.detach().double().flatten(2)
    out = []
    for p in range(1, powers + 1):
        fp = f**p
        g = torch.einsum("bcs,bds->bc", fp, fp)
        out.append(g.sign() * g.abs() ** (1.0 / p))
    return torch.stack(out, dim=1)


class NetPass:
    """One pass of a :class:`PassSpec`: ``resolve`` fixes what depends on the model (layers, std),
    ``__call__`` returns its extras for a batch, ``recorded`` its settings for ``meta["passes"]``."""

    def __init__(self, spec: PassSpec) -> None:
        self.spec, self.kind = spec, spec.kind
        self.resolved: dict = {}
        #: the settings as the cache key holds them (:func:`key_entries`, plus mcd's batch and shard size)
        self.keyed: dict = key_entries(spec)

    def resolve(self, ctx: Context) -> None:
        self.resolved = {}

    def recorded(self) -> dict:
        """``meta["passes"][kind]``: the keyed settings and what :meth:`resolve` fixed."""
        return {**self.keyed, **self.resolved}

    def __call__(self, ctx: Context, x: Tensor, first_row: int) -> dict[str, Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _std(self, ctx: Context) -> tuple[float, ...] | None:
        given = self.spec.get("std")
        return tuple(given) if given is not None else ctx.std

    def _layers(self, ctx: Context, key: str = "layers") -> list[str]:
        given = self.spec.get(key)
        layers = list(given) if given is not None else (ctx.stages[-2:] if key == "blocks" else list(ctx.stages))
        if not layers:
            raise InputError(f"{self.kind}: the model has no stages to default to; name them ({key}=layer3+layer4)")
        unknown = [n for n in layers if n not in ctx.modules]
        if unknown:
            raise InputError(f"{self.kind}: unknown layer names {unknown}; the model has e.g. {list(ctx.modules)[1:8]}")
        return layers


class OdinPass(NetPass):
    #: the input step along the gradient (i-ODIN's pass replaces it)
    step = staticmethod(perturb)

    def resolve(self, ctx: Context) -> None:
        self.resolved = {"std": None if self._std(ctx) is None else list(self._std(ctx))}

    def __call__(self, ctx: Context, x: Tensor, first_row: int) -> dict[str, Tensor]:
        t, eps = float(self.spec.get("temperature")), float(self.spec.get("noise"))
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            f = model_logits(ctx, xg)
            loss = F.cross_entropy(f / t, f.detach().argmax(dim=1), reduction="sum")  # each image's own gradient
            (grad,) = torch.autograd.grad(loss, xg)
        with torch.no_grad():
            return {f"{self.kind}/logits": model_logits(ctx, self.step(x, grad, eps, self._std(ctx)))}


class MdsPass(NetPass):
    """``fit``: per layer (center m, whitening W, whitened class means nu) of the fitted Gaussians."""

    def __init__(self, spec: PassSpec, fit: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
                 digest: dict[str, str] | None = None) -> None:
        super().__init__(spec)
        self.fit, self.digest = fit, digest

    def resolve(self, ctx: Context) -> None:
        layers = self._layers(ctx)
        if self.fit is not None and sorted(self.fit) != sorted(layers):
            raise InputError(f"mds: the fit set holds layers {sorted(self.fit)}, this pass taps {sorted(layers)}; give the same layers")
        self.resolved = {"layers": layers, "std": None if self._std(ctx) is None else list(self._std(ctx))}
        if self.digest is not None:
            self.resolved["gaussians"] = self.digest

    def __call__(self, ctx: Context, x: Tensor, first_row: int) -> dict[str, Tensor]:
        layers, eps = self.resolved["layers"], float(self.spec.get("noise"))
        if eps == 0:
            with torch.no_grad(), _hooked(ctx, layers, reduce=lambda n, t: _pooled(t, n)) as box:
                ctx.model(x)
                return {f"mds/{n}": box[n] for n in layers}
        out = {}
        for name in layers:
            center, white, nu = (torch.as_tensor(a, dtype=torch.float32, device=x.device) for a in self.fit[name])
            with torch.enable_grad(), _hooked(ctx, [name], reduce=lambda n, t: _pooled(t, n)) as box:
                xg = x.detach().requires_grad_(True)
                ctx.model(xg)
                u = (box[name] - center) @ white
                d = (u[:, None, :] - nu[None]).pow(2).sum(dim=2)
                closest = d.detach().argmin(dim=1)
                loss = 0.5 * d.gather(1, closest[:, None]).sum()
                (grad,) = torch.autograd.grad(loss, xg)
            with torch.no_grad(), _hooked(ctx, [name], reduce=lambda n, t: _pooled(t, n)) as box:
                ctx.model(perturb(x, grad, eps, self._std(ctx)))
                out[f"mds/{name}"] = box[name]
        return out


class GramPass(NetPass):
    def resolve(self, ctx: Context) -> None:
        self.resolved = {"layers": self._layers(ctx)}

    def __call__(self, ctx: Context, x: Tensor, first_row: int) -> dict[str, Tensor]:
        layers, powers = self.resolved["layers"], int(self.spec.get("powers"))
        with torch.no_grad(), _hooked(ctx, layers, reduce=lambda _n, t: gram_rows(t, powers).float()) as box:
            ctx.model(x)
            return {f"gram/{n}": box[n] for n in layers}


class RankFeatPass(NetPass):
    def resolve(self, ctx: Context) -> None:
        self.resolved = {"blocks": self._layers(ctx, "blocks")}

    def __call__(self, ctx: Context, x: Tensor, first_row: int) -> dict[str, Tensor]:
        out = {}
        with torch.no_grad():
            for name in self.resolved["blocks"]:
                with _hooked(ctx, [name], edit=lambda _n, t: remove_rank1(t, int(self.spec.get("iterations")))):
                    out[f"rankfeat/{name}"] = model_logits(ctx, x)
        return out


class McdPass(NetPass):
    def resolve(self, ctx: Context) -> None:
        if self.spec.get("where") == "head" and ctx.head is None:
            raise InputError("mcd where='head' needs the classifier module (its input gets the dropout)")
        if self.spec.get("where") == "model" and not _has_dropout(ctx.model):
            raise InputError("mcd where='model' needs a model with dropout (an nn.Dropout with p > 0 or timm's drop_rate > 0, "
                             "e.g. --model-kwargs '{\"drop_rate\": 0.5}'); or use where=head (dropout on the classifier's input)")
        self.resolved = {}

    def __call__(self, ctx: Context, x: Tensor, first_row: int) -> dict[str, Tensor]:
        samples, seed = int(self.spec.get("samples")), int(self.spec.get("seed"))
        devices = [x.device] if x.device.type == "cuda" else []
        probs, logits = [], None
        draw = self._head_draw(ctx, x) if self.spec.get("where") == "head" else None
        with torch.no_grad(), torch.random.fork_rng(devices=devices), _stochastic(ctx, self.spec, draw is None):
            torch.manual_seed(seed + first_row)
            for _ in range(samples):
                f = model_logits(ctx, x) if draw is None else draw()
                probs.append(f.softmax(dim=1))
                logits = f if logits is None else logits + f
        stacked = torch.stack(probs)
        var = stacked.var(dim=0).mean(dim=1) if samples > 1 else torch.zeros(x.shape[0], device=x.device)
        return {"mcd/probs": stacked.mean(dim=0), "mcd/logits": logits / samples, "mcd/var": var}


    def _head_draw(self, ctx: Context, x: Tensor) -> Callable[[], Tensor] | None:
        """With dropout on the classifier's input only, the trunk runs once: a function drawing
        head(dropout(z)) from the captured input z, when the logits are exactly head(z) (else None:
        every sample runs the whole model)."""
        box: dict[str, Tensor] = {}

        def keep(_m, inp):
            box["z"] = inp[0]

        handle = ctx.head.register_forward_pre_hook(keep)
        try:
            with torch.no_grad():
                f = model_logits(ctx, x)
        finally:
            handle.remove()
        if "z" not in box:
            return None
        z, p = box["z"], float(self.spec.get("p"))
        with torch.no_grad():
            if not torch.equal(ctx.head(z).float(), f):
                return None
        return lambda: ctx.head(F.dropout(z, p, training=True)).float()


def _has_dropout(model: nn.Module) -> bool:
    drops = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
    return any(isinstance(m, drops) and m.p > 0 for m in model.modules()) or float(getattr(model, "drop_rate", 0) or 0) > 0


@contextmanager
def _stochastic(ctx: Context, spec: PassSpec, whole_model: bool = True):
    """Dropout on: on the head's input (``where="head"``; nothing to do when the head is called
    directly, ``whole_model`` False), or the model in train mode with its BatchNorm layers in eval
    mode (``where="model"``); the model is back in eval mode afterwards."""
    if spec.get("where") == "head" and not whole_model:
        yield
        return
    if spec.get("where") == "head":
        p = float(spec.get("p"))
        handle = ctx.head.register_forward_pre_hook(lambda _m, inp: (F.dropout(inp[0], p, training=True), *inp[1:]))
        try:
            yield
        finally:
            handle.remove()
        return
    ctx.model.train()
    for m in ctx.model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()
    try:
        yield
    finally:
        ctx.model.eval()


_CLASSES = {"odin": OdinPass, "mds": MdsPass, "gram": GramPass, "rankfeat": RankFeatPass, "mcd": McdPass}


def key_entries(spec: PassSpec) -> dict:
    """The settings of ``spec`` as the cache key holds them: mds's ``fit`` folder by the content
    hash of that FeatureSet (so a refitted ID-train set is a new entry), not by its path."""
    out = spec.describe()
    if spec.kind == "mds" and spec.get("fit") is not None:
        out["fit"] = _fit_hash(spec.get("fit"))
    return out


def _fit_hash(path: str) -> str:
    try:
        return str(json.loads((Path(path) / "meta.json").read_text())["content_hash"])
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"mds fit={path}: not a FeatureSet folder ({exc}); extract the ID-train set with --mds noise=0") from exc


def gaussians(z: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(center m, whitening W, whitened class means nu) of class-conditional Gaussians with a tied
    covariance S fitted on the labelled rows of ``z`` (float64): (h - mu_c)' S^+ (h - mu_c) =
    ||(h - m) W - nu_c||^2, S^+ = W W' over the eigenvalues above numpy's pseudo-inverse cutoff."""
    y = np.asarray(labels)
    keep = y >= 0
    if not keep.any():
        raise InputError("mds: the fit set has no class labels (all are -1)")
    z64, y = np.asarray(z, dtype=np.float64)[keep], y[keep]
    classes = np.unique(y)
    means = np.stack([z64[y == c].mean(axis=0) for c in classes])
    centred = z64 - means[np.searchsorted(classes, y)]
    vals, vecs = np.linalg.eigh(centred.T @ centred / len(z64))
    kept = vals > vals.max() * max(vals.shape) * np.finfo(np.float64).eps
    white = vecs[:, kept] / np.sqrt(vals[kept])
    center = z64.mean(axis=0)
    return center, white, (means - center) @ white


def _mds_fit(spec: PassSpec) -> tuple[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] | None, dict[str, str] | None]:
    """Per layer (center, whitening, whitened class means) of the Gaussians fitted on the fit set,
    and the digests of what they are fitted on (:func:`~oodeval.features.pass_options.fit_digests`)."""
    if float(spec.get("noise")) == 0:
        if spec.get("fit") is not None:
            raise InputError("mds: fit applies to noise > 0 (the clean pass is what a fit set holds)")
        return None, None
    if spec.get("fit") is None:
        raise InputError("mds with noise > 0 perturbs along the ID-train Gaussians: give fit=ID_TRAIN_FEATURESET, the ID-train "
                         "set extracted with --mds noise=0 (oodeval run does this itself)")
    train = FeatureSet.load(spec.get("fit"))
    stored = [k[len("mds/") :] for k in sorted(train.extras) if k.startswith("mds/")]
    layers = list(spec.get("layers")) if spec.get("layers") is not None else stored
    missing = [n for n in layers if n not in stored]
    if missing or not layers:
        raise InputError(f"mds fit={spec.get('fit')}: layers {missing or layers} are not in its mds pass, which holds {stored}")
    fit = {n: gaussians(train.extras[f"mds/{n}"], train.labels) for n in layers}
    return fit, fit_digests(train, layers)


def build_passes(specs: Sequence[PassSpec]) -> list[NetPass]:
    """The passes of ``specs`` in :data:`pass_options.KINDS` order (each kind once)."""
    kinds = [s.kind for s in specs]
    if len(set(kinds)) != len(kinds):
        raise InputError(f"a network pass is given twice: {kinds}")
    out = []
    for spec in specs:
        out.append(MdsPass(spec, *_mds_fit(spec)) if spec.kind == "mds" else _CLASSES[spec.kind](spec))
    return out


# ---------------------------------------------------------------- the passes of OpenOOD's methods since v1.5
def _head_input(ctx: Context, x: Tensor) -> Tensor:
    """The classifier's input (the penultimate feature the plain forward stores) on x, float32."""
    if ctx.head is None:
        raise InputError("this pass reads the classifier's input (the penultimate feature): it needs the head module")
    box: dict[str, Tensor] = {}
    handle = ctx.head.register_forward_pre_hook(lambda _m, inp: box.__setitem__("z", inp[0]))
    try:
        model_logits(ctx, x)
    finally:
        handle.remove()
    return box["z"].float()


def adascale_perturb(x: Tensor, grad: Tensor, o: float, step: float) -> Tensor:
    """x + step sign(grad) on the int(o C H W) values of each image with the smallest |grad| (torch.topk
    over the image's values in (C, H, W) order), the others unchanged (AdaSCALE's perturbation)."""
    b = x.shape[0]
    flat = grad.abs().reshape(b, -1)
    n = int(flat.shape[1] * o)
    mask = torch.zeros_like(flat).scatter_(1, torch.topk(flat, n, dim=1, largest=False).indices, 1.0).reshape(x.shape)
    return x.detach() + grad.sign() * mask * step


def iodin_perturb(x: Tensor, grad: Tensor, noise: float, std: Sequence[float] | None) -> Tensor:
    """x - noise s / std at the one value of each image with the largest |grad| (the first where
    several tie), s = +1 where grad >= 0 else -1 (i-ODIN's perturbation); the others unchanged."""
    b = x.shape[0]
    flat = grad.abs().reshape(b, -1)
    mask = torch.zeros_like(flat).scatter_(1, flat.argmax(dim=1, keepdim=True), 1.0).reshape(x.shape)
    step = torch.where(grad >= 0, 1.0, -1.0).to(x.dtype)
    if std is not None:
        if len(std) != x.shape[1]:
            raise InputError(f"std has {len(std)} channels but the input has {x.shape[1]}")
        step = step / torch.tensor(std, dtype=step.dtype, device=step.device).view(1, -1, *([1] * (x.ndim - 2)))
    return x.detach() - noise * step * mask


class AdaScalePass(NetPass):
    """``adascale/features`` (N, D): the penultimate feature at x~ = :func:`adascale_perturb` of x along
    the gradient of the maximum logit (summed over the batch: each image's own gradient)."""

    def resolve(self, ctx: Context) -> None:
        if ctx.head is None:
            raise InputError("adascale reads the classifier's input (the penultimate feature): it needs the head module")
        self.resolved = {}

    def __call__(self, ctx: Context, x: Tensor, first_row: int) -> dict[str, Tensor]:
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            f = model_logits(ctx, xg)
            top = f.gather(1, f.detach().argmax(dim=1, keepdim=True)).sum()
            (grad,) = torch.autograd.grad(top, xg)
        with torch.no_grad():
            return {"adascale/features": _head_input(ctx, adascale_perturb(x, grad, float(self.spec.get("o")), float(self.spec.get("step"))))}


class IodinPass(OdinPass):
    """``iodin/logits`` (N, C): f(x~), x~ = :func:`iodin_perturb` of x along ODIN's gradient of
    sum_i CE(f(x_i) / T, argmax f(x_i)) (one backward pass)."""

    step = staticmethod(iodin_perturb)


PREFIX.update({"adascale": "adascale/", "iodin": "iodin/"})
_CLASSES.update({"adascale": AdaScalePass, "iodin": IodinPass})
