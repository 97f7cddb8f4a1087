"""A self-contained HTML report: figures embedded as base64, numbers in tables."""

from __future__ import annotations

import base64
import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Section:
    title: str
    text: str = ""
    tables: list[tuple[str, list[dict]]] = field(default_factory=list)  # (caption, rows)
    figures: list[Path] = field(default_factory=list)
    config: dict | None = None


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if v is None:
        return "—"
    return html.escape(str(v))


def _table(caption: str, rows: list[dict]) -> str:
    if not rows:
        return f"<p><em>{html.escape(caption)}: no rows</em></p>"
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><caption>{html.escape(caption)}</caption><tr>{head}</tr>{body}</table>"


def _img(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(Path(path).name)}"><figcaption>{html.escape(Path(path).name)}</figcaption></figure>'


CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
caption{font-weight:600;text-align:left;padding:4px 0}img{max-width:100%;border:1px solid #eee}
figure{display:inline-block;margin:0.5em;max-width:48%}pre{background:#f6f6f6;padding:0.6em;font-size:0.8em;overflow:auto}
section{border-top:2px solid #ddd;margin-top:2em}"""


def render(title: str, sections: list[Section], meta: dict, path: str | os.PathLike) -> Path:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>"]
    for s in sections:
        parts.append(f"<section><h2>{html.escape(s.title)}</h2><p>{html.escape(s.text)}</p>")
        parts.extend(_table(c, r) for c, r in s.tables)
        parts.extend(_img(f) for f in s.figures if Path(f).exists())
        if s.config is not None:
            parts.append(f"<details><summary>config</summary><pre>{html.escape(json.dumps(s.config, indent=2))}</pre></details>")
        parts.append("</section>")
    parts.append(f"<section><h2>Environment</h2><pre>{html.escape(json.dumps(meta, indent=2))}</pre></section></body></html>")
    from .runs import atomic_path

    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(parts))
    return path
