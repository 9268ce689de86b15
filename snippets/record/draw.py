"""The drawing layer: turn what a run recorded into a small, byte-stable SVG picture.

Every picture on the site is drawn here, from the same rows a note's table prints, so a picture is
never drawn by hand and never goes stale. A :class:`Figure` is a list of primitives (boxes, text,
lines, arrows) placed in pixel coordinates; :meth:`Figure.svg` writes them out.

Why a hand-rolled builder and not matplotlib:

* **Theming.** Colors are *kinds* (``"tp"``, ``"fwd"``, ``"muted"``, ...), written as CSS classes
  whose colors are CSS variables (``--ms-tp``). The site's stylesheet sets those variables for
  material's light and dark schemes; the ``<style>`` inside each SVG gives the same colors as
  fallbacks, so a picture also looks right in JupyterLab.
* **Page weight and diffs.** A picture is a few KB of readable elements, one per line, with
  coordinates rounded to 0.1 px: nbval compares the stored bytes, and a reviewer can read a diff.
* **Determinism.** No ids, dates or float noise: two renders of the same data are the same bytes.

Legibility rules the builders follow (and :meth:`Figure.check` enforces): no text under
``MIN_FONT`` px, and no two text labels overlap (label boxes are estimated from the character
count; CJK characters count as one em, others as ~0.6 em). A picture has a ``<title>`` and a
``<desc>`` for screen readers. On a narrow screen the site lets a wide picture scroll inside its
output box instead of shrinking its text.
"""

from __future__ import annotations

import hashlib
import html
import re
from contextlib import contextmanager
from dataclasses import dataclass

MIN_FONT = 11
"""Smallest font size (px) a picture may use: readable at desktop width without zooming."""

# kind -> (light, dark). The site stylesheet defines --ms-<kind> from the same table
# (docs/stylesheets/extra.css, checked by a test); these are the in-SVG fallbacks.
PALETTE: dict[str, tuple[str, str]] = {
    "ink": ("#1f2328", "#e6edf3"),  # text
    "muted": ("#8c959f", "#6e7681"),  # secondary text, neutral boxes
    "grid": ("#d0d7de", "#30363d"),  # axes, grid lines, outlines
    "paper": ("#ffffff", "#0d1117"),  # background
    "tp": ("#4c78a8", "#6b9bd1"),  # tensor parallel
    "pp": ("#f58518", "#f5a04d"),  # pipeline parallel
    "dp": ("#54a24b", "#72c066"),  # data parallel
    "cp": ("#b279a2", "#c996bb"),  # context parallel
    "ep": ("#e45756", "#f07b7a"),  # expert parallel
    "edp": ("#72b7b2", "#8fd0cb"),  # expert data parallel
    "emb": ("#9d755d", "#bb937b"),  # embedding groups
    "fwd": ("#4c78a8", "#6b9bd1"),  # forward compute
    "fwd2": ("#9ecae9", "#a9d1ee"),  # forward, second model chunk
    "bwd": ("#e45756", "#f07b7a"),  # backward compute
    "bwd2": ("#ff9d98", "#ffb3ae"),  # backward, second model chunk
    "comm": ("#eeca3b", "#e3c14a"),  # a collective or p2p
    "mem": ("#bab0ac", "#8d8580"),  # stored bytes
    "accent": ("#d62728", "#ff6b6b"),  # the thing to look at
    "light": ("#eef2f6", "#1c2330"),  # faint fill behind groups
}

# Text on a filled box: dark ink on the light kinds, white on the others.
_LIGHT_FILLS = {"fwd2", "bwd2", "comm", "mem", "light", "paper", "edp", "grid"}


def _n(v: float) -> str:
    """A coordinate as short, stable text: rounded to 0.1 px, no trailing ``.0``."""
    r = round(float(v) + 0.0, 1)
    if r == int(r):
        return str(int(r))
    return f"{r:.1f}"


def text_width(s: str, size: float) -> float:
    """Estimated rendered width of ``s`` in px at font ``size`` (sans-serif)."""
    wide = sum(1 for ch in s if ord(ch) > 0x2E80)
    return (wide * 1.0 + (len(s) - wide) * 0.6) * size


@dataclass(frozen=True)
class Label:
    """Where a text label sits (its estimated box), for the overlap check."""

    x: float
    y: float
    w: float
    h: float
    text: str

    def overlaps(self, other: "Label") -> bool:
        return (
            self.x < other.x + other.w
            and other.x < self.x + self.w
            and self.y < other.y + other.h
            and other.y < self.y + self.h
        )


