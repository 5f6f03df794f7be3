/* gymllm view: small SVG charts (line chart with several series, interval plot). No dependencies. */
"use strict";
const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#2f6fde", "#e8590c", "#12b76a", "#9e77ed", "#d92d20", "#0e9384", "#c11574", "#667085"];
  function el(tag, attrs, text) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fmt(v) {
    if (!isFinite(v)) return String(v);
    const a = Math.abs(v);
    if (a < 1e-12) return "0";
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(1);
    return +v.toFixed(a < 1 ? 3 : 2) + "";
  }
  function ticks(lo, hi, n) {
    if (hi === lo) return [lo];
    const out = [];
    for (let i = 0; i <= n; i++) out.push(lo + (hi - lo) * i / n);
    return out;
  }
  /* series: [{name, color, points: [[x, y], ...]}]; returns an <svg> */
  function line(series, opts) {
    const W = 360, H = 170, L = 44, R = 8, T = 8, B = 22;
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
    const pts = series.flatMap(s => s.points).filter(p => isFinite(p[0]) && isFinite(p[1]));
    if (!pts.length) {
      svg.appendChild(el("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, (opts && opts.empty) || "no data"));
      return svg;
    }
    let x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0]));
    let y0 = Math.min(...pts.map(p => p[1])), y1 = Math.max(...pts.map(p => p[1]));
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
    const sy = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
    for (const y of ticks(y0, y1, 4)) {
      svg.appendChild(el("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), class: "grid" }));
      svg.appendChild(el("text", { x: L - 4, y: sy(y) + 3, "text-anchor": "end" }, fmt(y)));
    }
    const integral = pts.every(p => Number.isInteger(p[0]));  // steps: whole-number ticks
    const xt = integral ? [...new Set(ticks(x0, x1, 4).map(Math.round))] : ticks(x0, x1, 4);
    for (const x of xt) {
      svg.appendChild(el("text", { x: sx(x), y: H - 6, "text-anchor": "middle" }, fmt(Math.round(x * 100) / 100)));
    }
    svg.appendChild(el("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
    svg.appendChild(el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
    series.forEach((s, i) => {
      const color = s.color || PALETTE[i % PALETTE.length];
      const p = s.points.filter(q => isFinite(q[0]) && isFinite(q[1]));
      if (!p.length) return;
      svg.appendChild(el("polyline", { points: p.map(q => `${sx(q[0])},${sy(q[1])}`).join(" "), fill: "none",
        stroke: color, "stroke-width": 1.6, "vector-effect": "non-scaling-stroke", "data-series": s.name }));
      if (p.length < 40) for (const q of p) svg.appendChild(el("circle", { cx: sx(q[0]), cy: sy(q[1]), r: 2, fill: color }));
    });
    return svg;
  }
  /* rows: [{label, mean, lo, hi, color}] -> horizontal interval plot */
  function intervals(rows, opts) {
    const W = 680, rowH = 20, L = 300, R = 30, T = 8, B = 22, H = T + B + rowH * rows.length;
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", style: `height:${H}px` });
    const vals = rows.flatMap(r => [r.lo, r.hi, r.mean]).filter(isFinite);
    let x0 = Math.min(0, ...vals), x1 = Math.max(1, ...vals);
    if (opts && opts.symmetric) { const m = Math.max(Math.abs(x0), Math.abs(x1)); x0 = -m; x1 = m; }
    const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
    for (const x of ticks(x0, x1, 4)) {
      svg.appendChild(el("line", { x1: sx(x), x2: sx(x), y1: T, y2: H - B, class: "grid" }));
      svg.appendChild(el("text", { x: sx(x), y: H - 6, "text-anchor": "middle" }, fmt(x)));
    }
    rows.forEach((r, i) => {
      const y = T + rowH * i + rowH / 2, c = r.color || PALETTE[i % PALETTE.length];
      svg.appendChild(el("text", { x: L - 6, y: y + 3, "text-anchor": "end" }, r.label.replace(/^gymllm\//, "")));
      if (isFinite(r.lo) && isFinite(r.hi)) svg.appendChild(el("line", { x1: sx(r.lo), x2: sx(r.hi), y1: y, y2: y, stroke: c, "stroke-width": 2 }));
      if (isFinite(r.mean)) svg.appendChild(el("circle", { cx: sx(r.mean), cy: y, r: 3.5, fill: c, "data-interval": r.label }));
    });
    return svg;
  }
  return { line, intervals, PALETTE, fmt };
})();
