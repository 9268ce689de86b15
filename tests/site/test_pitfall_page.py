"""The built pitfall page: one row per pitfall record, each linking a cell that exists, both status
columns filled, the main commit named; and no note page carries a generated appendix."""

from __future__ import annotations

import re
from urllib.parse import unquote

from snippets.site import pitfalls, sources


def test_the_pitfall_page_lists_every_record_and_links_its_cells(site):
    html = (site.dir / "pitfalls" / "index.html").read_text(encoding="utf-8")
    table = html[html.find("<table") : html.find("</table>")]
    data = pitfalls.load()
    records = pitfalls.records(site.notes_dir, data)
    assert table.count("<tr>") == len(records) + 1  # the header row
    for href in re.findall(r'href="(\.\./notes/[^"#]+/)#(cell-id=[^"]+)"', table):
        page = site.dir / unquote(href[0]).removeprefix("../") / "index.html"
        assert f'id="{unquote(href[1])}"' in page.read_text(encoding="utf-8"), href
    commit = data["main"]["commit"]
    assert sources.TAG in table and commit[:10] in table and data["main"]["date"] in html
    assert table.count(f"/blob/{sources.TAG}/") == len(records)  # one pinned anchor per row
    assert table.count(f"/blob/{commit}/") == len(records)  # and one at main
    assert not re.search(r"<!-- pitfall-[a-z-]+ -->", html)  # every marker was replaced
    assert "答案" in html and pitfalls.KIND["still"] in html and pitfalls.KIND["fixed"] in html


def test_no_note_page_has_a_generated_appendix(site, note_names):
    for name in note_names:
        html = site.note_page(name).read_text(encoding="utf-8")
        assert "到 core_v0.19.0 变了什么" not in html and "ms-changes" not in html, name
