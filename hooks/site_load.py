"""Load time (part of hooks/notes_site.py): material's script runs just after a note page's load event.

Measured on a note page in headless Chromium (a trace of the renderer's main thread, CPU time up to
``loadEventStart``; note 22, the largest): of ~290 ms, ~150 ms is material's bundle -- evaluating
it at the end of <body> (~100 ms, with four forced style recalculations of the whole page) and its
``DOMContentLoaded`` handler mounting the header, palette, TOC tracking, table wrappers and search
(~110 ms, with more forced style and layout passes); the rest is parsing, styling and laying out the
notebook itself. None of the bundle's work is content: the page is drawn without it (first paint
came before it ran). So on note pages the bundle's ``<script>`` is kept inert (an unknown ``type``:
not fetched, not run, still listed where link checks and the transfer test find it) and a short
loader starts it once the load event has fired.

Material's bundle waits for ``DOMContentLoaded`` before it mounts anything (its ``document$`` is
that event), which has long passed by then; the loader dispatches it again on ``document`` once the
bundle has run. Nothing else on a note page listens for it. When material has mounted,
``window.msMaterialReady`` is true (the browser tests wait for it).
"""

from __future__ import annotations

import re

INERT_TYPE = "text/x-ms-after-load"
BUNDLE = re.compile(r'<script src="([^"]*assets/javascripts/bundle\.[0-9a-f]+\.min\.js)"></script>')
LOADER = (
    "<script>addEventListener('load',function(){"
    "var t=document.querySelector('script[type=\"" + INERT_TYPE + "\"]'),s=document.createElement('script');"
    "s.src=t.getAttribute('src');s.onload=function(){"
    "document.dispatchEvent(new Event('DOMContentLoaded'));window.msMaterialReady=true};"
    "t.after(s)})</script>"
)


def run_material_after_load(output: str) -> str:
    """``output`` (a whole note page) with material's bundle started after the load event."""
    found = BUNDLE.search(output)
    if found is None:
        return output
    inert = f'<script type="{INERT_TYPE}" src="{found.group(1)}"></script>'
    return output[: found.start()] + inert + LOADER + output[found.end() :]
