/* The drawing layer's in-browser twin (snippets/record/draw.py) and the explorers' data loader.

   MsFigure writes the same SVG as the Python Figure: kinds are CSS classes (f-/s-/t-<kind>) whose
   colors are the site's --ms-<kind> variables, with the same fallbacks inside the picture's
   <style>; labels never under 11 px. The explorers draw with it from data recorded by real
   Megatron runs (python -m snippets.site.explorers); nothing here computes a group or a schedule.

   Data files are scripts calling msExplorerData(name, key, data), loaded on demand with a
   <script> tag, so a built site opened from disk (file://, where fetch is refused) works too. */
(function () {
  "use strict";
  // kind -> light color: the fallbacks of snippets/record/draw.py PALETTE (a test compares them)
  const PALETTE = {
    ink: "#1f2328", muted: "#8c959f", grid: "#d0d7de", paper: "#ffffff",
    tp: "#4c78a8", pp: "#f58518", dp: "#54a24b", cp: "#b279a2", ep: "#e45756",
    edp: "#72b7b2", emb: "#9d755d", fwd: "#4c78a8", fwd2: "#9ecae9", bwd: "#e45756",
    bwd2: "#ff9d98", comm: "#eeca3b", mem: "#bab0ac", accent: "#d62728", light: "#eef2f6",
  };
  const LIGHT_FILLS = new Set(["fwd2", "bwd2", "comm", "mem", "light", "paper", "edp", "grid"]);
  const MIN_FONT = 11;

  const n = v => { const r = Math.round(v * 10) / 10; return Number.isInteger(r) ? String(r) : r.toFixed(1); };
  const esc = s => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  const textWidth = (s, size) => {
    let wide = 0;
    for (const ch of String(s)) if (ch.codePointAt(0) > 0x2e80) wide++;
    return (wide + (String(s).length - wide) * 0.6) * size;
  };

  class MsFigure {
    constructor(width, height, title, desc) {
      this.width = width; this.height = height; this.title = title; this.desc = desc || "";
      this.body = []; this.depth = 0; this.arrows = new Set(); this.labels = [];
    }
    add(el) { this.body.push("  ".repeat(this.depth + 1) + el); }
    markerId(kind) {
      let h = 0;
      for (const ch of this.title) h = (h * 31 + ch.codePointAt(0)) >>> 0;
      return `ms-arrow-${kind}-${h.toString(16)}`;
    }
    rect(x, y, w, h, kind = "muted", o = {}) {
      const cls = [`f-${kind}`].concat(o.outline ? [`s-${o.outline}`] : [], o.faint ? ["faint"] : [], o.dashed ? ["dashed"] : []);
      const rx = o.rx === undefined ? 3 : o.rx;
      const sw = o.strokeWidth ? ` stroke-width="${n(o.strokeWidth)}"` : "";
      const data = o.data ? Object.entries(o.data).map(([k, v]) => ` data-${k}="${esc(v)}"`).join("") : "";
      const attrs = `x="${n(x)}" y="${n(y)}" width="${n(w)}" height="${n(h)}"` + (rx ? ` rx="${n(rx)}"` : "") + sw + data + ` class="${cls.join(" ")}"`;
      this.add(o.tip ? `<rect ${attrs}><title>${esc(o.tip)}</title></rect>` : `<rect ${attrs}/>`);
    }
    text(x, y, s, o = {}) {
      const size = o.size || 12, anchor = o.anchor || "start", kind = o.kind || "ink";
      if (size < MIN_FONT) throw new Error(`font size ${size} px is under ${MIN_FONT} px: ${s}`);
      const w = textWidth(s, size);
      const left = x - (anchor === "middle" ? w / 2 : anchor === "end" ? w : 0);
      this.labels.push({ x: left, y: y - size * 0.6, w, h: size * 1.2, text: String(s) });
      const cls = [`t-${kind}`].concat(o.bold ? ["b"] : [], o.mono ? ["mono"] : []);
      const a = anchor === "start" ? "" : ` text-anchor="${anchor}"`;
      const sz = size === 12 ? "" : ` font-size="${n(size)}"`;
      this.add(`<text x="${n(x)}" y="${n(y)}" dy="0.35em"${a}${sz} class="${cls.join(" ")}">${esc(s)}</text>`);
    }
    boxed(x, y, w, h, s, kind = "muted", o = {}) {
      this.rect(x, y, w, h, kind, o);
      const ink = LIGHT_FILLS.has(kind) || o.faint ? "ink" : "on";
      this.text(x + w / 2, y + h / 2, s, { size: o.size || 12, anchor: "middle", kind: ink, bold: o.bold });
    }
    line(x1, y1, x2, y2, kind = "grid", o = {}) {
      const cls = [`s-${kind}`].concat(o.dashed ? ["dashed"] : [], o.arrow ? [`a-${kind}`] : []);
      const w = o.width && o.width !== 1 ? ` stroke-width="${n(o.width)}"` : "";
      const marker = o.arrow ? ` marker-end="url(#${this.markerId(kind)})"` : "";
      if (o.arrow) this.arrows.add(kind);
      this.add(`<line x1="${n(x1)}" y1="${n(y1)}" x2="${n(x2)}" y2="${n(y2)}"${w}${marker} class="${cls.join(" ")}"/>`);
    }
    group(name, draw) {
      this.add(name ? `<g data-name="${esc(name)}">` : "<g>");
      this.depth++;
      try { draw(this); } finally { this.depth--; this.add("</g>"); }
    }
    legend(x, y, items, size = 12, gap = 16) {
      for (const [kind, name] of items) {
        this.rect(x, y - size / 2, size, size, kind, { rx: 2 });
        this.text(x + size + 5, y, name, { size });
        x += size + 5 + textWidth(name, size) + gap;
      }
      return x;
    }
    check() {
      const L = this.labels;
      for (let i = 0; i < L.length; i++) {
        const a = L[i];
        if (a.x < -0.5 || a.y < -0.5 || a.x + a.w > this.width + 0.5 || a.y + a.h > this.height + 0.5)
          throw new Error(`label ${a.text} leaves the picture`);
        for (let j = i + 1; j < L.length; j++) {
          const b = L[j];
          if (a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h)
            throw new Error(`labels ${a.text} and ${b.text} overlap`);
        }
      }
    }
    svg() {
      const joined = this.body.join("\n");
      const used = new Set([...joined.matchAll(/\b[fst]-([a-z0-9]+)\b/g)].map(m => m[1]).concat([...this.arrows]));
      const css = [
        ".ms-figure text{font-family:system-ui,-apple-system,'Segoe UI','Noto Sans CJK SC',sans-serif;font-size:12px}",
        ".ms-figure .b{font-weight:600}", ".ms-figure .nofill{fill:none}", ".ms-figure .faint{fill-opacity:.18}",
        ".ms-figure .dashed{stroke-dasharray:4 3}", ".ms-figure .t-on{fill:var(--ms-on,#ffffff)}",
      ];
      for (const k of Object.keys(PALETTE).sort()) {
        if (!used.has(k)) continue;
        const c = PALETTE[k];
        css.push(`.ms-figure .f-${k}{fill:var(--ms-${k},${c})}.ms-figure .s-${k}{stroke:var(--ms-${k},${c})}.ms-figure .t-${k}{fill:var(--ms-${k},${c})}`);
      }
      const defs = [...this.arrows].sort().map(k => `<marker id="${this.markerId(k)}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" class="f-${k}"/></marker>`).join("");
      const out = [`<svg xmlns="http://www.w3.org/2000/svg" class="ms-figure" width="${n(this.width)}" height="${n(this.height)}" viewBox="0 0 ${n(this.width)} ${n(this.height)}" role="img" aria-label="${esc(this.title)}">`,
        `  <title>${esc(this.title)}</title>`];
      if (this.desc) out.push(`  <desc>${esc(this.desc)}</desc>`);
      out.push(`  <style>${css.join("")}</style>`);
      if (defs) out.push(`  <defs>${defs}</defs>`);
      return out.concat(this.body, ["</svg>"]).join("\n") + "\n";
    }
  }

  // ------------------------------------------------------------------ data loading and the hash
  const base = document.currentScript.src.replace(/[^/]*$/, "") + "data/";
  const store = {}, waiting = {};
  window.msExplorerData = (name, key, data) => {
    const id = `${name}-${key}`;
    store[id] = data;
    (waiting[id] || []).forEach(resolve => resolve(data));
    delete waiting[id];
  };
  function load(name, key, file) {
    const id = `${name}-${key}`;
    if (store[id]) return Promise.resolve(store[id]);
    return new Promise((resolve, reject) => {
      if (!waiting[id]) {
        waiting[id] = [];
        const s = document.createElement("script");
        s.src = base + file;
        s.onerror = () => reject(new Error(`could not load ${file}`));
        document.head.appendChild(s);
      }
      waiting[id].push(resolve);
    });
  }
  const readHash = () => Object.fromEntries(new URLSearchParams(location.hash.replace(/^#/, "")));
  const writeHash = state => {
    const h = "#" + new URLSearchParams(state).toString();
    if (location.hash !== h) location.hash = h;
  };
  function select(el, options, value) {
    el.innerHTML = options.map(([v, label]) => `<option value="${esc(v)}"${String(v) === String(value) ? " selected" : ""}>${esc(label)}</option>`).join("");
  }
  window.MsDraw = { MsFigure, PALETTE, textWidth, esc, load, readHash, writeHash, select };
})();
