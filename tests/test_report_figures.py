"""The report's figures show what they claim: Fig. 1 with CI bars (a 0.0 value still visible),
every Fig. A4 series visible when they coincide, histogram panels whose tick labels do not collide."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.container import ErrorbarContainer

from oodeval.report import figures as figs


def test_fig1_has_ci_bars_and_shows_a_zero_value():
    best = pd.DataFrame({"dataset": ["a", "b"], "fpr95": [0.0, 0.4], "det": ["knn", "msp"], "fpr95_lo": [0.0, 0.3], "fpr95_hi": [0.05, 0.5]})
    ax = figs.best_per_dataset(best, "m").axes[0]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 1
    segments = bars[0].lines[2][0].get_segments()
    assert sorted((round(s[0][0], 6), round(s[1][0], 6)) for s in segments) == [(0.0, 5.0), (30.0, 50.0)]
    marks = [line for line in ax.lines if line.get_marker() == "|"]
    assert marks and 0.0 in marks[0].get_xdata()  # the 0.0 bar has no width, its value mark shows
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["0.0 (k-NN)", "40.0 (MSP)"]  # the paper's labels


def test_figA4_series_at_the_same_values_stay_distinguishable():
    n = np.array([10, 20, 40])
    curves = {f"s{i}": {"n": n, "mean": np.zeros(3), "std": np.zeros(3), "full": 0.0, "detector": "msp"} for i in range(4)}
    ax = figs.subsampling_bands(curves, "m", None, None).axes[0]
    series = [line for line in ax.lines if line.get_label().startswith("s")]
    assert len({(line.get_marker(), line.get_markersize()) for line in series}) == 4  # each drawn differently
    assert all(line.get_markerfacecolor() == "none" for line in series)  # hollow: the smaller ones show inside
    assert ax.get_ylim()[0] < 0  # a series at 0 is above the frame, not on it


def test_histogram_panels_texts_do_not_collide():
    """Titles, axis labels and drawn tick labels of different panels never overlap (the old layout let
    long panel titles run into each other and a row's x label into the next row's title)."""
    rng = np.random.default_rng(0)
    panels = {f"model number {i} with a long name": ("relative_mahalanobis_pp", rng.normal(-123456.0, 5000.0, 200),
                                                      rng.normal(-130000.0, 5000.0, 200)) for i in range(5)}  # fmt: skip
    fig = figs.histograms(panels, "ood")
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()

    def drawn(axis, limits):  # the labels of ticks inside the view (matplotlib also keeps the outside ones, undrawn)
        lo, hi = sorted(limits)
        return [t for loc, t in zip(axis.get_majorticklocs(), axis.get_ticklabels()) if t.get_text() and lo <= loc <= hi]

    boxes = []
    for i, ax in enumerate(fig.axes):
        texts = drawn(ax.xaxis, ax.get_xlim()) + drawn(ax.yaxis, ax.get_ylim()) + [ax.title, ax.xaxis.label, ax.yaxis.label]
        boxes += [(i, t.get_window_extent(renderer)) for t in texts]
    assert len(boxes) > 5 * 7
    clashes = [(i, j) for a, (i, bi) in enumerate(boxes) for (j, bj) in boxes[a + 1:] if i != j and bi.overlaps(bj)]
    assert not clashes
    for ax in fig.axes:  # and within a panel, neighbouring x tick labels keep apart
        xs = sorted((t.get_window_extent(renderer) for t in drawn(ax.xaxis, ax.get_xlim())), key=lambda b: b.x0)
        assert all(a.x1 <= b.x0 for a, b in zip(xs, xs[1:]))
