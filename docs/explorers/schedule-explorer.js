/* 流水线调度浏览器: draws a recorded run of Megatron's pipeline schedule (data/schedules.js, from
   snippets/site/schedule_data.py) in note 13's style (snippets/pp/pictures.py draw_timeline), with
   each rank's warm-up / steady / cool-down strip. The op order and the logical clock's start times
   are the recording's; the page only places them. */
(function () {
  "use strict";
  const { MsFigure, textWidth, esc, load, readHash, writeHash, select } = window.MsDraw;
  const root = document.getElementById("ms-schedule");
  const $ = sel => root.querySelector(sel);
  const DEFAULT = { pp: "4", vp: "1", m: "8", g: "" };
  const LEFT = 64, RIGHT = 16, TOP = 40, BOX = 26, STRIP = 14, LANE = BOX + STRIP + 16;
  const PHASES = [["fwd", "warm-up"], ["comm", "steady"], ["bwd", "cool-down"]];
  let current = null;

  function state(data) {
    const s = Object.assign({}, DEFAULT, readHash());
    if (!data.pps.map(String).includes(s.pp)) s.pp = DEFAULT.pp;
    if (!["1", "2"].includes(s.vp)) s.vp = DEFAULT.vp;
    if (!data.microbatches.map(String).includes(s.m)) s.m = DEFAULT.m;
    if (s.vp === "2" && !(Number(s.g) >= 1 && Number(s.g) <= Number(s.m))) s.g = s.pp; // Megatron's default: PP
    if (s.vp === "1") s.g = "";
    return s;
  }

  function parseOps(rank) {
    return rank.ops.split(" ").map((label, i) => {
      const m = /^([FB])(\d+)(?:\.(\d+))?$/.exec(label);
      const kind = m[1], start = rank.start[i];
      return { label, kind, mb: Number(m[2]), chunk: Number(m[3] || 0), start, end: start + (kind === "F" ? 1 : 2) };
    });
  }

  function drawTimeline(entry, pp, v, title) {
    const lanes = entry.ranks.map(parseOps);
    const end = entry.makespan;
    const unit = Math.max(14, Math.min(22, Math.floor(1000 / end)));
    const width = LEFT + end * unit + RIGHT;
    const axisY = TOP + lanes.length * LANE + 4, legendY = axisY + 28;
    const fig = new MsFigure(width, legendY + 66, title,
      `${lanes.length} 个 rank 的时间线（逻辑时钟，共 ${end} 格）：每个方框是一次 forward 或 backward，框里是 micro-batch 编号；方框下的色条是 warm-up / steady / cool-down；黄色箭头是相邻 stage 之间的 p2p。`);
    fig.text(4, 16, title, { size: 13, bold: true });
    const step = end > 30 ? 6 : 3;
    for (let t = 0; t <= end; t++) {
      const x = LEFT + t * unit;
      fig.line(x, TOP - 4, x, TOP + lanes.length * LANE - 12, t % step === 0 ? "grid" : "light");
      if (t % step === 0) fig.text(x, axisY, String(t), { size: 11, anchor: "middle", kind: "muted" });
    }
    fig.text(4, axisY, "时间", { size: 11, kind: "muted" });
    const at = {};
    lanes.forEach((ops, r) => ops.forEach(op => { at[`${op.kind}${op.mb}@${op.chunk * pp + r}`] = [r, op]; }));
    lanes.forEach((ops, r) => {
      const y = TOP + r * LANE;
      fig.group(`rank ${r}`, f => {
        f.text(4, y + BOX / 2, `rank ${r}`);
        for (const op of ops) {
          const second = v > 1 && op.chunk >= 1;
          const kind = op.kind === "F" ? (second ? "fwd2" : "fwd") : (second ? "bwd2" : "bwd");
          f.boxed(LEFT + op.start * unit + 1, y, (op.end - op.start) * unit - 2, BOX, String(op.mb), kind,
            { tip: `rank ${r} ${op.label}` });
        }
      });
      const [w, s] = entry.ranks[r].phases;
      const parts = [ops.slice(0, w), ops.slice(w, w + 2 * s), ops.slice(w + 2 * s)];
      fig.group(`phases ${r}`, f => parts.forEach((part, i) => {
        if (!part.length) return;
        const x0 = LEFT + part[0].start * unit, x1 = LEFT + part[part.length - 1].end * unit;
        f.rect(x0 + 1, y + BOX + 3, x1 - x0 - 2, STRIP, PHASES[i][0], { faint: true, rx: 2, tip: `rank ${r} ${PHASES[i][1]}: ${part.length} 步` });
        if (textWidth(PHASES[i][1], 11) + 6 < x1 - x0) f.text((x0 + x1) / 2, y + BOX + 3 + STRIP / 2, PHASES[i][1], { size: 11, anchor: "middle" });
      }));
    });
    fig.group("p2p", f => lanes.forEach((ops, r) => ops.forEach(op => {
      const stage = op.chunk * pp + r, next = op.kind === "F" ? stage + 1 : stage - 1;
      const to = at[`${op.kind}${op.mb}@${next}`];
      if (!to) return;
      const [dst, target] = to, down = dst > r;
      f.line(LEFT + op.end * unit - 2, TOP + r * LANE + (down ? BOX : 0), LEFT + target.start * unit + 3,
        TOP + dst * LANE + (down ? 0 : BOX), "comm", { width: 1.5, arrow: true });
    })));
    const items = v > 1
      ? [["fwd", "forward chunk 0"], ["fwd2", "forward chunk 1"], ["bwd", "backward chunk 0"], ["bwd2", "backward chunk 1"]]
      : [["fwd", "forward"], ["bwd", "backward"]];
    fig.legend(LEFT, legendY, items);
    fig.line(LEFT, legendY + 22, LEFT + 22, legendY + 22, "comm", { width: 1.5, arrow: true });
    fig.text(LEFT + 28, legendY + 22, "p2p：激活发给下一 stage，梯度发回上一 stage");
    let x = LEFT;
    for (const [kind, name] of PHASES) {
      fig.rect(x, legendY + 44 - 6, 22, 12, kind, { faint: true, rx: 2 });
      fig.text(x + 27, legendY + 44, name);
      x += 27 + textWidth(name, 12) + 16;
    }
    fig.check();
    return fig.svg();
  }

  function controls(data, s) {
    select($("[name=pp]"), data.pps.map(p => [p, String(p)]), s.pp);
    select($("[name=vp]"), [["1", "1（1F1B）"], ["2", "2（interleaved）"]], s.vp);
    select($("[name=m]"), data.microbatches.map(m => [m, String(m)]), s.m);
    const g = $("[name=g]");
    if (s.vp === "2") {
      const opts = [];
      for (let i = 1; i <= Number(s.m); i++) opts.push([i, String(i) + (String(i) === s.pp ? "（缺省 = PP）" : "")]);
      select(g, opts, s.g);
      g.disabled = false;
    } else { select(g, [["", "—（只用于 interleaved）"]], ""); g.disabled = true; }
  }

  function render() {
    const hash = location.hash;
    load("schedules", 0, "schedules.js").then(data => {
      if (location.hash !== hash) return;
      const s = state(data);
      controls(data, s);
      const pp = Number(s.pp), v = Number(s.vp), m = Number(s.m);
      const key = `${pp}.${v}.${m}.${v > 1 ? s.g : 0}`;
      const entry = data.cases[key];
      current = { key, entry };
      $(".ms-error").hidden = !entry.error;
      $(".ms-result").hidden = !!entry.error;
      if (entry.error) {
        $(".ms-error").innerHTML = "<p><strong>Megatron 拒绝了这个组合</strong>（schedule 在第一次 p2p 之前抛出的原话）：</p>"
          + `<pre><code>${esc(entry.error)}</code></pre>`;
        root.dataset.state = "error";
        root.dataset.shown = hash;
        return;
      }
      const title = `PP=${pp}` + (v > 1 ? `, VP=${v}, group=${s.g}` : "") + `, m=${m}`;
      $(".ms-func").innerHTML = `<code>get_forward_backward_func()</code> 返回 <code>${esc(entry.func)}</code>`;
      $(".ms-timeline").innerHTML = drawTimeline(entry, pp, v, title);
      const same = entry.bubble === entry.formula;
      $(".ms-bubble").innerHTML = `量出的气泡 <strong>${entry.bubble}</strong>（空闲格 ÷ (${entry.ranks.length} × ${entry.makespan}) 格）`
        + ` · 公式 (p−1)/(v·m+p−1) = (${pp}−1)/(${v}·${m}+${pp}−1) = <strong>${entry.formula}</strong>`
        + (same ? " · 相等" : " · 不相等");
      $(".ms-ranks tbody").innerHTML = entry.ranks.map((r, i) => {
        const ok = r.phases.join() === r.code.join();
        return `<tr><td>${i}</td><td class="ms-members">${esc(r.ops)}</td><td>(${r.phases.join(", ")})</td><td>(${r.code.join(", ")})</td><td>${ok ? "是" : "否"}</td></tr>`;
      }).join("");
      const f = $(".ms-finding");
      f.hidden = !entry.batched;
      if (entry.batched) {
        f.innerHTML = `<p><strong>第 13 篇的发现：PP=2 的 interleaved 用 <code>batch_p2p_comm=True</code> 会静默算错。</strong>`
          + ` 上面的记录用的是逐个发送（<code>batch_p2p_comm=False</code>），loss = ${entry.batched.separate}，和 PP=1 的 ${entry.batched.pp1} 相同；`
          + `同一组设置换成批量发送，loss = <strong>${entry.batched.batched}</strong>。PP=2 时前后邻居是同一个 rank，一批里发给它的激活和梯度按发出顺序配对，两个方向的张量互换了。`
          + ` 详见<a href="../../notes/13_pipeline_schedules/#遗留问题">第 13 篇的遗留问题</a>。</p>`;
      }
      root.dataset.state = "ok";
      root.dataset.shown = hash;
    }, error => { $(".ms-error").hidden = false; $(".ms-error").textContent = String(error); });
  }

  root.addEventListener("change", e => {
    load("schedules", 0, "schedules.js").then(data => {
      const s = state(data);
      s[e.target.name] = e.target.value;
      if (e.target.name === "vp" && s.vp === "2") s.g = s.pp;
      if (e.target.name === "pp" && s.vp === "2") s.g = s.pp;
      if (s.vp === "1") delete s.g;
      writeHash(s);
    });
  });
  window.addEventListener("hashchange", render);
  window.msScheduleExplorer = { current: () => current };
  render();
})();
