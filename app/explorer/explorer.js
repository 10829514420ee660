// The explorer's page side (anywidget ESM). It only draws what the kernel computed and sends the user's events
// back; no number is computed here (the package interp/app/explorer/ computes them with the toolkit's analyses).

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// replace an element's children, skipping null / false
function put(el, ...kids) {
  el.replaceChildren(...kids.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

const fmt = (x, d = 4) => (x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(d));
const sgn = (x, d = 3) => (x === null || x === undefined ? "–" : (x >= 0 ? "+" : "") + Number(x).toFixed(d));

// white -> dark blue (attention weights; t already on the square-root scale)
function blues(t) {
  t = Math.max(0, Math.min(1, t));
  return [255 + (8 - 255) * t, 255 + (48 - 255) * t, 255 + (107 - 255) * t];
}

// red (negative) - white - blue (positive), t in [-1, 1]
function rdbu(t) {
  if (t === null || t === undefined || Number.isNaN(t)) return [235, 235, 235];
  t = Math.max(-1, Math.min(1, t));
  const end = t < 0 ? [178, 24, 43] : [33, 102, 172];
  const a = Math.abs(t);
  return [255 + (end[0] - 255) * a, 255 + (end[1] - 255) * a, 255 + (end[2] - 255) * a];
}

const css = (c) => `rgb(${c.map((v) => Math.round(v)).join(",")})`;
const ink = (c) => (0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] < 140 ? "#fff" : "#111");

function floats(dv) {
  // bytes from the kernel arrive as a DataView; copy them so the Float32Array is aligned
  const buf = dv.buffer.slice(dv.byteOffset, dv.byteOffset + dv.byteLength);
  return new Float32Array(buf);
}

function uint16s(dv) {
  const buf = dv.buffer.slice(dv.byteOffset, dv.byteOffset + dv.byteLength);
  return new Uint16Array(buf);
}

// one attention pattern [w, w] (uint16 weights x 65535) drawn into a canvas, keys after the query in light grey
function drawPattern(canvas, data, start, w) {
  canvas.width = w;
  canvas.height = w;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(w, w);
  for (let q = 0; q < w; q++) {
    for (let k = 0; k < w; k++) {
      const i = (q * w + k) * 4;
      let c;
      if (k > q) c = [242, 242, 242];
      else c = blues(Math.sqrt(data[start + q * w + k] / 65535));
      img.data[i] = c[0];
      img.data[i + 1] = c[1];
      img.data[i + 2] = c[2];
      img.data[i + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
}

function cellAt(canvas, ev, rows, cols) {
  const r = canvas.getBoundingClientRect();
  const x = Math.floor(((ev.clientX - r.left) / r.width) * cols);
  const y = Math.floor(((ev.clientY - r.top) / r.height) * rows);
  return [Math.max(0, Math.min(rows - 1, y)), Math.max(0, Math.min(cols - 1, x))];
}

function render({ model, el }) {
  const listeners = [];
  const on = (name, fn) => {
    model.on(name, fn);
    listeners.push([name, fn]);
  };
  const get = (name) => model.get(name) || {};
  let sentAt = null;
  let lastSeq = null;

  const root = h("div", { class: "ix" });
  el.append(root);
  const send = (msg) => {
    sentAt = performance.now();
    root.classList.add("ix-busy");
    model.send(msg);
  };

  // ---- skeleton ----------------------------------------------------------------------------------------------
  const title = h("span", { class: "ix-title" });
  const statusEl = h("span", { class: "ix-status", "data-testid": "status" });
  const errorEl = h("div", { class: "ix-error", "data-testid": "error" });
  root.append(h("div", { class: "ix-top" }, h("b", {}, "interp explorer"), title, statusEl), errorEl);

  // input
  const splitSel = h("select", { class: "ix-split", title: "split" });
  const indexIn = h("input", { class: "ix-index", type: "number", min: "0", step: "1", title: "example index" });
  const goBtn = h("button", { class: "ix-btn", text: "show", title: "show this example" });
  const randBtn = h("button", { class: "ix-btn", text: "random", title: "a random example of the split" });
  const typedIn = h("input", { class: "ix-typed", type: "text", placeholder: "type tokens, e.g. 0 1 1 2", spellcheck: "false" });
  const typedBtn = h("button", { class: "ix-btn", text: "use typed", title: "use the typed tokens as the input" });
  const tokensEl = h("div", { class: "ix-tokens" });
  const sourceEl = h("span", { class: "ix-muted" });
  root.append(h("section", { class: "ix-sec ix-input" },
    h("div", { class: "ix-row ix-controls" }, h("span", { class: "ix-label" }, "Input"), splitSel, "#", indexIn, goBtn,
      randBtn, h("span", { class: "ix-sep" }), typedIn, typedBtn),
    h("div", {}, sourceEl), tokensEl));
  goBtn.addEventListener("click", () => send({ type: "example", split: splitSel.value, index: indexIn.value }));
  indexIn.addEventListener("keydown", (e) => { if (e.key === "Enter") goBtn.click(); });
  splitSel.addEventListener("change", () => send({ type: "example", split: splitSel.value, index: 0 }));
  randBtn.addEventListener("click", () => send({ type: "random", split: splitSel.value }));
  typedBtn.addEventListener("click", () => send({ type: "typed", text: typedIn.value }));
  typedIn.addEventListener("keydown", (e) => { if (e.key === "Enter") typedBtn.click(); });

  // prediction and heads off
  const predEl = h("div", { class: "ix-pred" });
  const accEl = h("div", { class: "ix-acc", "data-testid": "accuracy" });
  const ablSel = h("select", { class: "ix-ablation", title: "what a head switched off outputs" },
    h("option", { value: "zero" }, "zero ablation"), h("option", { value: "mean" }, "mean ablation"));
  const batchIn = h("input", { class: "ix-batch", type: "number", min: "1", step: "1", title: "accuracy batch size" });
  const allOnBtn = h("button", { class: "ix-btn", text: "all heads on" });
  const maskEl = h("div", { class: "ix-mask" });
  const metricsBtn = h("button", { class: "ix-btn ix-small", text: "task metrics", title: "the task's own metrics under the mask (one full forward pass of the batch: seconds for long inputs)" });
  const metricsEl = h("div", { class: "ix-metrics ix-muted" });
  root.append(h("div", { class: "ix-cols" },
    h("section", { class: "ix-sec" }, h("h4", {}, "Prediction ", h("span", { class: "ix-muted" }, "at the answer positions, under the mask")), predEl),
    h("section", { class: "ix-sec" }, h("h4", {}, "Heads off"),
      h("div", { class: "ix-row" }, ablSel, "batch", batchIn, allOnBtn), maskEl, accEl, h("div", { class: "ix-row" }, metricsBtn), metricsEl)));
  ablSel.addEventListener("change", () => send({ type: "ablation", value: ablSel.value }));
  batchIn.addEventListener("change", () => send({ type: "batch_size", value: batchIn.value }));
  allOnBtn.addEventListener("click", () => send({ type: "ablated", heads: [] }));
  metricsBtn.addEventListener("click", () => send({ type: "compute", what: "metrics" }));

  // attention
  const gridEl = h("div", { class: "ix-grid" });
  const hoverEl = h("div", { class: "ix-hover", "data-testid": "hover" }, "hover a pattern: query, key, weight");
  const windowEl = h("span", { class: "ix-muted" });
  root.append(h("section", { class: "ix-sec" },
    h("h4", {}, "Attention ", h("span", { class: "ix-muted" }, "rows: queries, columns: keys, colour: √weight; click a head for its panel, the switch turns it off "), windowEl),
    gridEl, hoverEl));

  // head panel
  const panelEl = h("section", { class: "ix-sec ix-panel", "data-testid": "panel" });
  root.append(panelEl);

  // patching
  const corrSel = h("select", { class: "ix-corruption" });
  const corrIn = h("input", { class: "ix-typed", type: "text", placeholder: "typed corrupted input", spellcheck: "false" });
  const corrBtn = h("button", { class: "ix-btn", text: "patch" });
  const senderSel = h("select", { class: "ix-sender" });
  const patchEl = h("div", { class: "ix-patch" });
  const senderRow = h("div", { class: "ix-row" }, "path patching from sender", senderSel);
  root.append(h("section", { class: "ix-sec" },
    h("h4", {}, "Patching ", h("span", { class: "ix-muted" }, "each head's output, clean into corrupted, on the full model (metric: logit difference of the two answers; 1 = clean, 0 = corrupted)")),
    h("div", { class: "ix-row" }, "corrupted input", corrSel, corrIn, corrBtn), senderRow, patchEl));
  corrSel.addEventListener("change", () => {
    if (corrSel.value !== "typed") send({ type: "corruption", kind: corrSel.value, text: corrIn.value });
    corrIn.style.display = corrSel.value === "typed" ? "" : "none";
  });
  corrBtn.addEventListener("click", () => send({ type: "corruption", kind: corrSel.value, text: corrIn.value }));
  corrIn.addEventListener("keydown", (e) => { if (e.key === "Enter") corrBtn.click(); });
  senderSel.addEventListener("change", () => send({ type: "sender", head: senderSel.value || null }));

  // circuit
  const circBtn = h("button", { class: "ix-btn", text: "score the edges (EAP)", title: "edge attribution patching of every edge between the input and its corruption" });
  const circAllBtn = h("button", { class: "ix-btn ix-small", text: "all edges on" });
  const circEl = h("div", { class: "ix-circuit-view", "data-testid": "circuit" });
  root.append(h("section", { class: "ix-sec" },
    h("h4", {}, "Circuit ", h("span", { class: "ix-muted" }, "the model's graph on the input and its corruption, on the full model; edges coloured by their EAP score (red: removing the edge lowers the logit difference, blue: raises it; width: |score|; dashed grey: off); click an edge to switch it off or on, a node for its edges")),
    h("div", { class: "ix-row" }, circBtn, circAllBtn), circEl));
  circBtn.addEventListener("click", () => send({ type: "compute", what: "circuit" }));
  circAllBtn.addEventListener("click", () => send({ type: "edges_off", edges: [] }));

  // export
  const snippetEl = h("pre", { class: "ix-code", "data-testid": "snippet" });
  const stateEl = h("pre", { class: "ix-code" });
  const copyBtn = h("button", { class: "ix-btn ix-small", text: "copy snippet" });
  const stateBtn = h("button", { class: "ix-btn ix-small", text: "state as JSON" });
  root.append(h("details", { class: "ix-sec ix-export" }, h("summary", {}, "Export: the Python that reproduces this view, and its state"),
    h("div", { class: "ix-row" }, copyBtn, stateBtn), snippetEl, stateEl));
  copyBtn.addEventListener("click", async () => {
    try { await navigator.clipboard.writeText(snippetEl.textContent); copyBtn.textContent = "copied"; }
    catch (e) {
      const range = document.createRange(); range.selectNodeContents(snippetEl);
      const s = window.getSelection(); s.removeAllRanges(); s.addRange(range); copyBtn.textContent = "selected: copy it";
    }
    setTimeout(() => { copyBtn.textContent = "copy snippet"; }, 1500);
  });
  stateBtn.addEventListener("click", () => send({ type: "export_state" }));

  // ---- drawing -------------------------------------------------------------------------------------------------
  const info = () => get("info");
  const headName = (l, hd) => `L${l}H${hd}`;

  function drawInfo() {
    const i = info();
    title.textContent = ` ${i.name} · task ${i.task} · ${i.n_layers} layer${i.n_layers > 1 ? "s" : ""} × ${i.n_heads} heads, d_model ${i.d_model}` +
      (i.attn_only ? ", attention only" : ", MLP") + (i.normalization ? `, ${i.normalization}` : "");
    put(splitSel, ...(i.splits || []).map((s) => h("option", { value: s }, s)));
    put(corrSel, h("option", { value: "none" }, "none"), ...(i.corruptions || []).map((k) => h("option", { value: k }, k)));
    typedIn.disabled = !i.typed;
    typedBtn.disabled = !i.typed;
    senderRow.style.display = i.n_layers > 1 ? "" : "none";
    const senders = (i.heads || []).filter((n) => Number(n.slice(1, n.indexOf("H"))) < i.n_layers - 1);
    put(senderSel, h("option", { value: "" }, "none"), ...senders.map((n) => h("option", { value: n }, n)));
    buildGrid();
  }

  function drawControls() {
    const c = get("controls");
    if (document.activeElement !== indexIn) indexIn.value = c.index;
    splitSel.value = c.split;
    ablSel.value = c.ablation;
    if (document.activeElement !== batchIn) batchIn.value = c.batch_size;
    if (c.source === "typed" && document.activeElement !== typedIn) typedIn.value = c.typed;
    corrSel.value = c.corruption || "none";
    corrIn.style.display = c.corruption === "typed" ? "" : "none";
    if (c.corruption === "typed" && document.activeElement !== corrIn) corrIn.value = c.corrupt_text;
    senderSel.value = c.sender || "";
    const off = new Set(c.ablated || []);
    for (const t of gridEl.querySelectorAll(".ix-thumb")) {
      const isOff = off.has(t.dataset.head);
      t.classList.toggle("ix-off", isOff);
      const b = t.querySelector(".ix-toggle");
      b.textContent = isOff ? "off" : "on";
      b.setAttribute("aria-pressed", String(!isOff));
      t.classList.toggle("ix-selected", t.dataset.head === c.head);
    }
  }

  function drawInput() {
    const v = get("input_view");
    const toks = v.tokens || [];
    const targets = new Set(v.targets || []);
    const cap = 400;
    sourceEl.textContent = (v.source === "example" ? `${v.split} example #${v.index} of ${v.size}` :
      v.source === "typed" ? "typed input" : `${v.pair} pair from the task's corruption helper (seed ${v.index})`) +
      ` · ${toks.length} tokens · answer ${v.label} predicted at position ${v.answer_pos}`;
    indexIn.max = String((v.size || 1) - 1);
    put(tokensEl, ...toks.slice(0, cap).map((t, i) => h("span", {
      class: "ix-tok" + (i === v.answer_pos ? " ix-ans" : targets.has(i) ? " ix-tgt" : ""),
      title: `position ${i}` + (i === v.answer_pos ? " (answer position)" : targets.has(i) ? " (has a target)" : ""),
    }, t)), toks.length > cap ? h("span", { class: "ix-muted" }, ` … ${toks.length - cap} more`) : null);
  }

  function drawPrediction() {
    const v = get("prediction_view");
    const rows = v.rows || [];
    const body = rows.map((r) => h("tr", { class: r.answer ? "ix-ansrow" : "" },
      h("td", {}, r.pos), h("td", {}, r.target ?? "–"),
      h("td", {}, ...r.top.map(([t, p], j) => h("span", { class: "ix-topk" + (j === 0 ? " ix-first" : "") },
        h("span", { class: "ix-bar", style: `width:${Math.round(p * 60)}px` }), `${t} ${fmt(p, 3)}`))),
      h("td", { class: r.correct === null ? "" : r.correct ? "ix-ok" : "ix-bad" }, r.correct === null ? "" : r.correct ? "✓" : "✗")));
    put(predEl, h("table", { class: "ix-table", "data-testid": "prediction" },
      h("thead", {}, h("tr", {}, h("th", {}, "pos"), h("th", {}, "target"), h("th", {}, "top tokens (probability)"), h("th", {}, ""))),
      h("tbody", {}, body)), v.n_rows > rows.length ? h("div", { class: "ix-muted" }, `first ${rows.length} of ${v.n_rows} positions`) : null);
  }

  function drawAccuracy() {
    const v = get("accuracy_view");
    if (!v.n) return;
    accEl.dataset.ablated = (v.ablated || []).join(",");
    accEl.dataset.correct = v.correct;
    accEl.dataset.n = v.n;
    accEl.dataset.ablation = v.ablation;
    put(accEl,
      h("div", { class: "ix-accnum" }, h("span", { class: "ix-accval", "data-testid": "accuracy-value" }, fmt(v.accuracy)),
        h("span", { class: "ix-muted" }, ` (${v.correct}/${v.n})`)),
      h("div", { class: "ix-muted" }, `learned accuracy on the first ${v.n} ${v.split} examples, ${v.ablation} ablation; all heads on: ${fmt(v.full)} (${v.full_correct}/${v.n})`));
    put(maskEl, ...(v.ablated && v.ablated.length ? [h("span", { class: "ix-muted" }, "off: "),
      ...v.ablated.map((m) => h("button", { class: "ix-chip", title: "switch it back on", onclick: () => send({ type: "toggle", head: m }) }, m, " ×"))]
      : [h("span", { class: "ix-muted" }, "every head on")]));
    put(metricsEl, ...(v.metrics ? Object.entries(v.metrics).map(([k, x]) => h("span", { class: "ix-metric" }, `${k} ${fmt(x)}`)) : []));
  }

  let patterns = null;
  function buildGrid() {
    const i = info();
    const n = i.n_heads || 0;
    const size = n <= 2 ? 150 : n <= 4 ? 128 : n <= 16 ? 96 : n <= 32 ? 72 : 60;
    put(gridEl);
    for (let l = 0; l < (i.n_layers || 0); l++) {
      const row = h("div", { class: "ix-layer" }, h("div", { class: "ix-lname" }, `L${l}`));
      for (let hd = 0; hd < n; hd++) {
        const name = headName(l, hd);
        const canvas = h("canvas", { class: "ix-canvas", style: `width:${size}px;height:${size}px`, title: `${name}: click for its panel` });
        const toggle = h("button", { class: "ix-toggle", "data-head": name, title: `switch ${name} off or on`, text: "on" });
        const thumb = h("div", { class: "ix-thumb", "data-head": name }, canvas,
          h("div", { class: "ix-cap" }, h("span", { class: "ix-hname" }, name), toggle));
        canvas.addEventListener("click", () => send({ type: "select", head: name }));
        canvas.addEventListener("mousemove", (ev) => hover(ev, canvas, l, hd));
        toggle.addEventListener("click", (ev) => { ev.stopPropagation(); send({ type: "toggle", head: name }); });
        row.append(thumb);
      }
      gridEl.append(row);
    }
    drawPatterns();
    drawControls();
  }

  function drawPatterns() {
    const v = get("patterns_view");
    if (!v.data) return;
    patterns = { ...v, values: uint16s(v.data) };
    const w = v.window;
    windowEl.textContent = v.offset ? `(positions ${v.offset}..${v.T - 1} of ${v.T})` : "";
    for (const thumb of gridEl.querySelectorAll(".ix-thumb")) {
      const [l, hd] = thumb.dataset.head.slice(1).split("H").map(Number);
      drawPattern(thumb.querySelector("canvas"), patterns.values, (l * v.n_heads + hd) * w * w, w);
    }
    drawPanelPattern();
  }

  function patternAt(l, hd, q, k) {
    const w = patterns.window;
    return patterns.values[(l * patterns.n_heads + hd) * w * w + q * w + k] / 65535;
  }

  function hover(ev, canvas, l, hd) {
    if (!patterns) return;
    const [q, k] = cellAt(canvas, ev, patterns.window, patterns.window);
    const toks = get("input_view").tokens || [];
    const qa = q + patterns.offset, ka = k + patterns.offset;
    hoverEl.textContent = k > q ? `${headName(l, hd)} · query ${qa} "${toks[qa]}" · key ${ka} "${toks[ka]}" comes after the query (masked)` :
      `${headName(l, hd)} · query ${qa} "${toks[qa]}" → key ${ka} "${toks[ka]}" · weight ${fmt(patternAt(l, hd, q, k))}`;
  }

  // head panel
  let panelCanvas = null;
  function drawPanelPattern() {
    const v = get("head_view");
    if (!panelCanvas || !patterns || !v.head) return;
    drawPattern(panelCanvas, patterns.values, (v.layer * patterns.n_heads + v.index) * patterns.window * patterns.window, patterns.window);
  }

  function scoreRow(name, value, note) {
    return h("tr", {}, h("th", {}, name), h("td", {}, value), h("td", { class: "ix-muted" }, note || ""));
  }

  function circuitView(c) {
    if (c.undefined) {  // a circuit the head's layer does not define (a QK circuit under linear or additive pooling)
      return h("div", { class: "ix-circ" }, h("div", { class: "ix-ctitle" }, c.name),
        h("div", { class: "ix-muted" }, c.undefined));
    }
    const [r, k] = c.shape;
    const m = floats(c.data);
    let max = 0;
    for (const x of m) if (!Number.isNaN(x)) max = Math.max(max, Math.abs(x));
    const out = h("div", { class: "ix-muted ix-hoverline" }, `max |value| ${fmt(max, 3)}; hover a cell`);
    const say = (i, j) => { out.textContent = `${c.row_title} ${c.rows[i]} · ${c.col_title} ${c.cols[j]} · ${fmt(m[i * k + j], 3)}`; };
    let body;
    if (r <= 24 && k <= 24) {
      // small vocabularies: a labelled table, one coloured cell per entry
      body = h("table", { class: "ix-ctable" },
        h("thead", {}, h("tr", {}, h("th", { class: "ix-muted", title: `rows: ${c.row_title}; columns: ${c.col_title}` }, "↓ → "),
          c.cols.map((t) => h("th", {}, t)))),
        h("tbody", {}, c.rows.map((rt, i) => h("tr", {}, h("th", {}, rt), c.cols.map((_, j) => {
          const x = m[i * k + j];
          const col = rdbu(Number.isNaN(x) ? null : max ? x / max : 0);
          const td = h("td", { style: `background:${css(col)}` });
          td.addEventListener("mouseenter", () => say(i, j));
          return td;
        })))));
    } else {
      const canvas = h("canvas", { class: "ix-circuit" });
      canvas.width = k;
      canvas.height = r;
      const ctx = canvas.getContext("2d");
      const img = ctx.createImageData(k, r);
      for (let i = 0; i < r * k; i++) {
        const col = rdbu(Number.isNaN(m[i]) ? null : max ? m[i] / max : 0);
        img.data.set([col[0], col[1], col[2], 255], i * 4);
      }
      ctx.putImageData(img, 0, 0);
      const px = Math.max(160, Math.min(300, Math.max(r, k) * 3));
      canvas.style.width = `${Math.round(px * k / Math.max(r, k))}px`;
      canvas.style.height = `${Math.round(px * r / Math.max(r, k))}px`;
      canvas.addEventListener("mousemove", (ev) => { const [i, j] = cellAt(canvas, ev, r, k); say(i, j); });
      body = canvas;
    }
    const cut = c.full_shape[0] > r || c.full_shape[1] > k ? ` (first ${r}×${k} of ${c.full_shape.join("×")})` : "";
    return h("div", { class: "ix-circ" }, h("div", { class: "ix-ctitle" }, c.name + cut,
      c.direct_only ? h("span", { class: "ix-muted" }, " · through the embedding only") : null),
      h("div", { class: "ix-muted" }, `rows: ${c.row_title}, columns: ${c.col_title}`), body, out);
  }

  function headGrid(values, label, digits = 2) {
    // a [layer][head] table of numbers coloured red-white-blue, one cell per head
    const i = info();
    let max = 0;
    for (const row of values) for (const x of row) if (x !== null) max = Math.max(max, Math.abs(x));
    return h("div", { class: "ix-scroll" }, h("table", { class: "ix-hgrid" }, h("tbody", {}, values.map((row, l) => h("tr", {}, h("th", {}, `L${l}`),
      row.map((x, hd) => {
        const c = rdbu(x === null ? null : max ? x / max : 0);
        return h("td", { style: `background:${css(c)};color:${ink(c)}`, title: `${headName(l, hd)}: ${label} ${x === null ? "undefined" : fmt(x, 4)}`,
          class: "ix-hcell", onclick: () => send({ type: "select", head: headName(l, hd) }) }, i.n_heads > 16 ? "" : x === null ? "–" : fmt(x, digits));
      }))))));
  }

  function drawHead() {
    const v = get("head_view");
    if (!v.head) { put(panelEl); panelEl.style.display = "none"; panelCanvas = null; drawControls(); return; }
    panelEl.style.display = "";
    const toks = get("input_view").tokens || [];
    panelCanvas = h("canvas", { class: "ix-big" });
    const bigHover = h("div", { class: "ix-muted ix-hoverline" }, "hover: query, key, weight");
    panelCanvas.addEventListener("mousemove", (ev) => {
      if (!patterns) return;
      const [q, k] = cellAt(panelCanvas, ev, patterns.window, patterns.window);
      const qa = q + patterns.offset, ka = k + patterns.offset;
      bigHover.textContent = k > q ? `query ${qa} "${toks[qa]}" · key ${ka} (after the query)` :
        `query ${qa} "${toks[qa]}" → key ${ka} "${toks[ka]}" · weight ${fmt(patternAt(v.layer, v.index, q, k))}`;
    });
    const s = v.scores;
    const sep = v.separation;
    const sh = v.shapley;
    const scores = h("table", { class: "ix-table ix-scores" }, h("tbody", {},
      scoreRow("learned accuracy alone", fmt(v.learned_alone), `every other head ablated; first ${v.n} ${v.split}`),
      scoreRow(v.off ? "accuracy with it back on" : "accuracy with it off", fmt(v.toggled_accuracy), "the current mask with this head toggled"),
      scoreRow("direct logit contribution", `${sgn(v.dla)} to "${v.dla_tokens[0]}"`, `${sgn(v.dla_diff)} to "${v.dla_tokens[0]}" − "${v.dla_tokens[1]}" at the answer position, under the mask`),
      s ? scoreRow("induction / prev-token", `${fmt(s.induction, 3)} / ${fmt(s.prev_token, 3)}`, `duplicate ${fmt(s.duplicate, 3)}, BOS ${fmt(s.bos, 3)}; ${v.scores_on}`)
        : scoreRow("induction / prev-token", "–", v.scores_on),
      scoreRow("separation accuracy", sep ? fmt(sep.accuracy) : h("button", { class: "ix-btn ix-small", onclick: () => send({ type: "compute", what: "separation" }) }, "compute (all heads)"),
        sep ? `ROC AUC ${fmt(sep.roc_auc, 3)}; LinearSVC (${sep.n_classes} answers; chance ${fmt(sep.chance, 3)}) fitted on ${sep.n_train} train, scored on the batch (${sep.n_test})` : "a linear separator on the head's output at the answer position"),
      scoreRow("Shapley value", sh ? sgn(sh.value, 4) : h("button", { class: "ix-btn ix-small", onclick: () => send({ type: "compute", what: "shapley" }) }, "compute (all heads)"),
        sh ? `rank ${sh.rank}; ${sh.exact ? "exact" : `sampled, ± ${fmt(sh.stderr, 4)}`}; v(all) ${fmt(sh.v_all)}, v(none) ${fmt(sh.v_empty)}; learned accuracy, this batch` : `of the learned accuracy over the heads (Fraknói 2024, Definition 5.3): ${info().shapley_cost}`),
    ));
    put(panelEl,
      h("div", { class: "ix-row ix-phead" }, h("b", {}, `Head ${v.head}`), h("span", { class: v.off ? "ix-bad" : "ix-ok" }, v.off ? " off" : " on"),
        h("button", { class: "ix-btn", onclick: () => send({ type: "toggle", head: v.head }) }, v.off ? "switch on" : "switch off"),
        h("button", { class: "ix-btn", onclick: () => send({ type: "only", head: v.head }) }, "only this head"),
        h("button", { class: "ix-btn", onclick: () => send({ type: "select", head: null }) }, "close")),
      h("div", { class: "ix-cols" },
        h("div", {}, panelCanvas, bigHover),
        h("div", {}, scores, h("div", { class: "ix-muted" }, `direct contribution of every head to "${v.dla_tokens[0]}" − "${v.dla_tokens[1]}":`), headGrid(v.dla_all || [], "contribution"))),
      h("div", { class: "ix-circs" }, (v.circuits || []).map(circuitView)));
    drawPanelPattern();
    drawControls();
  }

  function drawPatch() {
    const v = get("patch_view");
    if (!v.kind) { put(patchEl, h("div", { class: "ix-muted" }, "choose a corrupted input to patch")); return; }
    if (v.error || !v.normalized) { put(patchEl, h("div", { class: "ix-error" }, v.error || "")); return; }
    const toks = v.tokens || [];
    const diff = new Set(v.diff || []);
    const cap = 400;
    const parts = [
      h("div", { class: "ix-tokens" }, h("span", { class: "ix-muted" }, `corrupted (${v.kind}${v.resampled !== null && v.resampled !== undefined ? ` #${v.resampled}` : ""}): `),
        ...toks.slice(0, cap).map((t, i) => h("span", { class: "ix-tok" + (diff.has(i) ? " ix-diff" : ""), title: `position ${i}` }, t))),
      h("div", { class: "ix-muted" }, `logit("${v.clean_label}") − logit("${v.corrupted_label}"): clean ${fmt(v.clean, 3)}, corrupted ${fmt(v.corrupted, 3)}; cells: normalized effect of patching that head`),
      headGrid(v.normalized, "normalized effect"),
    ];
    if (v.path) {
      const rows = [...v.path.rows].sort((a, b) => Math.abs(b.normalized) - Math.abs(a.normalized)).slice(0, 24);
      parts.push(h("div", { class: "ix-muted" }, `path patching from ${v.sender}: its output patched only into each later head's query, key or value input`),
        h("table", { class: "ix-table", "data-testid": "path" }, h("thead", {}, h("tr", {}, h("th", {}, "receiver"), h("th", {}, "input"), h("th", {}, "value"), h("th", {}, "normalized"))),
          h("tbody", {}, rows.map((r) => h("tr", {}, h("td", {}, r.receiver), h("td", {}, r.input), h("td", {}, fmt(r.value, 3)), h("td", {}, fmt(r.normalized, 3)))))));
    }
    put(patchEl, ...parts);
  }

  // ---- the circuit view: an SVG graph, nodes in columns by layer, each head with its q, k, v inputs as ports ----
  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs = {}, ...children) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) el.setAttribute(k, v);
    for (const c of children) if (c) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return el;
  }
  let circSel = null;  // {edge: name} or {node: name}: what the circuit panel describes (the page's own choice)

  function circuitLayout(v) {
    const mlp = v.nodes.some((n) => n.kind === "mlp");
    const col = (n) => n.kind === "input" ? 0 : n.kind === "logits" ? 1 + (v.nodes.filter((m) => m.kind !== "input" && m.kind !== "logits")
      .reduce((a, m) => Math.max(a, m.layer), 0) + 1) * (mlp ? 2 : 1) : 1 + n.layer * (mlp ? 2 : 1) + (n.kind === "mlp" ? 1 : 0);
    const cols = {};
    for (const n of v.nodes) (cols[col(n)] = cols[col(n)] || []).push(n);
    const nCols = Math.max(...Object.keys(cols).map(Number)) + 1;
    const tallest = Math.max(...Object.values(cols).map((c) => c.length));
    const bh = tallest > 24 ? 14 : 26, gap = tallest > 24 ? 4 : 10, bw = 56, colW = 150;
    const H = Math.max(120, tallest * (bh + gap) + 20), W = nCols * colW;
    const pos = {};
    for (const [c, list] of Object.entries(cols)) {
      const top = (H - list.length * (bh + gap) + gap) / 2;
      list.forEach((n, i) => { pos[n.name] = { x: 20 + Number(c) * colW, y: top + i * (bh + gap), n }; });
    }
    return { pos, bh, bw, W: W - colW + bw + 40, H };
  }

  function drawCircuit() {
    const v = get("circuit_view");
    circAllBtn.style.display = v.edges_off && v.edges_off.length ? "" : "none";
    if (!v.on) { put(circEl, h("div", { class: "ix-muted" }, "choose a corrupted input, then score the edges")); return; }
    if (v.error || !v.nodes) { put(circEl, h("div", { class: "ix-error" }, v.error || "")); return; }
    const L = circuitLayout(v);
    const { pos, bh, bw } = L;
    let max = 0;
    for (const e of v.edges) if (e.score !== null) max = Math.max(max, Math.abs(e.score));
    const port = (r) => {
      const rec = v.receivers[r];
      const p = pos[rec.node];
      const y = rec.input === "q" ? p.y + bh * 0.2 : rec.input === "k" ? p.y + bh * 0.5 : rec.input === "v" ? p.y + bh * 0.8 : p.y + bh / 2;
      return [p.x, y];
    };
    const graphEl = svg("svg", { class: "ix-csvg", width: L.W, height: L.H, viewBox: `0 0 ${L.W} ${L.H}`, "data-testid": "circuit-graph" });
    const edgeLayer = svg("g", {});
    for (const e of v.edges) {
      const s = pos[v.senders[e.s]];
      const [x1, y1] = [s.x + bw, s.y + bh / 2];
      const [x2, y2] = port(e.r);
      const dx = Math.max(30, (x2 - x1) / 2);
      const d = `M${x1},${y1} C${x1 + dx},${y1} ${x2 - dx},${y2} ${x2},${y2}`;
      const t = e.score === null ? 0 : max ? e.score / max : 0;
      const c = e.off ? "#9aa0a6" : css(rdbu(t < 0 ? -1 : 1));
      const selected = circSel && (circSel.edge === e.name || circSel.node === v.senders[e.s] || circSel.node === v.receivers[e.r].node);
      const g = svg("g", { class: "ix-edge" + (e.off ? " ix-edge-off" : ""), "data-edge": e.name, "data-score": e.score },
        svg("title", {}, `${e.name}: score ${e.score === null ? "undefined" : sgn(e.score, 4)}${e.off ? " (off)" : ""}; click to switch it ${e.off ? "on" : "off"}`),
        svg("path", { d, fill: "none", stroke: c, "stroke-width": e.off ? 1.2 : 0.8 + 3.2 * Math.abs(t), "stroke-opacity": e.off ? 0.7 : selected ? 1 : 0.15 + 0.85 * Math.abs(t),
          "stroke-dasharray": e.off ? "4 3" : null }),
        svg("path", { d, fill: "none", stroke: "transparent", "stroke-width": 8, class: "ix-ehit" }));
      g.addEventListener("click", () => { circSel = { edge: e.name }; send({ type: "edge", edge: e.name }); });
      edgeLayer.append(g);
    }
    graphEl.append(edgeLayer);
    for (const [name, p] of Object.entries(pos)) {
      const isHead = p.n.kind === "head";
      const g = svg("g", { class: "ix-cnode", "data-node": name },
        svg("title", {}, `${name}: click for its edges`),
        svg("rect", { x: p.x, y: p.y, width: bw, height: bh, rx: 4, fill: circSel && circSel.node === name ? "#fff3c4" : "#f3f4f6", stroke: "#888" }),
        svg("text", { x: p.x + bw / 2, y: p.y + bh / 2 + 4, "text-anchor": "middle", "font-size": bh > 20 ? 11 : 9 }, name));
      if (isHead && bh > 20) for (const [k, f] of [["q", 0.2], ["k", 0.5], ["v", 0.8]]) {
        g.append(svg("text", { x: p.x + 2, y: p.y + bh * f + 3, "font-size": 7, fill: "#888" }, k));
      }
      g.addEventListener("click", () => { circSel = { node: name }; drawCircuit(); });
      graphEl.append(g);
    }
    const pr = v.prediction, fp = v.full_prediction;
    const predText = (p) => p.top.map(([t, x]) => `${t} ${fmt(x, 3)}`).join(", ");
    const numbers = h("table", { class: "ix-table ix-scores", "data-testid": "circuit-numbers" }, h("tbody", {},
      scoreRow("edges off", `${v.n_off} of ${v.n_edges}`, v.edges.length < v.n_edges ? `the ${v.edges.length} drawn: the largest |score| and every edge off` : ""),
      scoreRow(`logit("${v.clean_label}") − logit("${v.corrupted_label}")`, h("span", { "data-testid": "circuit-left" }, fmt(v.left, 4)), `full model ${fmt(v.full, 4)}, every edge off ${fmt(v.empty, 4)}`),
      scoreRow("faithfulness of what is left", h("span", { "data-testid": "circuit-faithfulness" }, v.faithfulness === null ? "undefined" : fmt(v.faithfulness, 4)),
        "(left − every edge off) / (full − every edge off); a removed edge carries the corrupted run's sender output"),
      scoreRow("prediction with the edges off", h("span", { "data-testid": "circuit-prediction", class: pr.correct ? "ix-ok" : "ix-bad" }, predText(pr)), `full model: ${predText(fp)}`)));
    let detail = h("div", { class: "ix-muted" }, "click an edge to switch it off or on, a node for its edges");
    if (circSel && circSel.edge) {
      const e = v.edges.find((x) => x.name === circSel.edge);
      if (e) detail = h("div", { "data-testid": "circuit-selected" }, h("b", {}, e.name), ` · EAP score ${e.score === null ? "undefined" : sgn(e.score, 4)} · `,
        h("span", { class: e.off ? "ix-bad" : "ix-ok" }, e.off ? "off" : "on"),
        h("button", { class: "ix-btn ix-small", onclick: () => send({ type: "edge", edge: e.name }) }, e.off ? "switch on" : "switch off"));
    } else if (circSel && circSel.node) {
      const name = circSel.node;
      const mine = v.edges.filter((e) => v.senders[e.s] === name || v.receivers[e.r].node === name);
      const total = mine.reduce((a, e) => a + (e.score || 0), 0);
      const names = mine.map((e) => e.name);
      const allOff = mine.length > 0 && mine.every((e) => e.off);
      const rest = (v.edges_off || []).filter((x) => !names.includes(x));
      detail = h("div", { "data-testid": "circuit-selected" }, h("b", {}, name), ` · ${mine.length} edges drawn, their scores sum to ${sgn(total, 4)} · `,
        h("button", { class: "ix-btn ix-small", onclick: () => send({ type: "edges_off", edges: allOff ? rest : [...rest, ...names] }) }, allOff ? "switch its edges on" : "switch its edges off"));
    }
    put(circEl, h("div", { class: "ix-scroll" }, graphEl), detail, numbers);
  }

  function drawExport() {
    const v = get("export_view");
    snippetEl.textContent = v.snippet || "";
    stateEl.textContent = v.state || "";
    stateEl.style.display = v.state ? "" : "none";
  }

  function drawStatus() {
    const s = get("status");
    errorEl.textContent = s.error || "";
    errorEl.style.display = s.error ? "" : "none";
    const ms = s.ms || {};
    const parts = Object.entries(ms).filter(([k]) => k !== "total").map(([k, v]) => `${k} ${v.toFixed(1)}`);
    const kernel = ms.total !== undefined ? `kernel ${ms.total.toFixed(1)} ms` : "";
    if (s.seq !== lastSeq) {
      lastSeq = s.seq;
      root.classList.remove("ix-busy");
      if (sentAt !== null) {
        const t0 = sentAt;
        sentAt = null;
        requestAnimationFrame(() => {
          const rt = performance.now() - t0;
          root.dataset.roundtripMs = rt.toFixed(1);
          root.dataset.seq = String(s.seq);
          statusEl.textContent = `updated in ${rt.toFixed(0)} ms (${kernel}${parts.length ? ": " + parts.join(", ") : ""})`;
        });
      } else {
        root.dataset.seq = String(s.seq);
        statusEl.textContent = kernel ? `${kernel}${parts.length ? ": " + parts.join(", ") : ""}` : "";
      }
    }
  }

  const views = { info: drawInfo, controls: drawControls, input_view: drawInput, prediction_view: drawPrediction,
    accuracy_view: drawAccuracy, patterns_view: drawPatterns, head_view: drawHead, patch_view: drawPatch, circuit_view: drawCircuit,
    export_view: drawExport, status: drawStatus };
  for (const [name, fn] of Object.entries(views)) on(`change:${name}`, fn);
  drawInfo();
  for (const [name, fn] of Object.entries(views)) if (name !== "info") fn();
  return () => { for (const [name, fn] of listeners) model.off(name, fn); };
}

export default { render };
