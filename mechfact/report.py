"""A self-contained HTML report: a claims table first, then sections of text, tables and figures.

Figures are embedded as base64 PNGs and shown at their natural size (never
enlarged; shrunk only when wider than the page), so a figure drawn at 110 dpi
reads as drawn. Numbers are rounded to the digits that carry information
(:func:`fmt`). The page has no scripts and no external resources.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOLDS = "holds"
PART = "holds in part"
NOT = "does not hold here"
NOT_FAST = "not measured in --fast"
NOT_RUN = "not run by the quickstart"
UNDECIDED = "undecided at this size"  # consistent here, but what decides the claim (e.g. a law held out) is not
VERDICTS = (HOLDS, PART, NOT, UNDECIDED, NOT_FAST, NOT_RUN)


@dataclass
class Claim:
    """One row of the claims table: a claim of the papers, its number there, the number measured in this run."""

    claim: str  # the claim, in one sentence
    source: str  # where it is stated (paper and claim number, or reference)
    paper: str  # the paper's number (or its qualitative statement when it gives none)
    measured: str  # this run's number(s), formatted from the run's results
    verdict: str  # one of VERDICTS
    section: str | None = None  # anchor of the section holding the evidence
    why: str = ""  # the rule that gave the verdict, or what is missing
    group: str = ""  # heading the row is listed under (the paper)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r}: expected one of {VERDICTS}")


@dataclass
class Figure:
    path: Path
    caption: str = ""


@dataclass
class Section:
    title: str
    text: str = ""  # paragraphs separated by blank lines
    tables: list = field(default_factory=list)  # (caption, rows) or (caption, rows, note)
    figures: list = field(default_factory=list)  # Path or Figure
    config: dict | None = None
    anchor: str | None = None  # id of the section (default: from the title)

    def __post_init__(self) -> None:
        self.anchor = self.anchor or slug(self.title)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "section"


def fmt(v: Any) -> str:
    """A number rounded to meaningful digits: 0.9999999 -> 1.00, 0.0039 -> 0.0039, -0.00018 -> -1.8e-4, 123.456 -> 123."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        if math.isinf(v):
            return "∞" if v > 0 else "-∞"
        a = abs(v)
        if a >= 100:
            s = f"{v:.0f}"
        elif a >= 10:
            s = f"{v:.1f}"
        elif a >= 0.01 or a == 0:
            s = f"{v:.2f}"
        elif a >= 0.001:
            s = f"{v:.2g}"
        else:  # tiny: say so in scientific notation, 2 significant digits
            s = re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{v:.1e}").replace("e+", "e")
        return "0.00" if s in ("-0.00", "-0.0", "-0") else s
    if isinstance(v, (list, tuple)):
        return " / ".join(fmt(x) for x in v)
    return str(v)


def _cell(v: Any) -> str:
    text = html.escape(fmt(v))
    numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
    return f'<td class="num">{text}</td>' if numeric else f"<td>{text}</td>"


def _table(caption: str, rows: list[dict], note: str = "") -> str:
    if not rows:
        return f"<p><em>{html.escape(caption)}: no rows</em></p>"
    cols = list(dict.fromkeys(c for r in rows for c in r))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(_cell(r.get(c)) for c in cols) + "</tr>" for r in rows)
    foot = f'<p class="note">{html.escape(note)}</p>' if note else ""
    return f"<table><caption>{html.escape(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{foot}"


def png_size(path: str | os.PathLike) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's header."""
    head = Path(path).read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG file")
    return struct.unpack(">II", head[16:24])


def _img(fig: Figure) -> str:
    data = base64.b64encode(Path(fig.path).read_bytes()).decode()
    w, h = png_size(fig.path)
    caption = fig.caption or Path(fig.path).name
    half = ' class="half"' if w <= 700 else ""  # two narrow figures share a row on a wide page
    return (f'<figure{half} style="width:{w}px"><img src="data:image/png;base64,{data}" width="{w}" height="{h}" '
            f'alt="{html.escape(caption)}"><figcaption>{html.escape(caption)}</figcaption></figure>')


def _paragraphs(text: str) -> str:
    return "".join(f"<p>{html.escape(p.strip())}</p>" for p in text.split("\n\n") if p.strip())


