/* 并行布局浏览器: looks up the groups initialize_model_parallel built for the chosen sizes and order
   (data/layouts-W.js, from snippets/site/layout_data.py) and draws the rank grid with MsFigure.
   It computes no group: a rank's groups are the recorded lists that contain it. */
(function () {
  "use strict";
  const { MsFigure, esc, load, readHash, writeHash, select } = window.MsDraw;
  const root = document.getElementById("ms-layout");
  const WORLDS = JSON.parse(root.dataset.worlds);
  const KIND_COLOR = { tp: "tp", cp: "cp", dp: "dp", "dp-cp": "dp", pp: "pp", ep: "ep", etp: "tp", edp: "edp", emb: "emb", "pos-emb": "emb" };
  const KIND_NAME = {
    tp: "TP", cp: "CP", dp: "DP", "dp-cp": "DP×CP", pp: "PP", ep: "EP", etp: "expert-TP",
    edp: "expert-DP", emb: "embedding", "pos-emb": "position-embedding",
  };
  const DEFAULT = { w: "16", tp: "2", pp: "2", cp: "1", ep: "1", etp: "tp", order: "tp-cp-ep-dp-pp", rank: "5", kind: "tp" };
  const $ = sel => root.querySelector(sel);
  let hovered = null, current = null;

  function state() {
    const s = Object.assign({}, DEFAULT, readHash());
    if (!WORLDS.includes(Number(s.w))) s.w = DEFAULT.w;
    return s;
  }

  const B64 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_";
  const number = digits => [...digits].reduce((acc, ch) => acc * 64 + B64.indexOf(ch), 0);

  function lookup(data, s) {
    const etp = s.etp === "1" ? 1 : Number(s.tp);
    const code = data.layouts[`${s.tp}.${s.pp}.${s.cp}.${s.ep}.${etp}`];
    if (code === undefined) return { error: "这组大小不在浏览器的数据里（每个大小 1–8，且整除 world size）。" };
    if (code[0] === "!") return { error: data.messages[Number(code.slice(1))], megatron: true };
    const i = data.orders.indexOf(s.order);
    if (i < 0) return { error: `未知的 order：${s.order}` };
    const result = data.results[number(code.substr(data.width * i, data.width))];
    if (result[0] === "!") return { error: data.messages[Number(result.slice(1))], megatron: true };
    const groups = {}, gw = data.group_width;
    data.kinds.forEach((kind, k) => {
      groups[kind] = data.groups[number(result.substr(gw * k, gw))].split(";").map(g => g.split(",").map(Number));
    });
    return { groups };
  }

  function controls(data, s) {
    const sizes = data.sizes.map(v => [v, String(v)]);
    select($("[name=w]"), WORLDS.map(v => [v, String(v)]), s.w);
    for (const k of ["tp", "pp", "cp", "ep"]) select($(`[name=${k}]`), sizes, s[k]);
    select($("[name=etp]"), [["tp", "= TP（缺省）"], ["1", "1"]], s.etp);
    select($("[name=order]"), data.orders.map(o => [o, o]), s.order);
  }

  function drawGrid(world, groups, s, rank) {
    const big = root.clientWidth >= 560;  // desktop: roomier boxes; a phone: 8 boxes still fit in 390 px
    const perRow = 8, BW = big ? 58 : 38, BH = big ? 40 : 34, GAP = big ? 8 : 6, PAD = 6;
    const rows = Math.ceil(world / perRow);
    const kind = s.kind, color = KIND_COLOR[kind];
    const mine = groups[kind].find(g => g.includes(rank)) || [];
    const index = {};
    groups[kind].forEach((g, i) => g.forEach(r => { index[r] = i; }));
    const fig = new MsFigure(PAD * 2 + perRow * (BW + GAP) - GAP, PAD * 2 + rows * (BH + GAP) - GAP,
      `world ${world} 的 rank 网格：${KIND_NAME[kind]} 群`,
      `每行 8 个 rank（一台 8 卡机器）；实心的是 rank ${rank} 所在的 ${KIND_NAME[kind]} 群，浅色的 rank 属于其他 ${KIND_NAME[kind]} 群，框里 # 后是群在 Megatron 列表里的序号。`);
    for (let r = 0; r < world; r++) {
      const x = PAD + (r % perRow) * (BW + GAP), y = PAD + Math.floor(r / perRow) * (BH + GAP);
      const inGroup = r in index, solid = mine.includes(r);
      fig.group(`rank ${r}`, f => {
        f.rect(x, y, BW, BH, inGroup ? color : "light", {
          faint: inGroup && !solid, outline: r === rank ? "accent" : null, strokeWidth: r === rank ? 2.5 : null,
          data: { rank: r }, tip: `rank ${r}` + (inGroup ? `：${KIND_NAME[kind]} 群 #${index[r]}` : `：不在任何 ${KIND_NAME[kind]} 群`),
        });
        const ink = solid ? "on" : "ink";
        f.text(x + BW / 2, y + BH / 2 - 7, String(r), { anchor: "middle", kind: ink, bold: r === rank });
        f.text(x + BW / 2, y + BH / 2 + 8, inGroup ? `#${index[r]}` : "–", { size: 11, anchor: "middle", kind: solid ? "on" : "muted" });
      });
    }
    fig.check();
    return fig.svg();
  }

  function render() {
    const s = state(), hash = location.hash;
    load("layouts", Number(s.w), `layouts-${s.w}.js`).then(data => {
      if (location.hash !== hash) return; // a later selection is on its way
      controls(data, s);
      const shown = lookup(data, s);
      const world = data.world;
      let rank = Math.min(Number(hovered !== null ? hovered : s.rank) || 0, world - 1);
      current = { s, shown };
      $(".ms-error").hidden = !shown.error;
      $(".ms-result").hidden = !!shown.error;
      if (shown.error) {
        $(".ms-error").innerHTML = (shown.megatron ? "<p><strong>Megatron 拒绝了这组设置</strong>（<code>initialize_model_parallel</code> 的原话）：</p>" : "")
          + `<pre><code>${esc(shown.error)}</code></pre>`;
        root.dataset.state = "error";
        root.dataset.shown = hash;
        return;
      }
      const g = shown.groups;
      $(".ms-dp").textContent = `DP = ${g.dp[0].length}，expert-DP = ${g.edp[0].length}`;
      $(".ms-kinds").innerHTML = data.kinds.map(k =>
        `<button type="button" data-kind="${k}" class="ms-chip ms-chip-${KIND_COLOR[k]}" aria-pressed="${k === s.kind}">${KIND_NAME[k]}</button>`).join("");
      $(".ms-grid").innerHTML = drawGrid(world, g, s, rank);
      $(".ms-rank-title").textContent = `rank ${rank} 所在的群`;
      $(".ms-mine tbody").innerHTML = data.kinds.map(k => {
        const mine = g[k].find(x => x.includes(rank));
        return `<tr data-kind="${k}"><td>${KIND_NAME[k]}</td><td class="ms-members">${mine ? "[" + mine.join(", ") + "]" : "—"}</td><td>${mine ? mine.indexOf(rank) : "—"}</td></tr>`;
      }).join("");
      $(".ms-all tbody").innerHTML = data.kinds.map(k =>
        `<tr data-kind="${k}"><td>${KIND_NAME[k]}</td><td>${g[k].length} × ${g[k][0].length}</td><td class="ms-members">${g[k].map(x => "[" + x.join(", ") + "]").join(" ")}</td></tr>`).join("");
      root.dataset.state = "ok";
      root.dataset.shown = hash;
    }, error => {
      $(".ms-error").hidden = false;
      $(".ms-error").textContent = String(error);
    });
  }

  root.addEventListener("change", e => {
    const s = state();
    s[e.target.name] = e.target.value;
    if (e.target.name === "w") { // keep sizes that still divide the new world size
      const w = Number(s.w);
      for (const k of ["tp", "pp", "cp", "ep"]) if (w % Number(s[k]) || Number(s[k]) > 8) s[k] = "1";
      if (Number(s.rank) >= w) s.rank = "0";
    }
    writeHash(s);
  });
  root.addEventListener("click", e => {  // a kind button, or a row of the tables: color that kind
    const chip = e.target.closest("[data-kind]");
    if (chip) { const s = state(); s.kind = chip.dataset.kind; writeHash(s); }
  });
  // a rank is chosen on pointerdown: hovering re-draws the grid, so a click's target may be gone by mouseup
  root.addEventListener("pointerdown", e => {
    const box = e.target.closest("[data-name^='rank ']");
    if (box) { const s = state(); hovered = null; s.rank = box.dataset.name.slice(5); writeHash(s); }
  });
  root.addEventListener("mouseover", e => {
    const box = e.target.closest("[data-name^='rank ']");
    const r = box ? box.dataset.name.slice(5) : null;
    if (r !== hovered && (r !== null || hovered !== null)) { hovered = r; if (r !== null) render(); }
  });
  root.addEventListener("mouseleave", () => { if (hovered !== null) { hovered = null; render(); } });
  window.addEventListener("hashchange", () => { hovered = null; render(); });
  window.msLayoutExplorer = { current: () => current };
  render();
})();
