"""Show the source of the experiment a cell just ran, folded, straight from the module.

A note used to paste an experiment's functions into its markdown and a test kept the copy equal
to the module. Now the cell asks for the source itself, so the page can never show other code than
what ran: ``listing(pipeline_run)`` renders a closed ``<details>`` block ("源码") whose summary
names the file, the functions and their length, and whose body is the highlighted source. A reader
opens it when they want the machinery; the Megatron call the note is about stays in the cell above.
"""

from __future__ import annotations

import html
import inspect

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer


def _where(obj) -> str:
    module = inspect.getmodule(obj)
    path = module.__name__.replace(".", "/") + ".py"
    return path


class Listing:
    """The source of one or more functions / classes of one module, folded (Jupyter shows the
    ``text/html`` form; its ``text/plain`` form is a one-line summary)."""

    def __init__(self, *objs, note: str = ""):
        if not objs:
            raise ValueError("listing() needs at least one function or class")
        paths = {_where(o) for o in objs}
        if len(paths) != 1:
            raise ValueError(f"listing() takes objects of one module, got {sorted(paths)}")
        self.path = paths.pop()
        self.names = [o.__name__ for o in objs]
        self.source = "\n\n\n".join(inspect.getsource(o).rstrip("\n") for o in objs) + "\n"
        self.lines = self.source.count("\n")
        self.note = note

    def summary(self) -> str:
        names = "、".join(f"{n}" for n in self.names)
        extra = f"：{self.note}" if self.note else ""
        return f"源码 · {self.path} · {names}（{self.lines} 行）{extra}"

    def __repr__(self) -> str:
        return f"<listing {self.path}: {', '.join(self.names)} ({self.lines} lines)>"

    def _repr_html_(self) -> str:
        code = highlight(self.source, PythonLexer(), HtmlFormatter(nowrap=True))
        return (
            f'<details class="ms-listing"><summary>{html.escape(self.summary())}</summary>'
            f'<div class="highlight"><pre><code>{code}</code></pre></div></details>'
        )


def listing(*objs, note: str = "") -> Listing:
    """Fold the source of ``objs`` (functions or classes of one module) into the page."""
    return Listing(*objs, note=note)
