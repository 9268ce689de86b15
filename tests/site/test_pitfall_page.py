"""The built pages: every note has "到 core_v0.19.0 变了什么" before 自测 (in the page and its TOC),
and the pitfall page has one row per pitfall record, each linking a cell that exists."""

from __future__ import annotations

import re
from urllib.parse import unquote

from snippets.site import changes, changes_page, pitfalls

SECTION_ID = "到-core_v0190-变了什么"


def test_every_note_page_has_the_section_before_its_self_test(site, note_names):
    for name in note_names:
        html = site.note_page(name).read_text(encoding="utf-8")
        section = html.find(f'<h2 id="{SECTION_ID}"')
        self_test = html.find('<h2 id="自测"')
        assert 0 <= section < self_test, f"{name}: section missing or not before 自测"
        assert html.count(f'id="{SECTION_ID}"') == 1, name
        toc = html[: html.find('<div class="md-content"')]
        assert f'href="#{SECTION_ID}"' in toc, f"{name}: no TOC entry"
        assert toc.find(f'href="#{SECTION_ID}"') < toc.find('href="#自测"'), f"{name}: TOC order"


def test_the_pitfall_page_lists_every_record_and_links_its_cells(site):
    html = (site.dir / "pitfalls" / "index.html").read_text(encoding="utf-8")
    table = html[html.find("<table") : html.find("</table>")]
    records = pitfalls.records(site.notes_dir, changes.load_facts())
    assert table.count("<tr>") == len(records) + 1  # the header row
    for href in re.findall(r'href="(\.\./notes/[^"#]+/)#(cell-id=[^"]+)"', table):
        page = site.dir / unquote(href[0]).removeprefix("../") / "index.html"
        assert f'id="{unquote(href[1])}"' in page.read_text(encoding="utf-8"), href
    assert "答案" in html and changes_page.KIND["still"] in html