def _claims(claims: list[Claim], sections: dict[str, str], cited: bool = False) -> str:
    rows, group = [], None
    for c in claims:
        if c.group and c.group != group:
            group = c.group
            rows.append(f'<tr class="group"><th colspan="4">{html.escape(group)}</th></tr>')
        cls = {HOLDS: "holds", PART: "part", NOT: "not"}.get(c.verdict, "none")
        link = (f' <a href="#{html.escape(c.section)}">→ {html.escape(sections[c.section])}</a>'
                if c.section in sections else "")
        why = f'<div class="why">{html.escape(c.why)}</div>' if c.why else ""
        rows.append(f'<tr><td class="claim">{html.escape(c.claim)}<div class="src">{html.escape(c.source)}</div></td>'
                    f"<td>{html.escape(c.paper)}</td><td>{html.escape(c.measured)}</td>"
                    f'<td><span class="verdict v-{cls}">{html.escape(c.verdict)}</span>{why}{link}</td></tr>')
    return ('<table id="claims-table" class="claims"><caption>Did the papers\' claims hold? Paper numbers are '
            f"quoted from the papers{' (references below the table)' if cited else ''}; measured numbers come from "
            "this run's result files.</caption><thead><tr><th>claim</th><th>paper's number</th><th>measured in this run</th>"
            f"<th>verdict</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _references(refs: dict[str, str], note: str = "") -> str:
    """The cited works under the claims table: ``{short name: full reference}``."""
    items = "".join(f"<li><strong>{html.escape(k)}</strong>: {html.escape(v)}</li>" for k, v in refs.items())
    foot = f'<p class="note">{html.escape(note)}</p>' if note else ""
    return f'<div id="references"><h3>References</h3><ul class="refs">{items}</ul>{foot}</div>'


CSS = """body{font-family:system-ui,sans-serif;max-width:1240px;margin:1.5em auto;padding:0 1em;color:#222;line-height:1.4}
h1{margin-bottom:0.2em}h2{margin-top:0.4em}p{max-width:60em}
table{border-collapse:collapse;margin:1em 0;font-size:0.88em;max-width:100%}
td,th{border:1px solid #ccc;padding:3px 7px;vertical-align:top;text-align:left;overflow-wrap:break-word}
tr.group th{background:#e4e9f2;font-size:1.02em}
th{background:#f3f3f3;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
caption{font-weight:600;text-align:left;padding:4px 0}p.note{font-size:0.85em;color:#555;margin-top:-0.6em}
table.claims{font-size:0.9em;width:100%}table.claims td.claim{width:30%}table.claims td{width:22%}
.src,.why{font-size:0.82em;color:#666;margin-top:2px}
.verdict{font-weight:600;padding:1px 6px;border-radius:3px;white-space:nowrap}
.v-holds{background:#d8f0d8;color:#1b5e20}.v-part{background:#fdeccc;color:#7a4a00}
.v-not{background:#f8d7d7;color:#8b1a1a}.v-none{background:#e8e8e8;color:#444}
figure{display:inline-block;margin:0.5em 0.8em 0.8em 0;max-width:100%;vertical-align:top}
@media (min-width:1100px){figure.half{max-width:calc(50% - 0.8em)}}
img{max-width:100%;height:auto;border:1px solid #eee}figcaption{font-size:0.85em;color:#444}
pre{background:#f6f6f6;padding:0.6em;font-size:0.8em;overflow:auto;white-space:pre-wrap;overflow-wrap:anywhere}
section{border-top:2px solid #ddd;margin-top:2em}nav ol{columns:2;font-size:0.9em}
ul.refs{font-size:0.88em;max-width:60em;padding-left:1.2em}ul.refs li{margin:0.2em 0}"""


def render(title: str, sections: list[Section], meta: dict, path: str | os.PathLike, *,
           claims: list[Claim] | None = None, intro: str = "", references: dict[str, str] | None = None,
           references_note: str = "") -> Path:
    """Write the report: title, intro, the claims table (each row linking to its section) and the works it cites
    (``references``: ``{short name: full reference}``), contents, sections."""
    names = {s.anchor: s.title for s in sections}
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
             f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
             f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>", _paragraphs(intro)]
    if claims:
        refs = _references(references, references_note) if references else ""
        parts.append(f'<section id="claims"><h2>Claims and verdicts</h2>{_claims(claims, names, bool(refs))}{refs}</section>')
    parts.append("<nav><ol>" + "".join(f'<li><a href="#{html.escape(s.anchor)}">{html.escape(s.title)}</a></li>'
                                       for s in sections) + '<li><a href="#environment">Environment</a></li></ol></nav>')
    for s in sections:
        parts.append(f'<section id="{html.escape(s.anchor)}"><h2>{html.escape(s.title)}</h2>{_paragraphs(s.text)}')
        for t in s.tables:
            parts.append(_table(*t))
        figs = [f if isinstance(f, Figure) else Figure(Path(f)) for f in s.figures]
        parts.extend(_img(f) for f in figs if Path(f.path).exists())
        if s.config is not None:
            parts.append(f"<details><summary>config</summary><pre>{html.escape(json.dumps(s.config, indent=2))}</pre></details>")
        parts.append("</section>")
    parts.append(f'<section id="environment"><h2>Environment</h2><pre>{html.escape(json.dumps(meta, indent=2))}</pre>'
                 "</section></body></html>")
    from .runs import atomic_path

    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(parts))
    return path
