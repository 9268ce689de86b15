"""Build time (part of hooks/notes_site.py): mkdocs-jupyter and nbconvert do less work per notebook.

mkdocs-jupyter converts every notebook twice: to HTML for the page, and to Markdown only to read its
headings for the TOC, which hooks/site_headings.py rebuilds from the rendered HTML anyway, so the
second conversion is skipped. nbconvert also makes a fresh Jinja environment per notebook and
recompiles the same templates each time; one in-memory bytecode cache is shared by all of them.
Last, nbconvert's ``HTMLExporter`` re-parses each finished page with BeautifulSoup's pure-Python
``html.parser`` only to add three attributes (``tabindex="0"`` on cell inputs and outputs, an
``alt`` on images without one) and serializes the whole tree again: about a third of the build.
:class:`FocusableMarkup` makes the same three edits on the text (tests/site/test_site.py checks that
both give the same document tree).
"""

from __future__ import annotations

import html
import re

import jinja2


class _SharedBytecode(jinja2.BytecodeCache):
    """In-memory Jinja bytecode, shared by every nbconvert exporter of one build."""

    def __init__(self):
        self.store: dict[str, bytes] = {}

    def load_bytecode(self, bucket):
        if bucket.key in self.store:
            bucket.bytecode_from_string(self.store[bucket.key])

    def dump_bytecode(self, bucket):
        self.store[bucket.key] = bucket.bytecode_to_string()


_BYTECODE = _SharedBytecode()


class FocusableMarkup:
    """Stands in for ``BeautifulSoup`` in ``nbconvert.exporters.html`` during a build.

    nbconvert 7's ``HTMLExporter.from_notebook_node`` parses the page, calls ``select`` with three
    selectors, sets one attribute on each element found, and returns ``str(soup)``. This class
    answers those three selectors from the text (opening tags outside ``<script>``, ``<style>`` and
    comments) and inserts the attributes in place; any other selector raises, so an nbconvert that
    asks for more fails the build instead of being half served.
    """

    OPENING = re.compile(
        r"""<(img|div)\b((?:\s+[^\s=/>]+(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s"'=<>`]+))?)*)"""
        r"""\s*/?>""",
        re.I,
    )
    OPAQUE = re.compile(r"<script\b.*?</script\s*>|<style\b.*?</style\s*>|<!--.*?-->", re.S | re.I)
    CLASS = re.compile(r"""\sclass\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.I)
    ALT = re.compile(r"\salt(?:\s*=|\s|$)", re.I)
    SELECTORS = {
        "img:not([alt])": ("img", None),
        ".jp-Notebook div.jp-Cell-inputWrapper": ("div", "jp-Cell-inputWrapper"),
        ".jp-Notebook div.jp-OutputArea-output": ("div", "jp-OutputArea-output"),
    }

    class Element:
        def __init__(self, end: int):
            self.end = end  # where the attributes of this opening tag end
            self.attrs: dict[str, str] = {}

    def __init__(self, markup: str, features: str | None = None):
        self.markup = markup
        self.found: list[FocusableMarkup.Element] = []
        opaque = [m.span() for m in self.OPAQUE.finditer(markup)]
        self.tags = [
            m for m in self.OPENING.finditer(markup) if not any(a <= m.start() < b for a, b in opaque)
        ]

    def select(self, selector: str) -> list[Element]:
        if selector not in self.SELECTORS:
            raise NotImplementedError(
                f"nbconvert asked for {selector!r}: hooks/site_render.py "
                "FocusableMarkup only knows nbconvert 7's three selectors"
            )
        name, cls = self.SELECTORS[selector]
        hits = []
        for m in self.tags:
            if m.group(1).lower() != name:
                continue
            attrs = m.group(2)
            if cls is None:
                if self.ALT.search(attrs):
                    continue
            else:
                c = self.CLASS.search(attrs)
                if not c or cls not in next(g for g in c.groups() if g is not None).split():
                    continue
            hits.append(self.Element(m.start(2) + len(attrs)))
        self.found += hits
        return hits

    def __str__(self) -> str:
        out, at = [], 0
        for element in sorted(self.found, key=lambda e: e.end):
            out.append(self.markup[at : element.end])
            out += [f' {k}="{html.escape(v)}"' for k, v in element.attrs.items()]
            at = element.end
        out.append(self.markup[at:])
        return "".join(out)


def speed_up_notebook_rendering():
    import mkdocs_jupyter.plugin
    import nbconvert.exporters.html
    from nbconvert.exporters.templateexporter import TemplateExporter

    nbconvert.exporters.html.BeautifulSoup = FocusableMarkup

    # the headings come from the rendered page (on_page_content), not from a Markdown export
    mkdocs_jupyter.plugin._get_nb_toc_tokens = lambda fpath, toc_depth: ([], None)
    create = TemplateExporter._create_environment
    if getattr(create, "_shared_bytecode", False):
        return

    def with_shared_bytecode(self):
        env = create(self)
        env.bytecode_cache = _BYTECODE
        return env

    with_shared_bytecode._shared_bytecode = True
    TemplateExporter._create_environment = with_shared_bytecode
