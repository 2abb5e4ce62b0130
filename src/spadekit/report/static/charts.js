/* spadekit dashboard, part 1: DOM helpers, inline SVG charts and a small Python highlighter.
 *
 * Every piece of run-derived text reaches the DOM through textContent / createTextNode; no
 * HTML parsing of data anywhere. Attribute values set here are numbers or names chosen by this file. */
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04",
  "#db2777", "#4b5563", "#65a30d"];

/* h("div", {class: "x", text: "y", onclick: f, title: "t"}, child, "text", ...) */
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  setAttrs(e, attrs);
  for (const k of kids.flat(Infinity)) {
    if (k === null || k === undefined || k === false) continue;
    e.appendChild(typeof k === "object" ? k : document.createTextNode(String(k)));
  }
  return e;
}

function setAttrs(e, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") e.textContent = String(v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, String(v));
  }
}

function s(tag, attrs, ...kids) {
  const e = document.createElementNS(SVGNS, tag);
  setAttrs(e, attrs);
  for (const k of kids.flat(Infinity)) if (k) e.appendChild(k);
  return e;
}

function isNum(v) { return typeof v === "number" && isFinite(v); }

function fmt(v, digits) {
  if (!isNum(v)) return "–";
  if (digits === undefined && Number.isInteger(v) && Math.abs(v) < 1e4) return String(v);
  if (digits === undefined) {
    const a = Math.abs(v);
    digits = a >= 1000 ? 0 : a >= 100 ? 1 : a >= 1 ? 2 : 3;
  }
  if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(1) + "k";
  return v.toFixed(digits);
}

function pct(v) { return isNum(v) ? Math.round(v * 100) + "%" : "–"; }

function niceTicks(lo, hi, n) {
  if (!(hi > lo)) { hi = lo + 1; }
  const raw = (hi - lo) / Math.max(1, n);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(x => x >= raw) || raw;
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    out.push(Math.abs(t) < step * 1e-9 ? 0 : t);
  }
  return out;
}

function emptyChart(title, why) {
  return h("div", {class: "chart empty"}, h("div", {class: "chart-title", text: title}),
    h("div", {class: "no-data", text: why || "no data yet"}));
}

/* One shared tooltip, filled with text lines. */
let TIP = null;
function showTip(evt, lines) {
  if (!TIP) { TIP = h("div", {class: "tooltip"}); document.body.appendChild(TIP); }
  TIP.replaceChildren(...lines.map(l => h("div", {text: l})));
  TIP.style.display = "block";
  TIP.style.left = Math.min(evt.pageX + 12, window.scrollX + window.innerWidth - 220) + "px";
  TIP.style.top = (evt.pageY + 12) + "px";
}
function hideTip() { if (TIP) TIP.style.display = "none"; }

/* A frame with axes: returns {svg, x(v), y(v), plot} for a domain. */
function frame(xDomain, yDomain, opts) {
  const W = 480, H = opts.height || 220, L = 46, R = 10, T = 10, B = 26;
  let [x0, x1] = xDomain; let [y0, y1] = yDomain;
  if (x1 <= x0) { x0 -= 1; x1 += 1; }
  if (y1 <= y0) { const d = Math.abs(y0) * 0.1 || 0.5; y0 -= d; y1 += d; }
  const x = v => L + (v - x0) / (x1 - x0) * (W - L - R);
  const y = v => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  const root = s("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart-svg", role: "img"});
  const axes = s("g", {class: "axes"});
  const yt = niceTicks(y0, y1, 4);
  const step = yt.length > 1 ? yt[1] - yt[0] : 1;
  const e10 = Math.ceil(-Math.log10(step) - 1e-9), m = step * Math.pow(10, e10);
  const dec = Math.max(0, Math.min(6, e10 + (Math.abs(m - Math.round(m)) > 1e-9 ? 1 : 0)));
  const tickFmt = opts.yFmt || (v => Math.abs(v) >= 1e4 ? fmt(v) : v.toFixed(dec));
  for (const t of yt) {
    axes.appendChild(s("line", {x1: L, x2: W - R, y1: y(t), y2: y(t), class: "grid"}));
    const lab = s("text", {x: L - 6, y: y(t) + 4, "text-anchor": "end"});
    lab.textContent = tickFmt(t);
    axes.appendChild(lab);
  }
  const xt = niceTicks(x0, x1, 6).filter(t => Number.isInteger(t) || !opts.intX);
  for (const t of xt) {
    axes.appendChild(s("line", {x1: x(t), x2: x(t), y1: H - B, y2: H - B + 4, class: "tick"}));
    const lab = s("text", {x: x(t), y: H - B + 16, "text-anchor": "middle"});
    lab.textContent = String(Math.round(t * 100) / 100);
    axes.appendChild(lab);
  }
  axes.appendChild(s("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis"}));
  axes.appendChild(s("line", {x1: L, x2: L, y1: T, y2: H - B, class: "axis"}));
  root.appendChild(axes);
  return {svg: root, x, y, W, H, L, R, T, B, x0, x1, y0, y1};
}

