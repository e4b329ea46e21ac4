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


def markdown(title: str, intro: str, views: list[View], figures: list[Figure], base: Path) -> str:
    """The whole report as GitHub-flavoured Markdown (figures linked relative to ``base``)."""
    out = [f"# {title}", "", intro, ""]
    for v in views:
        out += [f"## {v.title}", "", v.caption, ""]
        if not v.present:
            out += [f"*{v.note}*", ""]
            continue
        cols = [str(c) for c in v.frame.columns]
        out.append("| " + " | ".join(_md_escape(c) for c in cols) + " |")
        out.append("|" + "|".join("---" for _ in cols) + "|")
        for row in _cells(v.frame):
            out.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
        out.append("")
    out += ["## Figures", ""]
    for f in figures:
        out += [f"### {f.title}", "", f.caption, ""]
        if f.path:
            rel = Path(f.path).relative_to(base)
            vector = [f"[{s.upper()}]({rel.with_suffix('.' + s).as_posix()})" for s in ("pdf", "svg") if Path(f.path).with_suffix("." + s).is_file()]
            out += [f"![{f.title}]({rel.as_posix()})", ""] + ([f"Vector: {', '.join(vector)}", ""] if vector else [])
        else:
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


def latex(title: str, intro: str, views: list[View], figures: list[Figure], base: Path) -> str:
    """A standalone LaTeX document (booktabs tables, figures by relative path, as PDF where written)."""
    out = [
        r"\documentclass{article}",
        r"\usepackage[margin=1.5cm,landscape]{geometry}",
        r"\usepackage{booktabs,graphicx,xcolor,longtable}",
        r"\begin{document}",
        rf"\section*{{{_tex(title)}}}",
        _tex(intro),
        "",
    ]
    for v in views:
        if not v.present:
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
        else:
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
td.muted{color:#999} td.text{text-align:left} .note{color:#777;font-style:italic} .caption{max-width:1000px;color:#444}
figure{margin:1em 0 2em} figure img{max-width:100%;border:1px solid #eee}
nav a{margin-right:1em}
"""


_NUMERIC = re.compile(r"^[-+–]?[\d.]")


def _html_cell(c: Cell) -> str:
    t = html.escape(c.text)
    if c.bold:
        t = f"<b>{t}</b>"
    if c.underline:
        t = f"<u>{t}</u>"
    classes = [name for name, on in (("muted", c.muted), ("text", not _NUMERIC.match(c.text.strip()))) if on]
    return f'<td class="{" ".join(classes)}">{t}</td>' if classes else f"<td>{t}</td>"


def html_page(title: str, intro: str, views: list[View], figures: list[Figure]) -> str:
    """One self-contained HTML page: every figure embedded as a base64 PNG data URI."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(intro)}</p>",
        "<nav>" + "".join(f'<a href="#{v.key}">{html.escape(v.title.split(" — ")[0])}</a>' for v in views) + '<a href="#figures">Figures</a></nav>',
    ]
    for v in views:
        out.append(f'<section id="{v.key}"><h2>{html.escape(v.title)}</h2><p class="caption">{html.escape(v.caption)}</p>')
        if not v.present:
            out.append(f'<p class="note">{html.escape(v.note)}</p></section>')
            continue
        out.append(f'<table data-view="{v.key}"><thead><tr>' + "".join(f"<th>{html.escape(str(c))}</th>" for c in v.frame.columns) + "</tr></thead><tbody>")
        out += ["<tr>" + "".join(_html_cell(c) for c in row) + "</tr>" for row in _cells(v.frame)]
        out.append("</tbody></table></section>")
    out.append('<section id="figures"><h2>Figures</h2>')
    for f in figures:
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