class Figure:
    """One SVG picture, built primitive by primitive.

    ``title`` becomes the SVG's ``<title>`` (and accessible name), ``desc`` its ``<desc>``: say in
    one or two sentences what the picture shows, so a screen reader gets the same fact.
    """

    def __init__(self, width: float, height: float, *, title: str, desc: str = ""):
        self.width, self.height = width, height
        self.title, self.desc = title, desc
        self._body: list[str] = []
        self._labels: list[Label] = []
        self._depth = 0
        self._arrows: set[str] = set()

    # ------------------------------------------------------------------ primitives

    def _marker_id(self, kind: str) -> str:
        # One page shows many pictures: ids are unique per picture, and stable (from its title).
        return f"ms-arrow-{kind}-{hashlib.sha1(self.title.encode()).hexdigest()[:8]}"

    def _add(self, element: str) -> None:
        self._body.append("  " * (self._depth + 1) + element)

    def rect(
        self,
        x,
        y,
        w,
        h,
        kind: str = "muted",
        *,
        rx: float = 3,
        outline: str | None = None,
        faint: bool = False,
        dashed: bool = False,
        tip: str | None = None,
    ) -> None:
        """A box filled with ``kind``'s color; ``outline`` draws its border in another kind,
        ``faint`` fills it at low opacity (a background band), ``tip`` is a hover title."""
        cls = [f"f-{kind}"] + ([f"s-{outline}"] if outline else [])
        if faint:
            cls.append("faint")
        if dashed:
            cls.append("dashed")
        attrs = (
            f'x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}"'
            + (f' rx="{_n(rx)}"' if rx else "")
            + f' class="{" ".join(cls)}"'
        )
        if tip:
            self._add(f"<rect {attrs}><title>{html.escape(tip)}</title></rect>")
        else:
            self._add(f"<rect {attrs}/>")

    def text(
        self,
        x,
        y,
        s,
        *,
        size: float = 12,
        anchor: str = "start",
        kind: str = "ink",
        bold: bool = False,
        mono: bool = False,
    ) -> Label:
        """Text whose vertical middle is at ``y`` (``anchor``: start / middle / end at ``x``)."""
        if size < MIN_FONT:
            raise ValueError(f"font size {size} px is under the site's minimum {MIN_FONT} px: {s!r}")
        s = str(s)
        w = text_width(s, size)
        left = x - (w / 2 if anchor == "middle" else w if anchor == "end" else 0)
        label = Label(left, y - size * 0.6, w, size * 1.2, s)
        self._labels.append(label)
        cls = [f"t-{kind}"] + (["b"] if bold else []) + (["mono"] if mono else [])
        anchor_attr = "" if anchor == "start" else f' text-anchor="{anchor}"'
        size_attr = "" if size == 12 else f' font-size="{_n(size)}"'
        self._add(
            f'<text x="{_n(x)}" y="{_n(y)}" dy="0.35em"{anchor_attr}{size_attr} '
            f'class="{" ".join(cls)}">{html.escape(s)}</text>'
        )
        return label

    def boxed(
        self,
        x,
        y,
        w,
        h,
        s,
        kind: str = "muted",
        *,
        size: float = 12,
        bold: bool = False,
        tip: str | None = None,
        faint: bool = False,
    ) -> None:
        """A box with its label centered inside it, in ink that reads on that fill."""
        self.rect(x, y, w, h, kind, tip=tip, faint=faint)
        ink = "ink" if (kind in _LIGHT_FILLS or faint) else "on"
        self.text(x + w / 2, y + h / 2, s, size=size, anchor="middle", kind=ink, bold=bold)

    def line(
        self,
        x1,
        y1,
        x2,
        y2,
        kind: str = "grid",
        *,
        width: float = 1,
        arrow: bool = False,
        dashed: bool = False,
    ) -> None:
        """A straight line; ``arrow`` puts an arrowhead at (x2, y2)."""
        cls = [f"s-{kind}"] + (["dashed"] if dashed else []) + ([f"a-{kind}"] if arrow else [])
        w = "" if width == 1 else f' stroke-width="{_n(width)}"'
        marker = f' marker-end="url(#{self._marker_id(kind)})"' if arrow else ""
        if arrow:
            self._arrows.add(kind)
        self._add(
            f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}"{w}{marker} '
            f'class="{" ".join(cls)}"/>'
        )

    def path(
        self,
        d: str,
        kind: str = "grid",
        *,
        fill: bool = False,
        width: float = 1,
        arrow: bool = False,
        dashed: bool = False,
    ) -> None:
        """A path from SVG path data (use :func:`_n` for its numbers); stroked unless ``fill``."""
        cls = [f"f-{kind}"] if fill else [f"s-{kind}", "nofill"]
        if dashed:
            cls.append("dashed")
        w = "" if width == 1 else f' stroke-width="{_n(width)}"'
        marker = f' marker-end="url(#{self._marker_id(kind)})"' if arrow else ""
        if arrow:
            self._arrows.add(kind)
        self._add(f'<path d="{d}"{w}{marker} class="{" ".join(cls)}"/>')

    @contextmanager
    def group(self, name: str | None = None, *, tip: str | None = None):
        """Group the elements drawn inside the block; ``name`` becomes ``data-name`` (for tests
        and the site's hover), ``tip`` a hover title."""
        attrs = f' data-name="{html.escape(name)}"' if name else ""
        self._add(f"<g{attrs}>")
        if tip:
            self._add(f"  <title>{html.escape(tip)}</title>")
        self._depth += 1
        try:
            yield self
        finally:
            self._depth -= 1
            self._add("</g>")

    def legend(self, x, y, items: list[tuple[str, str]], *, size: float = 12, gap: float = 16) -> float:
        """A row of color swatches with names, starting at (x, y); returns the x it ended at."""
        for kind, name in items:
            self.rect(x, y - size / 2, size, size, kind, rx=2)
            self.text(x + size + 5, y, name, size=size)
            x += size + 5 + text_width(name, size) + gap
        return x

    # ------------------------------------------------------------------ output

    def labels(self) -> list[Label]:
        """Every text label's estimated box, in drawing order."""
        return list(self._labels)

    def check(self) -> None:
        """Raise if two labels overlap or a label leaves the picture (the builders call it)."""
        labels = self._labels
        for i, a in enumerate(labels):
            if a.x < -0.5 or a.y < -0.5 or a.x + a.w > self.width + 0.5 or a.y + a.h > self.height + 0.5:
                raise ValueError(f"label {a.text!r} leaves the {self.width}x{self.height} picture")
            for b in labels[i + 1 :]:
                if a.overlaps(b):
                    raise ValueError(f"labels {a.text!r} and {b.text!r} overlap")

    def svg(self) -> str:
        """The picture as SVG text: the same bytes for the same drawing."""
        used = set(re.findall(r"\b[fst]-([a-z0-9]+)\b", "\n".join(self._body))) | self._arrows
        kinds = sorted(k for k in PALETTE if k in used)
        # Inline SVG styles are global in an HTML page: every selector is scoped to .ms-figure.
        css = [
            ".ms-figure text{font-family:system-ui,-apple-system,'Segoe UI','Noto Sans CJK SC',"
            "sans-serif;font-size:12px}",
            ".ms-figure .b{font-weight:600}",
            ".ms-figure .mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace}",
            ".ms-figure .nofill{fill:none}",
            ".ms-figure .faint{fill-opacity:.18}",
            ".ms-figure .dashed{stroke-dasharray:4 3}",
            ".ms-figure .t-on{fill:var(--ms-on,#ffffff)}",
        ]
        for k in kinds:
            light = PALETTE[k][0]
            css.append(
                f".ms-figure .f-{k}{{fill:var(--ms-{k},{light})}}"
                f".ms-figure .s-{k}{{stroke:var(--ms-{k},{light})}}"
                f".ms-figure .t-{k}{{fill:var(--ms-{k},{light})}}"
            )
        arrows = sorted(self._arrows)
        defs = "".join(
            f'<marker id="{self._marker_id(k)}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" '
            f'class="f-{k}"/></marker>'
            for k in arrows
        )
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" class="ms-figure" width="{_n(self.width)}" '
            f'height="{_n(self.height)}" viewBox="0 0 {_n(self.width)} {_n(self.height)}" '
            f'role="img" aria-label="{html.escape(self.title)}">'
        )
        out = [head, f"  <title>{html.escape(self.title)}</title>"]
        if self.desc:
            out.append(f"  <desc>{html.escape(self.desc)}</desc>")
        out.append(f"  <style>{''.join(css)}</style>")
        if defs:
            out.append(f"  <defs>{defs}</defs>")
        out.extend(self._body)
        out.append("</svg>")
        return "\n".join(out) + "\n"

    def __repr__(self) -> str:  # the text/plain twin Jupyter stores: no address, so nbval can compare it
        return f"<Figure {self.title!r} {_n(self.width)}x{_n(self.height)}>"

    def _repr_svg_(self) -> str:  # Jupyter stores this as the cell's image/svg+xml output
        return self.svg()
