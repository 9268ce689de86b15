"""Page weight (part of hooks/notes_site.py): one shared, purged copy of nbconvert's stylesheet.

nbconvert inlines ~600 KB of identical JupyterLab CSS into every note page. It is moved into one
shared stylesheet per distinct CSS text (``assets/stylesheets/jupyter-<hash>.css``), linked from the
same place in the page, so the cascade is unchanged and browsers cache it once for all notes; the
rules no built note page can match are dropped from it.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from mkdocs.utils import get_relative_url

STYLE = re.compile(r"<style[^>]*>.*?</style>", re.S | re.I)
CSS_DIR = "assets/stylesheets"
_shared_css: dict[str, str] = {}  # site path -> CSS text, written on_post_build


def share_styles(content: str, page) -> str:
    """Replace the template's inline <style> blocks by a link to one shared, cached file.

    Only the blocks before the notebook body (the template header) move; a <style> inside a
    cell or an output stays where it is.
    """
    body = content.find('<div class="jupyter-wrapper">')
    head = content[:body] if body >= 0 else ""
    blocks = STYLE.findall(head)
    if not blocks:
        return content
    css = "\n".join(re.sub(r"^<style[^>]*>|</style>$", "", b, flags=re.I) for b in blocks)
    digest = hashlib.sha256(css.encode("utf-8")).hexdigest()[:12]
    path = f"{CSS_DIR}/jupyter-{digest}.css"
    _shared_css[path] = css
    link = f'<link rel="stylesheet" href="{get_relative_url(path, page.url)}">'
    first = head.index(blocks[0])
    return content[:first] + link + STYLE.sub("", head[first:]) + content[body:]


# ---------------------------------------------------------------------------- CSS weight
# nbconvert's JupyterLab stylesheet is ~590 KB, most of it for JupyterLab's own UI (toolbars,
# dialogs, file browser, editors). The pages are static: a rule whose every selector names a
# class no built note page uses can never apply, and is dropped from the shared copy.

CSS_CLASS = re.compile(r"\.(-?[_a-zA-Z][\w-]*)")
HTML_CLASS = re.compile(r"""\bclass\s*=\s*(?:"([^"]*)"|'([^']*)')""")


def _css_blocks(css: str):
    """Top-level (prelude, body) pairs of a stylesheet; body without its braces."""
    i, n = 0, len(css)
    while i < n:
        j = css.find("{", i)
        if j < 0:
            return
        prelude, depth, k = css[i:j], 1, j + 1
        while k < n and depth:
            c = css[k]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            elif c in "\"'":
                k = css.find(c, k + 1)  # skip a string (content: "{")
                k = n if k < 0 else k
            k += 1
        yield prelude.strip(), css[j + 1 : k - 1]
        i = k


def purge_css(css: str, used: set[str]) -> str:
    """``css`` without the rules that cannot match a page whose classes are ``used``."""
    out = []
    for prelude, body in _css_blocks(css):
        if prelude.startswith("@media") or prelude.startswith("@supports"):
            inner = purge_css(body, used)
            if inner.strip():
                out.append(f"{prelude}{{{inner}}}")
        elif prelude.startswith("@"):
            out.append(f"{prelude}{{{body}}}")  # @font-face, @keyframes, @page: kept as they are
        elif re.search(r"\([^)]*,", prelude):
            out.append(f"{prelude}{{{body}}}")  # :is(.a, .b) lists: not split, kept
        else:
            # classes under :not() need not be on the page for the rule to match; [attr] values
            # are not class names
            # ... and ".jupyter-wrapper :root" (mkdocs-jupyter's scoping of JupyterLab's :root
            # variables, ~80 KB of icons) can match nothing: :root has no ancestor
            keep = [
                sel
                for sel in prelude.split(",")
                if not re.search(r"\S\s*:root", sel)
                and all(c in used for c in CSS_CLASS.findall(re.sub(r":not\([^)]*\)|\[[^\]]*\]", "", sel)))
            ]
            if keep:
                out.append(f"{','.join(keep)}{{{body}}}")
    # a rule repeated word for word: only its last copy decides anything
    last = {rule: i for i, rule in enumerate(out)}
    return "".join(rule for i, rule in enumerate(out) if last[rule] == i)


# material's page frame around the content (the notebook CSS has a few rules under these)
FRAME_CLASSES = {
    "jupyter-wrapper",
    "md-typeset",
    "md-content",
    "md-content__inner",
    "md-main",
    "md-grid",
    "md-container",
}
_used_classes: set[str] = set()  # every class of every note page's content, filled on_page_content


def note_classes(content: str) -> set[str]:
    return {c for m in HTML_CLASS.finditer(content) for c in (m.group(1) or m.group(2) or "").split()}


def reset() -> None:
    """A new build: forget the stylesheets and classes of the last one (``mkdocs serve``)."""
    _shared_css.clear()
    _used_classes.clear()


def write_shared_css(site_dir: Path) -> None:
    for path, css in _shared_css.items():
        css = purge_css(css, _used_classes | FRAME_CLASSES)
        target = site_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(css, encoding="utf-8")


def note_uses(content: str) -> None:
    """Remember the classes of a note page's finished content: the shared CSS keeps their rules."""
    _used_classes.update(note_classes(content))