function legend(names) {
  return h("div", {class: "legend"}, names.map((n, i) => h("span", {class: "key"},
    h("span", {class: "swatch", style: `background:${PALETTE[i % PALETTE.length]}`}), n)));
}

function extent(values, fixed) {
  const v = values.filter(isNum);
  let lo = fixed && isNum(fixed[0]) ? fixed[0] : Math.min(...v);
  let hi = fixed && isNum(fixed[1]) ? fixed[1] : Math.max(...v);
  if (fixed && isNum(fixed[0])) lo = Math.min(lo, ...v);
  if (fixed && isNum(fixed[1])) hi = Math.max(hi, ...v);
  return [lo, hi];
}

/* lineChart({title, series: [{name, points: [[x, y|null], ...]}], yFmt, yRange, band}) */
function lineChart(o) {
  const series = (o.series || []).filter(se => se.points.some(p => isNum(p[1])));
  if (!series.length) return emptyChart(o.title);
  const xs = series.flatMap(se => se.points.map(p => p[0])).filter(isNum);
  const ys = series.flatMap(se => se.points.map(p => p[1]));
  if (o.band) ys.push(o.band.low, o.band.high);
  const f = frame([Math.min(...xs), Math.max(...xs)], extent(ys, o.yRange),
    {yFmt: o.yFmt, intX: true, height: o.height});
  if (o.band && isNum(o.band.low) && isNum(o.band.high)) {
    f.svg.appendChild(s("rect", {x: f.L, width: f.W - f.L - f.R, y: f.y(o.band.high),
      height: Math.max(0, f.y(o.band.low) - f.y(o.band.high)), class: "band"}));
  }
  series.forEach((se, i) => {
    const color = PALETTE[i % PALETTE.length];
    let d = "", pen = false;
    for (const [px, py] of se.points) {
      if (!isNum(py)) { pen = false; continue; }
      d += (pen ? "L" : "M") + f.x(px).toFixed(1) + " " + f.y(py).toFixed(1);
      pen = true;
    }
    f.svg.appendChild(s("path", {d, class: "line", stroke: color, "data-series": i}));
    for (const [px, py] of se.points) {
      if (isNum(py)) f.svg.appendChild(s("circle", {cx: f.x(px), cy: f.y(py), r: 2.5,
        fill: color, class: "dot"}));
    }
  });
  attachHover(f, series, o.yFmt || fmt);
  return h("div", {class: "chart"}, h("div", {class: "chart-title", text: o.title}), f.svg,
    legend(series.map(se => se.name)));
}

