"""Writes the notebooks from their pages: examples/api_walkthrough.ipynb from docs/api.md and docs/tutorial.ipynb
from docs/tutorial.md. Each prose paragraph a markdown cell, each Python block a code cell, in the page's order
(the test suite runs the pages' blocks in order, and the tutorial notebook's cells themselves). Rerun after
editing a page:

    python examples/api_notebook.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "api.md"
NOTEBOOK = ROOT / "examples" / "api_walkthrough.ipynb"
PAGES = {DOC: NOTEBOOK, ROOT / "docs" / "tutorial.md": ROOT / "docs" / "tutorial.ipynb"}  # page -> its notebook


def cells(text: str) -> list[dict]:
    """Markdown cells for the prose between Python blocks (other fenced blocks stay in the prose), code cells for
    the ```python blocks."""
    out = []
    for k, part in enumerate(re.split(r"```python\n(.*?)```\n?", text, flags=re.S)):
        body = part.strip("\n")
        if not body:
            continue
        kind = "code" if k % 2 else "markdown"
        lines = body.splitlines(keepends=True)
        cell = {"cell_type": kind, "metadata": {}, "source": lines}
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        out.append(cell)
    return out


def notebook(text: str) -> dict:
    return {"cells": cells(text), "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                                               "name": "python3"},
                                               "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def render(text: str) -> str:
    return json.dumps(notebook(text), indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    for doc, nb in PAGES.items():
        nb.write_text(render(doc.read_text()))
        print(f"{nb.relative_to(ROOT)} written from {doc.relative_to(ROOT)}")
