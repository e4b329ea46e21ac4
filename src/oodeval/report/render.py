"""Render report views and figures as Markdown, LaTeX and one self-contained HTML page
(images inlined as base64 PNG, no external resources)."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import pandas as pd

from .views import Cell, Figure, View

__all__ = ["markdown", "latex", "html_page"]


def _cells(frame: pd.DataFrame) -> list[list[Cell]]:
    return [[v if isinstance(v, Cell) else Cell("–" if v is None or (isinstance(v, float) and pd.isna(v)) else str(v)) for v in row] for row in frame.itertuples(index=False, name=None)]


# ---------------------------------------------------------------------------- Markdown
def _md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("*", "\\*").replace("_", "\\_")


def _md_cell(c: Cell) -> str:
    t = _md_escape(c.text.strip()) or " "
    if c.bold:
        t = f"**{t}**"
    if c.underline:
        t = f"<u>{t}</u>"
    return t


Summary = list[tuple[str, list[str]]]


def markdown(title: str, intro: str, views: list[View], figures: list[Figure], base: Path, summary: Summary = ()) -> str:
    """The whole report as GitHub-flavoured Markdown (figures linked relative to ``base``); the run
    ``summary`` (:func:`oodeval.report.summary.run_summary`) first, views and figures without data only there."""
    out = [f"# {title}", ""]
    for line, subs in summary:
        out += [f"- {line}"] + [f"  - {s}" for s in subs]
    out += ["", intro, ""]
    for v in views:
        if not v.present:
            if not summary:
                out += [f"## {v.title}", "", v.caption, "", f"*{v.note}*", ""]
            continue
        out += [f"## {v.title}", "", v.caption, ""]
        cols = [str(c) for c in v.frame.columns]
        out.append("| " + " | ".join(_md_escape(c) for c in cols) + " |")
        out.append("|" + "|".join("---" for _ in cols) + "|")
        for row in _cells(v.frame):
            out.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
        out.append("")
    out += ["## Figures", ""]
    for f in figures:
        if summary and not f.path:
            continue
        out += [f"### {f.title}", "", f.caption, ""]
        if f.path:
            rel = Path(f.path).relative_to(base)
            vector = [f"[{s.upper()}]({rel.with_suffix('.' + s).as_posix()})" for s in ("pdf", "svg") if Path(f.path).with_suffix("." + s).is_file()]
            out += [f"![{f.title}]({rel.as_posix()})", ""] + ([f"Vector: {', '.join(vector)}", ""] if vector else [])
        elif not summary:
            out += [f"*{f.note}*", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------- LaTeX
_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "–": "--", "—": "---", "≤": r"$\leq$", "Δ": r"$\Delta$"}


_LONG = 40  # tables with more rows become a longtable


def _tex(s: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in s)


def _tex_cell(c: Cell) -> str:
    t = _tex(c.text.strip())
    if c.bold:
        t = rf"\textbf{{{t}}}"
    if c.underline:
        t = rf"\underline{{{t}}}"
    if c.muted:
        t = rf"\textcolor{{gray}}{{{t}}}"
    return t


def _tex_figure(png: Path) -> Path:
    """The PDF beside a figure's PNG when it was written, else the PNG."""
    pdf = png.with_suffix(".pdf")
    return pdf if pdf.is_file() else png