function attachHover(f, series, yFmt) {
  const cursor = s("line", {y1: f.T, y2: f.H - f.B, class: "cursor", visibility: "hidden"});
  f.svg.appendChild(cursor);
  const xs = [...new Set(series.flatMap(se => se.points.map(p => p[0])))].sort((a, b) => a - b);
  f.svg.addEventListener("mousemove", evt => {
    const r = f.svg.getBoundingClientRect();
    const px = (evt.clientX - r.left) * f.W / r.width;
    let best = xs[0];
    for (const v of xs) if (Math.abs(f.x(v) - px) < Math.abs(f.x(best) - px)) best = v;
    cursor.setAttribute("x1", f.x(best)); cursor.setAttribute("x2", f.x(best));
    cursor.setAttribute("visibility", "visible");
    const lines = ["round " + best];
    for (const se of series) {
      const p = se.points.find(q => q[0] === best);
      if (p && isNum(p[1])) lines.push(se.name + ": " + yFmt(p[1]));
    }
    showTip(evt, lines);
  });
  f.svg.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); hideTip(); });
}

/* Win rates of the round's environments as dots, the plateau band shaded, the median as a line. */
function distributionChart(o) {
  const rows = (o.rows || []).filter(r => (r.values || []).some(isNum));
  if (!rows.length) return emptyChart(o.title);
  const xs = rows.map(r => r.step);
  const f = frame([Math.min(...xs) - 0.5, Math.max(...xs) + 0.5], [0, 1],
    {yFmt: pct, intX: true});
  const band = o.band || {};
  if (isNum(band.low) && isNum(band.high)) {
    f.svg.appendChild(s("rect", {x: f.L, width: f.W - f.L - f.R, y: f.y(band.high),
      height: Math.max(0, f.y(band.low) - f.y(band.high)), class: "band"}));
  }
  const med = [];
  const colW = Math.max(2, (f.x(1) - f.x(0)) * 0.6);
  for (const r of rows) {
    const v = r.values.filter(isNum).sort((a, b) => a - b);
    v.forEach((w, i) => {
      const jitter = ((i * 0.6180339) % 1 - 0.5) * colW;
      const inBand = isNum(band.low) && w >= band.low && w <= band.high;
      f.svg.appendChild(s("circle", {cx: f.x(r.step) + jitter, cy: f.y(w), r: 2.2,
        class: inBand ? "pt in-band" : "pt"}));
    });
    med.push([r.step, v[Math.floor(v.length / 2)]]);
  }
  f.svg.appendChild(s("path", {d: med.map((p, i) => (i ? "L" : "M") + f.x(p[0]).toFixed(1) +
    " " + f.y(p[1]).toFixed(1)).join(""), class: "line", stroke: PALETTE[0]}));
  f.svg.addEventListener("mousemove", evt => {
    const r = f.svg.getBoundingClientRect();
    const px = (evt.clientX - r.left) * f.W / r.width;
    let best = rows[0];
    for (const row of rows) if (Math.abs(f.x(row.step) - px) < Math.abs(f.x(best.step) - px)) best = row;
    const v = best.values.filter(isNum);
    const inside = v.filter(w => w >= band.low && w <= band.high).length;
    showTip(evt, ["round " + best.step, v.length + " environments",
      "in plateau band: " + inside, "median: " + pct(med.find(m => m[0] === best.step)[1])]);
  });
  f.svg.addEventListener("mouseleave", hideTip);
  return h("div", {class: "chart"}, h("div", {class: "chart-title", text: o.title}), f.svg,
    h("div", {class: "legend"}, h("span", {class: "key"}, h("span", {class: "swatch band-swatch"}),
      "plateau band " + pct(band.low) + "–" + pct(band.high)),
    h("span", {class: "key"}, h("span", {class: "swatch", style: `background:${PALETTE[0]}`}),
      "median win rate")));
}

