"""The paper's detector labels in report tables and figures (``relative_mahalanobis_pp`` -> ``rMaha++``).

Each detector and zero-shot scorer class declares its label beside itself (``label = "rMaha++"``,
:attr:`oodeval.detectors.base.Detector.label`; the list is in docs/detectors.md); one without a
label shows its registry name. Results tables, CSVs, the reference comparison's keys and the
views' ``det`` column keep the registry names; only what a reader sees is a label, and the HTML
page shows the name as the label's tooltip (:func:`det_cell`).
"""

from __future__ import annotations

from .. import detectors
from .views import ZS_PREFIX, Cell

__all__ = ["detector_label", "det_cell"]


def _declared(name: str, zero_shot: bool) -> str:
    """The label the class registered as ``name`` declares itself ('' when none, or not registered):
    zero-shot scorers first for a ``zs:`` name, else the post-hoc detectors first; a name both
    register (mcm, energy, ...) carries one label in both, or in one of them only (entropy)."""
    registries = [detectors.REGISTRY]
    try:
        from ..zeroshot.scorers import REGISTRY as ZS

        registries.insert(0 if zero_shot else 1, ZS)
    except ImportError:  # the zero-shot package's dependencies are optional here
        pass
    return next((label for r in registries if name in r and (label := vars(r[name]).get("label", ""))), "")


def detector_label(det: str) -> str:
    """The paper's label of a detector as the results and views name it: a registry name
    (``relative_mahalanobis_pp`` -> ``rMaha++``), kept with what a view adds to it (the ``zs:``
    prefix, ``[vocabulary]``, `` k=5`` settings, a Tab. 2 column's ``:vocabulary``: ``zs:mcm`` -> ``zs:MCM``,
    ``knn k=5`` -> ``k-NN k=5``, ``neglabel:wordnet`` -> ``NegLabel:wordnet``);
    a name whose class declares no label (a plugin's, a peer method's) or that is no registry name
    (a label the experiment gave) is returned as it is."""
    zero_shot = det.startswith(ZS_PREFIX)
    body = det.removeprefix(ZS_PREFIX)
    cut = min([i for i in (body.find("["), body.find(" "), body.find(":")) if i >= 0], default=len(body))
    label = _declared(body[:cut], zero_shot)
    return (ZS_PREFIX if zero_shot else "") + (label or body[:cut]) + body[cut:]


def det_cell(det: str, **emphasis: bool) -> Cell:
    """A table cell naming a detector: its paper label, the registry name as the tooltip (``title``)."""
    return Cell(detector_label(det), title=str(det), **emphasis)
