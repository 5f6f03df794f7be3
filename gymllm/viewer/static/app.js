/* gymllm view: the page. Runs (config, summary, curves, live), Trajectories (paged table, one
   trajectory turn by turn with coloured tokens), Suites (tables, interval plots, comparisons).
   Every request goes to the server that served this page. */
"use strict";

const state = { runs: [], metrics: {}, offsets: {}, tab: "runs", colour: "logprob", live: null, tablePoll: null };

/* ------------------------------------------------------------------ small helpers */
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "on") for (const [ev, fn] of Object.entries(v)) e.addEventListener(ev, fn);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) if (kid !== null && kid !== undefined && kid !== false)
    e.appendChild(typeof kid === "string" || typeof kid === "number" ? document.createTextNode(String(kid)) : kid);
  return e;
}
const $ = sel => document.querySelector(sel);
const main = () => $("#main");
function fmt(v) { return typeof v === "number" ? Charts.fmt(v) : (v === null || v === undefined ? "" : String(v)); }
function showError(msg) { $("#errors").appendChild(h("div", { class: "error" }, msg)); }
function clearErrors() { $("#errors").textContent = ""; }
function setStatus(t) { $("#status").textContent = t; }

async function api(path) {
  let res;
  try { res = await fetch(path); } catch (e) { throw new Error(`request ${path} failed: ${e.message}`); }
  let body = null;
  try { body = await res.json(); } catch (e) { throw new Error(`request ${path}: HTTP ${res.status}, the reply is not JSON`); }
  if (!res.ok) throw new Error(body && body.error ? body.error : `request ${path}: HTTP ${res.status}`);
  return body;
}
function params() { return new URLSearchParams(location.search); }
function go(query, replace) {
  const url = "/?" + new URLSearchParams(Object.entries(query).filter(([, v]) => v !== undefined && v !== null && v !== "")).toString();
  (replace ? history.replaceState : history.pushState).call(history, null, "", url);
  route();
}

/* ------------------------------------------------------------------ routing */
async function route() {
  clearErrors();
  stopPolls();
  const p = params();
  const tab = p.get("trajectory") ? "trajectories" : (p.get("tab") || "runs");
  state.tab = tab;
  document.querySelectorAll("nav .tab").forEach(b => b.classList.toggle("active", b.dataset.tab === tab));
  try {
    if (p.get("trajectory")) await showTrajectory(p.get("run"), p.get("trajectory"));
    else if (tab === "trajectories") await showTable(p);
    else if (tab === "suites") await showSuites(p.get("run"));
    else await showRuns();
  } catch (e) {
    main().replaceChildren(h("div", { class: "error", id: "page-error" }, e.message));
  }
}
function stopPolls() {
  if (state.live) { clearInterval(state.live); state.live = null; }
  if (state.tablePoll) { clearTimeout(state.tablePoll); state.tablePoll = null; }
}