/* Stacked bars: rows = [{step, parts: {name: value}}]. */
function stackedBars(o) {
  const rows = (o.rows || []).filter(r => Object.values(r.parts || {}).some(isNum));
  if (!rows.length) return emptyChart(o.title);
  const names = [...new Set(rows.flatMap(r => Object.keys(r.parts)))];
  const totals = rows.map(r => names.reduce((a, n) => a + (isNum(r.parts[n]) ? r.parts[n] : 0), 0));
  const xs = rows.map(r => r.step);
  const f = frame([Math.min(...xs) - 0.5, Math.max(...xs) + 0.5], [0, Math.max(...totals)],
    {yFmt: o.yFmt, intX: true});
  const bw = Math.max(2, Math.min(30, (f.W - f.L - f.R) / (rows.length + 1) * 0.7));
  rows.forEach((r, ri) => {
    let acc = 0;
    names.forEach((n, i) => {
      const v = r.parts[n];
      if (!isNum(v) || v <= 0) return;
      const rect = s("rect", {x: f.x(r.step) - bw / 2, width: bw, y: f.y(acc + v),
        height: Math.max(0.5, f.y(acc) - f.y(acc + v)), fill: PALETTE[i % PALETTE.length],
        class: "bar"});
      rect.addEventListener("mousemove", evt => showTip(evt, ["round " + r.step,
        n + ": " + (o.yFmt || fmt)(v), "total: " + (o.yFmt || fmt)(totals[ri])]));
      rect.addEventListener("mouseleave", hideTip);
      f.svg.appendChild(rect);
      acc += v;
    });
  });
  return h("div", {class: "chart"}, h("div", {class: "chart-title", text: o.title}), f.svg,
    legend(names));
}

/* ---- Python highlighting: tokens -> spans (text set with textContent), one element per line */

const PY_KW = new Set(("False None True and as assert async await break class continue def del " +
  "elif else except finally for from global if import in is lambda nonlocal not or pass raise " +
  "return try while with yield match case").split(" "));
const PY_BI = new Set(("print len range int str float list dict set tuple bool min max sum abs " +
  "enumerate zip sorted reversed isinstance super self object any all map filter round open " +
  "type ValueError KeyError IndexError TypeError RuntimeError Exception NotImplementedError " +
  "staticmethod classmethod property").split(" "));
const PY_RULES = [
  ["com", /#[^\n]*/y],
  ["str", /[rRbBuUfF]{0,2}(?:'''[\s\S]*?(?:'''|$)|"""[\s\S]*?(?:"""|$)|'(?:[^'\\\n]|\\.)*'?|"(?:[^"\\\n]|\\.)*"?)/y],
  ["num", /(?:0[xXoObB][0-9a-fA-F_]+|\d[\d_]*\.?[\d_]*(?:[eE][+-]?\d+)?j?|\.\d[\d_]*(?:[eE][+-]?\d+)?j?)/y],
  ["dec", /@[A-Za-z_][\w.]*/y],
  ["name", /[A-Za-z_\u00c0-\uffff][\w\u00c0-\uffff]*/y],
  ["ws", /\s+/y],
  ["op", /[\s\S]/y],
];

function tokenizePython(src) {
  const out = [];
  let i = 0, prevKw = "";
  while (i < src.length) {
    for (const [kind, re] of PY_RULES) {
      re.lastIndex = i;
      const m = re.exec(src);
      if (!m || !m[0].length) continue;
      let cls = kind;
      if (kind === "name") {
        cls = PY_KW.has(m[0]) ? "kw" : PY_BI.has(m[0]) ? "bi" :
          prevKw === "def" ? "fn" : prevKw === "class" ? "cls" : null;
      } else if (kind === "ws" || kind === "op") cls = kind === "op" ? "op" : null;
      if (kind !== "ws") prevKw = kind === "name" ? m[0] : "";
      out.push([cls, m[0]]);
      i += m[0].length;
      break;
    }
  }
  return out;
}

function highlightPython(src) {
  const code = h("code", {class: "py"});
  let line = h("span", {class: "ln"});
  const flush = () => { code.appendChild(line); line = h("span", {class: "ln"}); };
  for (const [cls, text] of tokenizePython(String(src || ""))) {
    const parts = text.split("\n");
    parts.forEach((p, k) => {
      if (k > 0) flush();
      if (p) line.appendChild(cls ? h("span", {class: "t-" + cls, text: p}) : document.createTextNode(p));
    });
  }
  flush();
  return h("pre", {class: "code"}, code);
}