def latex(title: str, intro: str, views: list[View], figures: list[Figure], base: Path, summary: Summary = ()) -> str:
    """A standalone LaTeX document (booktabs tables, figures by relative path, as PDF where written),
    opening with the run ``summary``; views and figures without data only there."""
    out = [
        r"\documentclass{article}",
        r"\usepackage[margin=1.5cm,landscape]{geometry}",
        r"\usepackage{booktabs,graphicx,xcolor,longtable}",
        r"\begin{document}",
        rf"\section*{{{_tex(title)}}}",
    ]
    if summary:
        out.append(r"\begin{itemize}")
        for line, subs in summary:
            out.append(rf"\item {_tex(line)}")
            if subs:
                out += [r"\begin{itemize}", *(rf"\item {_tex(s)}" for s in subs), r"\end{itemize}"]
        out.append(r"\end{itemize}")
    out += [_tex(intro), ""]
    for v in views:
        if not v.present:
            if not summary:
                out += [rf"\paragraph{{{_tex(v.title)}}} \emph{{{_tex(v.note)}}}", ""]
            continue
        cols = [str(c) for c in v.frame.columns]
        spec = "l" + "r" * (len(cols) - 1)
        caption = rf"\caption{{\textbf{{{_tex(v.title)}}}. {_tex(v.caption)}}}"
        head = [r"\toprule", " & ".join(_tex(c) for c in cols) + r" \\", r"\midrule"]
        body = [" & ".join(_tex_cell(c) for c in row) + r" \\" for row in _cells(v.frame)]
        if len(body) > _LONG:  # breaks across pages, header repeated
            out += [r"{\scriptsize", rf"\begin{{longtable}}{{{spec}}}", caption + r" \\", *head, r"\endhead", *body, r"\bottomrule", r"\end{longtable}}", ""]
        else:
            out += [r"\begin{table}[ht]", r"\centering\scriptsize", caption, rf"\begin{{tabular}}{{{spec}}}", *head, *body]
            out += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    for f in figures:
        if f.path:
            out += [
                r"\begin{figure}[ht]",
                r"\centering",
                rf"\includegraphics[width=0.7\linewidth]{{{_tex_figure(Path(f.path)).relative_to(base).as_posix()}}}",
                rf"\caption{{\textbf{{{_tex(f.title)}}}. {_tex(f.caption)}}}",
                r"\end{figure}",
                "",
            ]
        elif not summary:
            out += [rf"\paragraph{{{_tex(f.title)}}} \emph{{{_tex(f.note)}}}", ""]
    out += [r"\end{document}", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------- HTML
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:0.6em 0 1.6em;font-size:13px}
th,td{border-bottom:1px solid #ddd;padding:3px 9px;text-align:right;white-space:nowrap}
th{border-bottom:2px solid #444;background:#f4f4f4}
td:first-child,th:first-child{text-align:left}
td.muted{color:#555} span[title]{border-bottom:1px dotted #666;cursor:help} td.text{text-align:left} .note{color:#555;font-style:italic} .caption{max-width:1000px;color:#333}
ul.summary{background:#f6f8fa;border:1px solid #d0d7de;padding:0.8em 0.8em 0.8em 2em;max-width:1300px}
ul.summary li{margin:0.2em 0} li.omitted{color:#444}
details.fold summary{cursor:pointer;color:#0550ae;margin:-1.2em 0 1.6em}
figure{margin:1em 0 2em} figure img{max-width:100%;border:1px solid #eee}
nav a{margin-right:1em}
"""


_NUMERIC = re.compile(r"^[-+–]?[\d.]")


def _html_text(c: Cell) -> str:
    """The cell's text, with its ``title`` (a detector's registry name) as a tooltip where it differs."""
    t = html.escape(c.text)
    return f'<span title="{html.escape(c.title)}">{t}</span>' if c.title and c.title != c.text else t


def _html_cell(c: Cell) -> str:
    t = _html_text(c)
    if c.bold:
        t = f"<b>{t}</b>"
    if c.underline:
        t = f"<u>{t}</u>"
    classes = [name for name, on in (("muted", c.muted), ("text", not _NUMERIC.match(c.text.strip()))) if on]
    return f'<td class="{" ".join(classes)}">{t}</td>' if classes else f"<td>{t}</td>"


#: a table with more rows shows its head and first :data:`FOLD_SHOWN` rows, the rest in a <details>
FOLD_ROWS = 20
FOLD_SHOWN = 10


def _html_summary(summary: Summary) -> str:
    items = []
    for line, subs in summary:
        inner = "".join(f'<li class="omitted">{html.escape(s)}</li>' for s in subs)
        items.append(f"<li>{html.escape(line)}" + (f"<ul>{inner}</ul>" if inner else "") + "</li>")
    return '<ul class="summary" id="summary">' + "".join(items) + "</ul>"


def _html_table(v: View) -> list[str]:
    """The view's table; a long one folded: head and first rows visible, the rest (same head) in <details>."""
    head = "<thead><tr>" + "".join(f"<th>{_html_text(c if isinstance(c, Cell) else Cell(str(c)))}</th>" for c in v.frame.columns) + "</tr></thead>"
    rows = ["<tr>" + "".join(_html_cell(c) for c in row) + "</tr>" for row in _cells(v.frame)]
    if len(rows) <= FOLD_ROWS:
        return [f'<table data-view="{v.key}">{head}<tbody>', *rows, "</tbody></table>"]
    return [f'<table data-view="{v.key}">{head}<tbody>', *rows[:FOLD_SHOWN], "</tbody></table>",
            f'<details class="fold" data-fold="{v.key}"><summary>show the other {len(rows) - FOLD_SHOWN} of {len(rows)} rows</summary>',
            f'<table data-view-rest="{v.key}">{head}<tbody>', *rows[FOLD_SHOWN:], "</tbody></table></details>"]  # fmt: skip


def html_page(title: str, intro: str, views: list[View], figures: list[Figure], summary: Summary = ()) -> str:
    """One self-contained HTML page: the run ``summary`` first (views and figures without data only
    there), every figure embedded as a base64 PNG data URI, long tables folded."""
    shown = [v for v in views if v.present or not summary]
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        _html_summary(summary) if summary else "",
        f"<p>{html.escape(intro)}</p>",
        "<nav>" + "".join(f'<a href="#{v.key}">{html.escape(v.title.split(" — ")[0])}</a>' for v in shown) + '<a href="#figures">Figures</a></nav>',
    ]
    for v in shown:
        out.append(f'<section id="{v.key}"><h2>{html.escape(v.title)}</h2><p class="caption">{html.escape(v.caption)}</p>')
        if not v.present:
            out.append(f'<p class="note">{html.escape(v.note)}</p></section>')
            continue
        out += _html_table(v)
        out.append("</section>")
    out.append('<section id="figures"><h2>Figures</h2>')
    for f in figures:
        if summary and not f.path:
            continue
        if f.path:
            data = base64.b64encode(Path(f.path).read_bytes()).decode("ascii")
            out.append(
                f'<figure data-figure="{f.key}"><img alt="{html.escape(f.title)}" src="data:image/png;base64,{data}">'
                f"<figcaption><b>{html.escape(f.title)}</b>. {html.escape(f.caption)}</figcaption></figure>"
            )
        else:
            out.append(f'<p class="note"><b>{html.escape(f.title)}</b>: {html.escape(f.note)}</p>')
    out += ["</section></body></html>", ""]
    return "\n".join(out)