/* ------------------------------------------------------------------ runs */
const CURVES = [
  ["reward (all rollouts)", r => ({ "": r.rollout_reward_mean })],
  ["reward (trained groups)", r => ({ "": r.reward_mean })],
  ["success", r => Object.fromEntries(Object.entries(r).filter(([k]) => /^eval\/.*\/pass@1$/.test(k) || k === "success_rate")
    .map(([k, v]) => [k.replace(/^eval\//, "").replace(/\/pass@1$/, " pass@1"), v]))],
  ["games vs fixed opponents (win or draw)", r => Object.fromEntries(Object.entries(r).filter(([k]) => /^eval\/vs\/.*\/win_or_draw$/.test(k))
    .map(([k, v]) => [k.replace(/^eval\/vs\//, "vs ").replace(/\/win_or_draw$/, ""), v]))],
  ["games vs fixed opponents (mean reward)", r => Object.fromEntries(Object.entries(r).filter(([k]) => /^eval\/vs\/.*\/reward$/.test(k))
    .map(([k, v]) => [k.replace(/^eval\/vs\//, "vs ").replace(/\/reward$/, ""), v]))],
  ["loss", r => ({ "": r.loss })],
  ["KL", r => ({ "": r.kl })],
  ["staleness (versions)", r => ({ "": r.staleness_mean })],
  ["trainer idle", r => ({ "": r["pipeline/trainer_idle_fraction"] ?? r.trainer_idle_fraction })],
  ["engine idle", r => ({ "": r["pipeline/engine_idle_fraction"] ?? (r.engine_busy_fraction !== undefined ? 1 - r.engine_busy_fraction : undefined) })],
  ["tool calls per episode", r => ({ "": r.tool_calls_per_episode })],
  ["compile (s in the step)", r => ({ "": r.compile_s })],
];

async function loadMetrics(run) {
  const off = state.offsets[run] || 0;
  const m = await api(`/api/metrics?run=${encodeURIComponent(run)}&offset=${off}`);
  if (m.reset) state.metrics[run] = [];
  state.metrics[run] = (state.metrics[run] || []).concat(m.records);
  state.offsets[run] = m.offset;
  return m;
}

function drawCharts(container, runNames) {
  container.replaceChildren();
  for (const [title, pick] of CURVES) {
    const series = [];
    runNames.forEach((run, i) => {
      const bySeries = {};
      for (const r of state.metrics[run] || []) {
        const step = r.step;
        for (const [k, v] of Object.entries(pick(r))) {
          if (typeof v !== "number" || typeof step !== "number") continue;
          (bySeries[k] = bySeries[k] || []).push([step, v]);
        }
      }
      Object.entries(bySeries).forEach(([k, pts], j) => series.push({
        name: runNames.length > 1 || k ? [runNames.length > 1 ? run : "", k].filter(Boolean).join(" · ") : run,
        color: Charts.PALETTE[(i + j * runNames.length) % Charts.PALETTE.length], points: pts }));
    });
    const n = series.reduce((a, s) => a + s.points.length, 0);
    const box = h("div", { class: "chart", "data-chart": title, "data-points": n },
      h("h4", {}, title),
      Charts.line(series, { empty: "not logged by this run" }),
      h("div", { class: "legend" }, series.map(s => h("span", {}, h("i", { style: `background:${s.color}` }),
        `${s.name} (last ${fmt(s.points[s.points.length - 1][1])} at step ${s.points[s.points.length - 1][0]})`))));
    container.appendChild(box);
  }
}

async function showRuns() {
  state.runs = await api("/api/runs");
  const trainRuns = state.runs.filter(r => r.kind === "train").map(r => r.name);
  const selected = new Set(params().get("runs") ? params().get("runs").split(",") : trainRuns);
  const charts = h("div", { class: "charts", id: "charts" });
  const picker = h("div", { class: "legend" }, h("span", { class: "muted" }, "overlay:"), trainRuns.map(name =>
    h("label", {}, h("input", { type: "checkbox", checked: selected.has(name), on: { change: e => {
      e.target.checked ? selected.add(name) : selected.delete(name);
      drawCharts(charts, trainRuns.filter(n => selected.has(n)));
    } } }), " " + name)));
  const cards = state.runs.map(runCard);
  main().replaceChildren(h("section", { class: "card" }, h("h2", {}, "Curves"), picker, charts), ...cards);
  state.metrics = {}; state.offsets = {};
  for (const run of trainRuns) {
    const m = await loadMetrics(run);
    reportMetricProblems(run, m);
  }
  drawCharts(charts, trainRuns.filter(n => selected.has(n)));
  updateStepCounts(trainRuns);
  state.live = setInterval(async () => {  // live: only what was appended since the last poll
    let grew = false;
    for (const run of trainRuns) {
      try {
        const m = await loadMetrics(run);
        if (m.records.length || m.reset) grew = true;
        reportMetricProblems(run, m);
      } catch (e) { setStatus(`live update failed: ${e.message}`); }
    }
    if (grew) { drawCharts(charts, trainRuns.filter(n => selected.has(n))); updateStepCounts(trainRuns); }
    setStatus(`live · polled ${new Date().toLocaleTimeString()}`);
  }, 1500);
}
const seenProblems = new Set();
function reportMetricProblems(run, m) {
  for (const e of m.errors) { const key = run + e; if (!seenProblems.has(key)) { seenProblems.add(key); showError(`${run}: ${e}`); } }
  const t = document.querySelector(`[data-run="${CSS.escape(run)}"] .torn`);
  if (t) t.textContent = m.torn ? "metrics.jsonl ends in a half-written line (the run may be writing it)" : "";
}
function updateStepCounts(runs) {
  for (const run of runs) {
    const e = document.querySelector(`[data-run="${CSS.escape(run)}"] .steps`);
    const recs = state.metrics[run] || [];
    if (e) e.textContent = `${recs.length} metric records, last step ${recs.length ? recs[recs.length - 1].step : "-"}`;
  }
}
function compileLine(c) {  // compiles.jsonl's figures (gymllm.telemetry.compiles.summarize)
  const slow = c.slowest ? `; slowest ${c.slowest[0]} ${c.slowest[1].toFixed(1)} s` : "";
  return `compile: ${c.compile_s.toFixed(1)} s; ${c.programs} program compile(s) (${c.programs_distinct} distinct), ` +
    `${c.programs_loaded} loaded from the persistent cache; ${c.programs_all + c.loaded_all} compiles in all${slow}`;
}
function runCard(r) {
  const enc = encodeURIComponent(r.name);
  return h("section", { class: "card", "data-run": r.name },
    h("h2", {}, r.name, " ", h("span", { class: "muted" }, `(${r.kind})`)),
    h("div", { class: "note" }, r.path),
    r.errors.map(e => h("div", { class: "error" }, e)),
    r.kind === "train" ? h("div", { class: "steps note" }) : null,
    h("div", { class: "torn note" }),
    h("div", { class: "row" },
      r.trace ? h("a", { href: `/files/${enc}/${encodeURIComponent(r.trace)}`, class: "trace-link", target: "_blank" },
        `Trace: ${r.trace} (Chrome/Perfetto trace format; open it in the Perfetto UI)`) : h("span", { class: "muted" }, "no trace.json"),
      r.logs.length ? h("a", { href: `/?tab=trajectories&run=${enc}` }, `Trajectories (${r.logs.map(l => l.file).join(", ")})`) : null,
      r.suite ? h("a", { href: `/?tab=suites&run=${enc}` }, "Suite results") : null),
    r.compiles ? h("div", { class: "note compiles" }, compileLine(r.compiles)) : null,
    r.summary ? h("details", { open: true }, h("summary", {}, "summary.txt"), h("pre", {}, r.summary)) : null,
    r.config ? h("details", {}, h("summary", {}, "config.json"), h("pre", {}, JSON.stringify(r.config, null, 2))) : null,
    r.plots.length ? h("details", {}, h("summary", {}, `report plots (${r.plots.length})`),
      h("div", { class: "row plots" }, r.plots.map(p => h("img", { src: `/files/${enc}/${encodeURIComponent(p)}`, alt: p })))) : null);
}

/* ------------------------------------------------------------------ trajectory table */
const FILTERS = ["env", "seat", "reward_min", "reward_max", "step_min", "step_max", "version", "error", "text"];
async function showTable(p) {
  if (!state.runs.length) state.runs = await api("/api/runs");
  const withLogs = state.runs.filter(r => r.logs.length);
  if (!withLogs.length) { main().replaceChildren(h("div", { class: "card" }, "No trajectory log in these runs (trajectories.jsonl or a TrajectoryLogger log).")); return; }
  const run = p.get("run") && withLogs.some(r => r.name === p.get("run")) ? p.get("run") : withLogs[0].name;
  const page = +(p.get("page") || 0), size = +(p.get("size") || 50);
  const q = new URLSearchParams({ run, page, size });
  for (const f of FILTERS) if (p.get(f)) q.set(f, p.get(f));
  const data = await api(`/api/trajectories?${q}`);
  const field = (name, label, input) => h("label", {}, label, input);
  const sel = (name, opts) => h("select", { name }, h("option", { value: "" }, "any"),
    opts.map(o => h("option", { value: o[0], selected: String(p.get(name) || "") === String(o[0]) }, o[1])));
  const inp = (name, ph) => h("input", { name, placeholder: ph, value: p.get(name) || "", size: 6 });
  const form = h("form", { class: "filters", on: { submit: e => {
    e.preventDefault();
    const fd = new FormData(e.target), query = { tab: "trajectories", run: fd.get("run") };
    for (const f of FILTERS) if (fd.get(f)) query[f] = fd.get(f);
    go(query);
  } } },
    field("run", "run", h("select", { name: "run" }, withLogs.map(r => h("option", { value: r.name, selected: r.name === run }, r.name)))),
    field("env", "env", sel("env", data.facets.env.map(e => [e, e]))),
    field("seat", "seat", sel("seat", data.facets.seat.map(e => [e, e]))),
    field("reward_min", "reward ≥", inp("reward_min", "min")), field("reward_max", "reward ≤", inp("reward_max", "max")),
    field("step_min", "step ≥", inp("step_min", "min")), field("step_max", "step ≤", inp("step_max", "max")),
    field("version", "policy version", sel("version", data.facets.version.map(v => [v, v]))),
    field("error", "error", sel("error", [["true", "with error"], ["false", "without"]])),
    field("text", "id / task contains", inp("text", "text")),
    h("button", { class: "btn", type: "submit" }, "Apply"));
  const problems = [];
  for (const e of data.errors) problems.push(h("div", { class: "error log-error" }, e.message));
  if (data.error_count > data.errors.length) problems.push(h("div", { class: "error" }, `… ${data.error_count - data.errors.length} more unreadable lines`));
  for (const t of data.torn) problems.push(h("div", { class: "note torn" }, `${t} ends in a half-written line (the writer may still be running); it is left out until complete`));
  const first = page * size;
  const table = h("table", { id: "trajectory-table", "data-query": q.toString() },
    h("thead", {}, h("tr", {}, ["id", "step", "group", "task", "env", "seat", "reward", "versions", "tokens", "finish", "error"].map(c => h("th", {}, c)))),
    h("tbody", {}, data.rows.map(r => h("tr", { class: "link", "data-id": r.id, on: { click: () => go({ run, trajectory: r.id }) } },
      h("td", {}, h("a", { href: `/?run=${encodeURIComponent(run)}&trajectory=${encodeURIComponent(r.id)}`, on: { click: e => { e.preventDefault(); go({ run, trajectory: r.id }); } } }, r.id)),
      h("td", { class: "num" }, fmt(r.step)), h("td", {}, fmt(r.group)), h("td", {}, fmt(r.task)), h("td", {}, fmt(r.env)),
      h("td", {}, fmt(r.seat)), h("td", { class: "num" }, fmt(r.reward)), h("td", {}, (r.versions || []).join(", ")),
      h("td", { class: "num" }, fmt(r.tokens)), h("td", {}, fmt(r.finish)), h("td", { class: r.error ? "error-cell" : "" }, fmt(r.error))))));
  const pageQuery = k => { const o = Object.fromEntries(p.entries()); o.tab = "trajectories"; o.run = run; o.page = k; return o; };
  const pager = h("div", { class: "pager" },
    h("button", { class: "btn", disabled: page === 0, on: { click: () => go(pageQuery(page - 1)) } }, "‹ prev"),
    h("span", { id: "table-count" }, data.rows.length ? `rows ${first + 1}–${first + data.rows.length} of ${data.complete ? "" : "≥ "}${data.total}` : "no rows match",
      data.complete ? "" : " (indexing…)"),
    h("button", { class: "btn", disabled: first + data.rows.length >= data.total && data.complete, on: { click: () => go(pageQuery(page + 1)) } }, "next ›"));
  main().replaceChildren(h("section", { class: "card" }, h("h2", {}, `Trajectories · ${run}`),
    h("div", { class: "note" }, `logs: ${data.logs.join(", ")}`), form, problems, pager, table));
  if (!data.complete) state.tablePoll = setTimeout(() => route(), 1500);
}

/* ------------------------------------------------------------------ one trajectory */
function colourFor(mode, v) {
  if (v === null || v === undefined) return null;
  if (mode === "logprob") { // 0 (certain) green .. -6 and below red
    const t = Math.max(0, Math.min(1, -v / 6));
    return `hsl(${120 - 120 * t}, 70%, ${85 - 10 * t}%)`;
  }
  if (mode === "advantage") { // negative red, positive blue
    const t = Math.max(-1, Math.min(1, v / 2));
    return t >= 0 ? `hsl(215, 80%, ${92 - 30 * t}%)` : `hsl(0, 80%, ${92 + 30 * t}%)`;
  }
  const c = Charts.PALETTE[((v % Charts.PALETTE.length) + Charts.PALETTE.length) % Charts.PALETTE.length];
  return c + "55";
}
function legendFor(mode, tokens) {
  if (mode === "logprob") return h("span", {}, "logprob 0 ", h("span", { class: "swatch", style: "background:linear-gradient(90deg,hsl(120,70%,85%),hsl(0,70%,75%))" }), " ≤ −6");
  if (mode === "advantage") return h("span", {}, "advantage −2 ", h("span", { class: "swatch", style: "background:linear-gradient(90deg,hsl(0,80%,62%),#fff,hsl(215,80%,62%))" }), " +2");
  const vs = [...new Set((tokens.version || []).filter(v => v !== null))].sort((a, b) => a - b);
  return h("span", {}, "policy version: ", vs.map(v => h("span", { class: "tok", style: `background:${colourFor("version", v)};margin-right:6px` }, ` v${v} `)));
}
function tokenView(t) {
  const box = h("div", { class: "tokens", id: "tokens" });
  const mode = state.colour, values = t[mode];
  t.ids.forEach((id, i) => {
    const s = t.sampled[i];
    const v = values ? values[i] : null;
    const bg = s ? colourFor(mode, v) : null;
    const tip = [`token ${i}: id ${id}`, s ? "sampled" : "prompt / env"];
    for (const k of ["logprob", "version", "advantage"]) if (t[k] && t[k][i] !== null && t[k][i] !== undefined) tip.push(`${k} ${fmt(t[k][i])}`);
    box.appendChild(h("span", { class: "tok" + (s ? " sampled" : " prompt"), style: bg ? `background:${bg}` : null, title: tip.join(" · "),
      "data-i": i }, t.text[i]));
  });
  return box;
}
async function showTrajectory(run, id) {
  if (!run) throw new Error("a trajectory link needs ?run=<run dir name>&trajectory=<id>");
  const d = await api(`/api/trajectory?run=${encodeURIComponent(run)}&id=${encodeURIComponent(id)}`);
  const t = d.tokens;
  const modes = ["logprob", "advantage", "version"];
  if (!t[state.colour]) state.colour = modes.find(m => t[m]) || "logprob";
  const tokensSlot = h("div", {}), legendSlot = h("div", { class: "note" });
  const redraw = () => { tokensSlot.replaceChildren(tokenView(t)); legendSlot.replaceChildren(legendFor(state.colour, t)); };
  const switcher = h("div", { class: "switch" }, h("span", { class: "muted" }, "colour sampled tokens by: "), modes.map(m =>
    h("label", { title: t[m] ? "" : (d.notes.find(n => n.startsWith(m)) || `${m}: not in this log`) },
      h("input", { type: "radio", name: "colour", value: m, checked: state.colour === m, disabled: !t[m],
        on: { change: () => { state.colour = m; redraw(); } } }), ` ${m}${t[m] ? "" : " (not logged)"}`)));
  const aliases = new Set(["episode", "group_id", "task_id", "finish_reason", "num_tokens", "env_id", "return", "reward"]);
  const extra = Object.entries(d.meta).filter(([k]) => !(k in d.row) && !aliases.has(k));
  const meta = h("table", { class: "meta" }, h("tbody", {}, [...Object.entries(d.row), ...extra].map(([k, v]) =>
    h("tr", {}, h("td", {}, k), h("td", {}, typeof v === "object" && v !== null ? JSON.stringify(v) : fmt(v))))));
  const turns = d.turns.map(tn => h("div", { class: `turn ${tn.kind}` },
    h("div", { class: "kind" }, tn.kind + (tn.step !== undefined && tn.step !== null ? ` · step ${tn.step}` : "")),
    tn.kind === "reward"
      ? h("div", {}, `reward ${fmt(tn.reward)}`, tn.finish_reason ? ` · finish ${tn.finish_reason}` : "",
          tn.terminated ? " · terminated" : "", tn.truncated ? " · truncated" : "", tn.error ? h("span", { class: "error" }, ` error: ${tn.error}`) : "")
      : h("pre", {}, tn.text)));
  redraw();
  main().replaceChildren(
    h("div", { class: "pager" }, h("a", { href: `/?tab=trajectories&run=${encodeURIComponent(run)}` }, "‹ all trajectories of " + run)),
    h("section", { class: "card", id: "trajectory", "data-id": d.id }, h("h2", {}, `Trajectory ${d.id}`),
      h("div", { class: "note" }, `${d.run} · ${d.file} (${d.format})`), meta,
      d.notes.map(n => h("div", { class: "note" }, n))),
    h("section", { class: "card" }, h("h3", {}, "Turns"), turns),
    h("section", { class: "card" }, h("h3", {}, `Tokens (${t.ids.length})`), switcher, legendSlot, tokensSlot));
}

/* ------------------------------------------------------------------ suites */
function ci(v) { // [lo, hi] | [mean, lo, hi] | {mean, lo|low|lower, hi|high|upper}
  if (Array.isArray(v)) return v.length === 3 ? { mean: v[0], lo: v[1], hi: v[2] } : { lo: v[0], hi: v[1], mean: (v[0] + v[1]) / 2 };
  if (v && typeof v === "object") return { mean: v.mean ?? v.estimate ?? v.value, lo: v.lo ?? v.low ?? v.lower, hi: v.hi ?? v.high ?? v.upper };
  return typeof v === "number" ? { mean: v, lo: NaN, hi: NaN } : null;
}
function genericTable(rows, id) {
  const cols = [...new Set(rows.flatMap(r => Object.keys(r)))];
  const cell = v => typeof v === "object" && v !== null ? JSON.stringify(v) : fmt(v);
  return h("table", { id }, h("thead", {}, h("tr", {}, cols.map(c => h("th", {}, c)))),
    h("tbody", {}, rows.map(r => h("tr", {}, cols.map(c => h("td", { class: typeof r[c] === "number" ? "num" : "" }, cell(r[c])))))));
}
async function showSuites(runName) {
  if (!state.runs.length) state.runs = await api("/api/runs");
  const suites = state.runs.filter(r => r.suite);
  if (!suites.length) { main().replaceChildren(h("div", { class: "card" }, "No suite results here: pass a suite's summary.json or a `gymllm eval --out` file to gymllm view.")); return; }
  const sections = [];
  for (const r of suites.filter(s => !runName || s.name === runName)) {
    const s = await api(`/api/suite?run=${encodeURIComponent(r.name)}`);
    const sec = h("section", { class: "card suite", "data-run": r.name }, h("h2", {}, `${r.name} · ${s.file || ""}`));
    s.errors.forEach(e => sec.appendChild(h("div", { class: "error" }, e)));
    if (s.format === "eval_rows") {
      sec.appendChild(h("div", { class: "note" }, "gymllm eval output: one row per env"));
      sec.appendChild(genericTable(s.data, "eval-table"));
      const passKeys = [...new Set(s.data.flatMap(row => Object.keys(row).filter(k => /^pass@/.test(k))))];
      sec.appendChild(h("h3", {}, "pass@k and mean reward per env"));
      sec.appendChild(Charts.intervals(s.data.flatMap(row => ["mean_reward", ...passKeys].filter(k => typeof row[k] === "number")
        .map((k, j) => ({ label: `${row.env} ${k}`, mean: row[k], lo: NaN, hi: NaN, color: Charts.PALETTE[j % 8] })))));
    } else if (s.format === "suite") {
      const d = s.data;
      sec.appendChild(h("div", { class: "note" }, `suite ${typeof d.suite === "object" ? JSON.stringify(d.suite) : d.suite ?? ""} · policies ${(d.policies || []).map(p => typeof p === "object" ? (p.name ?? JSON.stringify(p)) : p).join(", ")}`));
      const flat = d.results.map(row => {
        const o = {};
        for (const [k, v] of Object.entries(row)) {
          if (k === "pass_at" && v && typeof v === "object") for (const [kk, vv] of Object.entries(v)) o[`pass@${kk}`] = typeof vv === "object" ? ci(vv).mean : vv;
          else if (k === "mean_reward_ci") { const c = ci(v); if (c) o.mean_reward = c.mean, o.ci = `[${fmt(c.lo)}, ${fmt(c.hi)}]`; }
          else o[k] = v;
        }
        return o;
      });
      sec.appendChild(h("h3", {}, "Results"));
      sec.appendChild(genericTable(flat, "suite-results"));
      const pols = [...new Set(d.results.map(x => x.policy))];
      sec.appendChild(h("h3", {}, "Mean reward with its interval"));
      sec.appendChild(Charts.intervals(d.results.filter(x => x.mean_reward_ci !== undefined).map(x => ({
        label: `${x.env ?? x.task ?? ""} · ${x.policy ?? ""}`, ...ci(x.mean_reward_ci), color: Charts.PALETTE[pols.indexOf(x.policy) % 8] }))));
      if ((d.comparisons || []).length) {
        sec.appendChild(h("h3", {}, "Paired comparisons"));
        sec.appendChild(genericTable(d.comparisons, "suite-comparisons"));
        const diffs = d.comparisons.map(c => ({ label: `${c.env ?? c.task ?? ""} ${c.a ?? c.policy_a ?? ""} − ${c.b ?? c.policy_b ?? ""}`,
          ...(ci(c.ci ?? c.diff_ci ?? c.interval) || {}), mean: c.diff ?? c.delta ?? c.mean_diff ?? (ci(c.ci ?? c.diff_ci) || {}).mean }));
        sec.appendChild(Charts.intervals(diffs, { symmetric: true }));
      }
    }
    sections.push(sec);
  }
  main().replaceChildren(...sections);
}

/* ------------------------------------------------------------------ start */
document.querySelectorAll("nav .tab").forEach(b => b.addEventListener("click", () => go({ tab: b.dataset.tab })));
window.addEventListener("popstate", route);
route();
