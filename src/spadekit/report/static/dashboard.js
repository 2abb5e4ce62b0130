/* spadekit dashboard, part 2: the application (overview, environments, rejected, curriculum).
 *
 * Two modes. Report file: the page embeds a bundle (snapshot + details + episodes) as JSON in
 * the script element "data" (type application/json). Live (spadekit serve): the embedded object is
 * {"live": true, "poll_ms": N}; the page fetches /api/snapshot every N ms, /api/env/<sha> and
 * /api/episode/<id>, and re-renders without losing filters, sort, open panels or tabs.
 * All run-derived text goes through textContent (helpers in charts.js). */
"use strict";

const BOOT = JSON.parse(document.getElementById("data").textContent || "{}");
const LIVE = !BOOT.format;
const S = {
  snap: null, tab: "overview", openSha: null, openEpisode: null, metric: "",
  filters: {q: "", skill: "", status: "", origin: "", from: "", to: ""},
  sort: {key: "created_step", dir: -1}, openReasons: new Set(), sigs: {},
  detailCache: new Map(), episodeCache: new Map(), serverHits: null, polls: 0,
};
const $ = id => document.getElementById(id);

/* ---- data access ----------------------------------------------------------------------- */

async function getJSON(url) {
  const r = await fetch(url, {headers: {Accept: "application/json"}, cache: "no-store"});
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || ("HTTP " + r.status));
  return body;
}

const API = LIVE ? {
  snapshot: () => getJSON("/api/snapshot"),
  env: sha => getJSON("/api/env/" + encodeURIComponent(sha)),
  episode: id => getJSON("/api/episode/" + encodeURIComponent(id)),
  search: q => getJSON("/api/search?q=" + encodeURIComponent(q)),
} : {
  snapshot: async () => BOOT,
  env: async sha => {
    const d = (BOOT.details || {})[sha];
    if (!d) throw new Error("details of this environment are not included in this report");
    return d;
  },
  episode: async id => {
    const e = (BOOT.episodes || {})[String(id)];
    if (!e) throw new Error("this episode is not included in this report (report --max-episodes)");
    return e;
  },
  search: null,
};

async function cached(map, key, fn) {
  if (!map.has(key)) map.set(key, fn(key).catch(e => { map.delete(key); throw e; }));
  return map.get(key);
}
const loadEnv = sha => cached(S.detailCache, sha, API.env);
const loadEpisode = id => cached(S.episodeCache, String(id), API.episode);

/* ---- small view helpers ---------------------------------------------------------------- */

function section(title, ...kids) { return h("section", {class: "card"}, h("h2", {text: title}), kids); }
function note(text, cls) { return h("div", {class: "note " + (cls || ""), text}); }
function stat(label, value) { return h("div", {class: "stat"}, h("div", {class: "v", text: value}), h("div", {class: "k", text: label})); }
function badge(text, cls) { return text === null || text === undefined || text === "" ? null : h("span", {class: "badge " + (cls || ""), text: String(text)}); }
function envBySha(sha) { return (S.snap.environments || []).find(e => e.sha === sha); }
function short(sha) { return String(sha || "").slice(0, 10); }
function envLink(sha, label) {
  return h("button", {class: "link", "data-sha": sha, onclick: () => openEnv(sha), text: label || short(sha)});
}

/* Any JSON value as a readable tree (validation reports, lineage, meta). */
function tree(v, depth) {
  depth = depth || 0;
  if (v === null || v === undefined) return h("span", {class: "muted", text: "–"});
  if (typeof v !== "object") {
    const str = typeof v === "number" ? fmt(v) : String(v);
    return str.includes("\n") ? h("pre", {class: "text", text: str}) : h("span", {text: str});
  }
  if (Array.isArray(v)) {
    if (!v.length) return h("span", {class: "muted", text: "[]"});
    return h("ol", {class: "tree"}, v.slice(0, 200).map(x => h("li", {}, tree(x, depth + 1))));
  }
  const keys = Object.keys(v);
  if (!keys.length) return h("span", {class: "muted", text: "{}"});
  return h("dl", {class: "tree"}, keys.flatMap(k => [h("dt", {text: k}), h("dd", {}, tree(v[k], depth + 1))]));
}

/* ---- header and tabs ------------------------------------------------------------------- */

const TABS = [["overview", "Overview"], ["envs", "Environments"], ["rejected", "Rejected"],
  ["curriculum", "Curriculum"]];

function renderShell() {
  $("tabs").replaceChildren(...TABS.map(([id, label]) => h("button", {
    class: "tab", "data-tab": id, onclick: () => showTab(id), text: label})));
  $("main").replaceChildren(...TABS.map(([id]) => h("div", {id: "tab-" + id, class: "tab-body"})));
  buildEnvControls();
  showTab(S.tab);
}

function showTab(id) {
  S.tab = id;
  for (const [t] of TABS) {
    $("tab-" + t).hidden = t !== id;
    document.querySelector(`.tab[data-tab="${t}"]`).classList.toggle("active", t === id);
  }
}

function renderHeader(snap) {
  const run = snap.run || {};
  $("title").textContent = "spadekit · " + (run.name || "run");
  document.title = "spadekit · " + (run.name || "run");
  const bits = [["model", run.model], ["setting", run.setting], ["curriculum", run.curriculum],
    ["rounds", run.rounds_completed], ["latest round", run.latest_step],
    ["environments", (snap.environments || []).length]];
  $("meta").replaceChildren(...bits.map(([k, v]) => h("span", {class: "meta-item"},
    h("span", {class: "k", text: k + " "}), h("span", {class: "v", id: "run-" + k.replace(" ", "-"), text: v ?? "–"}))));
  $("status").textContent = LIVE ? "live · updated " + new Date().toLocaleTimeString() :
    "report · generated " + (snap.generated_at || "");
  const warns = snap.warnings || [];
  $("warnings").replaceChildren(...warns.map(w => note(typeof w === "string" ? w : JSON.stringify(w), "warn")));
}

/* ---- overview ---------------------------------------------------------------------------- */

function metricSeries(snap, name) { return (snap.rounds || []).map(r => [r.step, (r.metrics || {})[name] ?? null]); }
function named(snap, names) { return names.map(([n, label]) => ({name: label || n, points: metricSeries(snap, n)})); }

function renderOverview(snap) {
  const box = $("tab-overview");
  const rounds = snap.rounds || [];
  if (!rounds.length) {
    box.replaceChildren(section("Overview", note("no data yet: the run has no completed round")));
    return;
  }
  const last = rounds[rounds.length - 1].metrics || {};
  const tiles = h("div", {class: "tiles"}, stat("agent return", fmt(last.agent_mean_return)),
    stat("agent win rate", pct(last.agent_win_rate)), stat("designer reward", fmt(last.designer_reward)),
    stat("regret", fmt(last.regret)), stat("valid share", pct(last.valid_share)),
    stat("rejected programs", String((snap.rejected || {}).total ?? 0)));
  const tps = rounds.map(r => {
    const play = (r.timings || {}).play, tok = (r.metrics || {}).sampled_tokens;
    return [r.step, isNum(play) && play > 0 && isNum(tok) ? tok / play : null];
  });
  const cx = snap.complexity || [];
  const evalNames = (snap.metric_names || []).filter(n => /^eval\/[^/]+\/win_rate$/.test(n));
  const grid = h("div", {class: "grid"},
    lineChart({title: "Returns and rewards", series: named(snap, [["agent_mean_return", "agent return"],
      ["designer_reward", "designer reward"], ["regret", "regret"]])}),
    lineChart({title: "Win rate and valid share", yFmt: pct, yRange: [0, 1],
      series: named(snap, [["agent_win_rate", "agent win rate"], ["valid_share", "valid share"]])}),
    distributionChart({title: "Win rate (mean return) per environment vs plateau band", rows: snap.win_rates, band: snap.plateau}),
    lineChart({title: "Complexity: turns used", series: [{name: "mean turns", points: cx.map(c => [c.step, c.mean_turns])}]}),
    lineChart({title: "Complexity: code size (lines)", series: [{name: "mean code lines", points: cx.map(c => [c.step, c.mean_code_lines])}]}),
    lineChart({title: "Throughput (tokens/s)", series: [{name: "train tokens/s", points: metricSeries(snap, "train/tokens_per_second")},
      {name: "sampled tokens / play s", points: tps}]}),
    stackedBars({title: "Phase timings (s)", rows: rounds.map(r => ({step: r.step, parts: r.timings || {}}))}),
    ...ledgerCharts(snap),
    evalNames.length ? lineChart({title: "Evaluation win rate", yFmt: pct, yRange: [0, 1],
      series: evalNames.map(n => ({name: n.split("/")[1], points: metricSeries(snap, n)}))}) : null,
    metricPicker(snap));
  const skills = Object.entries(snap.skills || {});
  const multiples = h("div", {class: "grid small"}, skills.map(([skill, rows]) => lineChart({
    title: skill, height: 170, series: [{name: "mean return", points: rows.map(r => [r.step, r.mean_return])},
      {name: "win rate", points: rows.map(r => [r.step, r.win_rate])},
      {name: "regret", points: rows.map(r => [r.step, r.mean_regret])},
      {name: "designer reward", points: rows.map(r => [r.step, r.mean_designer_reward])}]})));
  box.replaceChildren(...[tiles, section("Curves over rounds", grid),
    section("Per skill", skills.length ? multiples : note("no data yet")), renderEvals(snap)].filter(Boolean));
}

/* Asynchronous rollouts (rollout.max_staleness): how stale the trained batches were, and the
 * token ledger (generated = trained + discarded + in flight, cumulative at each commit). */
function ledgerCharts(snap) {
  const rounds = snap.rounds || [];
  const charts = [];
  if (rounds.some(r => isNum((r.metrics || {})["async/tokens_generated"]))) {
    charts.push(lineChart({title: "Token ledger (loss tokens, cumulative)", series: named(snap, [
      ["async/tokens_generated", "generated"], ["async/tokens_trained", "trained"],
      ["async/tokens_discarded", "discarded (stale)"], ["async/tokens_in_flight", "in flight"]])}));
  }
  if (rounds.some(r => isNum((r.metrics || {})["async/staleness_max"]))) {
    charts.push(lineChart({title: "Staleness of trained batches (policy versions)", series: named(snap, [
      ["async/staleness_max", "max"], ["async/staleness_mean", "mean"],
      ["async/in_flight_mean", "in flight"], ["async/waiting_mean", "waiting"],
      ["async/lag_mean", "engine lag"], ["async/cancelled_batches", "cancelled batches"]])}));
  }
  return charts;
}

function metricPicker(snap) {
  const names = snap.metric_names || [];
  if (!names.includes(S.metric)) S.metric = names[0] || "";
  const holder = h("div", {});
  const draw = () => holder.replaceChildren(lineChart({title: S.metric || "metric",
    series: [{name: S.metric, points: metricSeries(snap, S.metric)}]}));
  const sel = h("select", {class: "metric-select", onchange: e => { S.metric = e.target.value; draw(); }},
    names.map(n => h("option", {value: n, text: n})));
  sel.value = S.metric;
  draw();
  return h("div", {class: "picker"}, h("label", {}, "any metric: ", sel), holder);
}

function renderEvals(snap) {
  const evals = snap.evals || [];
  if (!evals.length) return null;
  return section("Evaluations", evals.map(ev => h("details", {class: "eval"},
    h("summary", {text: "round " + ev.step + " · " + (ev.file || "")}), tree(ev.suites))));
}

/* ---- environment browser ------------------------------------------------------------------ */

const COLS = [["short", "sha"], ["skill", "skill"], ["status", "status"], ["class_name", "class"],
  ["created_step", "created"], ["origin", "origin"], ["n_plays", "plays"], ["win_rate", "win (mean ret.)"],
  ["win_rate_with_hint", "win+hint"], ["regret", "regret"], ["designer_reward", "d.reward"],
  ["mean_return", "return"], ["mean_turns", "turns"], ["code_lines", "lines"]];
const PCT_COLS = new Set(["win_rate", "win_rate_with_hint"]);

function buildEnvControls() {
  const f = S.filters;
  const input = (key, attrs) => h("input", Object.assign({value: f[key], "data-filter": key,
    oninput: e => { f[key] = e.target.value; if (key === "q") scheduleSearch(); renderEnvTable(); }}, attrs));
  const select = key => h("select", {"data-filter": key, onchange: e => { f[key] = e.target.value; renderEnvTable(); }});
  $("tab-envs").replaceChildren(
    h("div", {class: "controls"}, input("q", {type: "search", id: "env-search", placeholder: "search code, hint, sha, class"}),
      h("label", {}, "skill ", select("skill")), h("label", {}, "status ", select("status")),
      h("label", {}, "origin ", select("origin")),
      h("label", {}, "created round ", input("from", {type: "number", min: 0, class: "num"}),
        " – ", input("to", {type: "number", min: 0, class: "num"}))),
    h("div", {id: "env-count", class: "muted"}),
    h("div", {class: "table-wrap"}, h("table", {id: "env-table", class: "data"},
      h("thead", {}, h("tr", {}, COLS.map(([k, label]) => h("th", {"data-key": k, onclick: () => sortBy(k), text: label})))),
      h("tbody", {}))),
    h("div", {id: "env-detail"}));
}

function syncOptions(key, values) {
  const sel = document.querySelector(`select[data-filter="${key}"]`);
  const opts = ["", ...[...new Set(values.filter(v => v !== null && v !== undefined && v !== ""))].sort()];
  if (sel.options.length !== opts.length || [...sel.options].some((o, i) => o.value !== String(opts[i]))) {
    sel.replaceChildren(...opts.map(v => h("option", {value: v, text: v === "" ? "all" : v})));
  }
  sel.value = S.filters[key];
  if (sel.value !== S.filters[key]) S.filters[key] = sel.value;
}

function sortBy(key) {
  S.sort = S.sort.key === key ? {key, dir: -S.sort.dir} : {key, dir: -1};
  renderEnvTable();
}

let searchTimer = null;
function scheduleSearch() {
  if (!API.search) return;
  clearTimeout(searchTimer);
  const q = S.filters.q.trim();
  S.serverHits = null;
  if (q.length < 2) return;
  searchTimer = setTimeout(async () => {
    try {
      const r = await API.search(q);
      if (S.filters.q.trim() === q) { S.serverHits = new Set(r.shas || []); renderEnvTable(); }
    } catch (e) { S.serverHits = null; }
  }, 250);
}

function matches(e) {
  const f = S.filters;
  if (f.skill && e.skill !== f.skill) return false;
  if (f.status && e.status !== f.status) return false;
  if (f.origin && e.origin !== f.origin) return false;
  if (f.from !== "" && !(e.created_step >= Number(f.from))) return false;
  if (f.to !== "" && !(e.created_step <= Number(f.to))) return false;
  const q = f.q.trim().toLowerCase();
  if (!q) return true;
  const hay = [e.sha, e.class_name, e.skill, e.source, e.origin].map(x => String(x ?? "").toLowerCase());
  if (hay.some(x => x.includes(q))) return true;
  const d = LIVE ? null : (BOOT.details || {})[e.sha];
  if (d && d.env && [d.env.code, d.env.hint].some(x => String(x ?? "").toLowerCase().includes(q))) return true;
  return !!(S.serverHits && S.serverHits.has(e.sha));
}

function renderEnvTable() {
  const envs = (S.snap && S.snap.environments) || [];
  for (const k of ["skill", "status", "origin"]) syncOptions(k, envs.map(e => e[k]));
  const {key, dir} = S.sort;
  const rows = envs.filter(matches).sort((a, b) => {
    const x = a[key], y = b[key];
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * dir;
  });
  const shown = rows.slice(0, 400);
  $("env-count").textContent = envs.length ? `${rows.length} of ${envs.length} environments` +
    (shown.length < rows.length ? ` (first ${shown.length} shown; refine the filters)` : "") : "no environments yet";
  for (const th of document.querySelectorAll("#env-table th")) {
    th.classList.toggle("sorted", th.dataset.key === key);
    th.dataset.dir = th.dataset.key === key ? (dir > 0 ? "asc" : "desc") : "";
  }
  document.querySelector("#env-table tbody").replaceChildren(...shown.map(e => h("tr", {
    class: "env-row" + (e.sha === S.openSha ? " open" : ""), "data-sha": e.sha, onclick: () => openEnv(e.sha)},
  COLS.map(([k]) => h("td", {class: k, text: PCT_COLS.has(k) ? pct(e[k]) : typeof e[k] === "number" ? fmt(e[k]) : (e[k] ?? "–")})))));
}

async function openEnv(sha, keepEpisode) {
  if (S.tab !== "envs") showTab("envs");
  if (S.openSha !== sha) S.openEpisode = null;
  S.openSha = sha;
  for (const tr of document.querySelectorAll("#env-table tr.env-row")) tr.classList.toggle("open", tr.dataset.sha === sha);
  const box = $("env-detail");
  box.replaceChildren(note("loading " + short(sha) + " …"));
  let d;
  try { d = await loadEnv(sha); } catch (e) {
    const summary = envBySha(sha);
    box.replaceChildren(section("Environment " + short(sha), note(e.message, "warn"), summary ? tree(summary) : null));
    return;
  }
  if (S.openSha !== sha) return;
  box.replaceChildren(renderDetail(d));
  if (!keepEpisode) box.scrollIntoView({block: "start"});
  const eps = d.episodes || [];
  const want = S.openEpisode ?? (eps[0] && eps[0].id);
  if (want !== undefined && want !== null) openEpisode(want);
}

function renderDetail(d) {
  const e = d.env || {};
  const stats = h("div", {class: "tiles"}, stat("win rate", pct(e.win_rate)), stat("with hint", pct(e.win_rate_with_hint)),
    stat("regret", fmt(e.regret)), stat("designer reward", fmt(e.designer_reward)), stat("mean return", fmt(e.mean_return)),
    stat("plays (with hint)", (e.n_plays ?? "–") + " (" + (e.n_plays_with_hint ?? "–") + ")"),
    stat("mean turns", fmt(e.mean_turns)), stat("created / retired", (e.created_step ?? "–") + " / " + (e.retired_step ?? "–")));
  const parents = (e.parents || []).map(p => h("li", {}, p.in_run ? envLink(p.sha, p.short || short(p.sha)) :
    h("span", {class: "mono", text: p.short || short(p.sha)}), " ", badge(p.skill), p.in_run ? null : badge("not in run", "muted")));
  const episodes = h("table", {class: "data episodes"}, h("thead", {}, h("tr", {},
    ["episode", "round", "hint", "return", "turns", "stop", "failure"].map(t => h("th", {text: t})))),
  h("tbody", {}, (d.episodes || []).map(ep => h("tr", {class: "ep-row", "data-episode": ep.id, onclick: () => openEpisode(ep.id)},
    h("td", {text: "#" + ep.id}), h("td", {text: ep.step}), h("td", {text: ep.with_hint ? "with hint" : "no hint"}),
    h("td", {text: fmt(ep.return)}), h("td", {text: ep.turns ?? "–"}), h("td", {text: ep.stop_reason ?? ""}),
    h("td", {text: ep.failure ?? ""})))));
  return h("div", {class: "detail", "data-sha": e.sha},
    h("div", {class: "detail-head"}, h("h2", {text: "Environment " + (e.short || short(e.sha))}),
      h("span", {class: "mono", text: e.class_name || ""}), badge(e.skill), badge(e.status, "st-" + e.status),
      badge(e.origin), e.blacklisted ? badge("blacklisted", "bad") : null,
      h("button", {class: "close", onclick: closeEnv, text: "close"})),
    stats,
    h("div", {class: "cols"},
      h("div", {class: "col"}, h("h3", {text: "Code"}), h("div", {id: "env-code"}, highlightPython(e.code))),
      h("div", {class: "col"}, h("h3", {text: "Hint"}),
        e.hint ? h("pre", {class: "text hint", id: "env-hint", text: e.hint}) : note("no hint"),
        h("h3", {text: "Lineage"}), parents.length ? h("ul", {class: "parents"}, parents) : note("no parents (seeded from scratch or library)"),
        e.lineage && Object.keys(e.lineage).length ? tree(e.lineage) : null,
        h("h3", {text: "Validation report"}), h("div", {class: "validation"}, tree(e.validation)),
        h("details", {}, h("summary", {text: "meta"}), tree(e.meta)))),
    h("h3", {text: "Sample episodes"}), (d.episodes || []).length ? episodes : note("no recorded episodes"),
    h("div", {id: "episode-view"}));
}

function closeEnv() { S.openSha = null; S.openEpisode = null; $("env-detail").replaceChildren(); renderEnvTable(); }

async function openEpisode(id) {
  S.openEpisode = id;
  for (const tr of document.querySelectorAll("tr.ep-row")) tr.classList.toggle("open", String(tr.dataset.episode) === String(id));
  const view = $("episode-view");
  if (!view) return;
  view.replaceChildren(note("loading episode #" + id + " …"));
  try {
    const ep = await loadEpisode(id);
    if (String(S.openEpisode) === String(id)) view.replaceChildren(transcript(ep));
  } catch (e) { view.replaceChildren(note(e.message, "warn")); }
}

/* An episode as chat bubbles; each assistant turn carries the step's reward. */
function transcript(ep) {
  const turns = ep.turns || [];
  const bubbles = [];
  let k = 0;
  for (const m of ep.messages || []) {
    const role = String(m.role || "user");
    const b = h("div", {class: "bubble role-" + role.replace(/[^a-z]/g, "")}, h("div", {class: "role", text: role}),
      h("div", {class: "content", text: typeof m.content === "string" ? m.content : JSON.stringify(m.content)}));
    if (role === "assistant" && turns[k]) {
      const t = turns[k++];
      b.appendChild(h("div", {class: "turn-info", text: "turn " + t.idx + " · reward " + fmt(t.reward) +
        (t.terminated ? " · terminated" : "") + (t.truncated ? " · truncated" : "")}));
    }
    bubbles.push(b);
  }
  if (!bubbles.length) {
    for (const t of turns) {
      bubbles.push(h("div", {class: "bubble role-assistant"}, h("div", {class: "role", text: "action " + t.idx}),
        h("div", {class: "content", text: t.action ?? ""}), h("div", {class: "turn-info", text: "reward " + fmt(t.reward)})));
      bubbles.push(h("div", {class: "bubble role-user"}, h("div", {class: "role", text: "observation"}), h("div", {class: "content", text: t.observation ?? ""})));
    }
  }
  return h("div", {class: "transcript", "data-episode": ep.id},
    h("div", {class: "transcript-head"}, h("strong", {text: "Episode #" + ep.id}), " round " + ep.step + " · ",
      badge(ep.with_hint ? "with hint" : "no hint", ep.with_hint ? "hint" : ""), " return " + fmt(ep.return) +
      (ep.stop_reason ? " · " + ep.stop_reason : "")),
    ep.failure ? note("failure: " + ep.failure, "warn") : null,
    ep.with_hint && ep.hint ? h("div", {class: "hint-box"}, h("span", {class: "role", text: "hint"}), h("pre", {class: "text", text: ep.hint})) : null,
    bubbles.length ? bubbles : note("no messages recorded"));
}

/* ---- rejected, curriculum ----------------------------------------------------------------- */

function renderRejected(snap) {
  const rej = snap.rejected || {total: 0, by_reason: []};
  const groups = (rej.by_reason || []).map(g => {
    const key = g.reason + "|" + g.stage;
    const det = h("details", {class: "reason", "data-reason": g.reason, open: S.openReasons.has(key) ? "" : null,
      ontoggle: e => { e.target.open ? S.openReasons.add(key) : S.openReasons.delete(key); }},
    h("summary", {}, h("strong", {text: g.reason}), " ", badge(g.stage), " ", h("span", {class: "count", text: "× " + g.count})),
    (g.examples || []).map(x => h("div", {class: "example"},
      h("div", {class: "muted"}, "round " + (x.step ?? "–") + " · " + (x.skill ?? "") + (x.sha ? " · " + short(x.sha) : "")),
      x.message ? h("pre", {class: "text msg", text: x.message}) : null,
      x.text ? h("details", {}, h("summary", {text: "designer output (" + String(x.text).length + " chars)"}),
        h("pre", {class: "text", text: String(x.text).slice(0, 20000)})) : null)));
    return det;
  });
  $("tab-rejected").replaceChildren(section("Rejected programs: " + (rej.total || 0),
    groups.length ? groups : note("no rejected programs")));
}

function envCard(sha) {
  const e = envBySha(sha) || {sha};
  const d = LIVE ? null : (BOOT.details || {})[sha];
  const code = d && d.env && d.env.code ? String(d.env.code).split("\n").filter(l => l.trim()).slice(0, 8).join("\n") : null;
  return h("div", {class: "env-card", "data-sha": sha, onclick: () => openEnv(sha)},
    h("div", {}, h("span", {class: "mono", text: e.short || short(sha)}), " ", badge(e.skill)),
    h("div", {class: "mono small", text: e.class_name || ""}),
    h("div", {class: "small", text: "win " + pct(e.win_rate) + " · hint " + pct(e.win_rate_with_hint) + " · " + (e.code_lines ?? "–") + " lines"}),
    code ? h("pre", {class: "code mini", text: code}) : null);
}

function renderCurriculum(snap) {
  const tl = snap.timeline || [];
  const timeline = tl.length ? h("div", {class: "timeline"}, tl.map(b => h("div", {class: "bucket"},
    h("div", {class: "bucket-head", text: (isNum(b.last_step) && b.last_step !== b.step ? "rounds " + b.step + "–" + b.last_step : "round " + b.step)}), (b.envs || []).map(envCard)))) : note("no data yet");
  const effects = (snap.hint_effects || []).slice(0, 6).map(x => {
    const pane = (id, label) => {
      const holder = h("div", {class: "pane"}, h("h4", {text: label}), note(id === null || id === undefined ? "no episode recorded" : "loading …"));
      if (id !== null && id !== undefined) {
        loadEpisode(id).then(ep => holder.replaceChildren(h("h4", {text: label}), transcript(ep)),
          err => holder.replaceChildren(h("h4", {text: label}), note(err.message, "warn")));
      }
      return holder;
    };
    return h("div", {class: "effect"}, h("div", {class: "effect-head"}, envLink(x.sha), " ", badge(x.skill),
      " regret " + fmt(x.regret) + " · win " + pct(x.win_rate) + " → " + pct(x.win_rate_with_hint) + " with hint"),
    h("div", {class: "side"}, pane(x.episode_without, "without hint"), pane(x.episode_with, "with hint")));
  });
  $("tab-curriculum").replaceChildren(section("Curriculum timeline", timeline),
    section("Hint effect (largest regret)", effects.length ? effects : note("no data yet")));
}

/* ---- refresh loop -------------------------------------------------------------------------- */

function changed(key, value) {
  const sig = JSON.stringify(value);
  if (S.sigs[key] === sig) return false;
  S.sigs[key] = sig;
  return true;
}

function render(snap) {
  S.snap = snap;
  renderHeader(snap);
  if (changed("overview", [snap.rounds, snap.skills, snap.win_rates, snap.complexity, snap.evals, snap.rejected && snap.rejected.total])) renderOverview(snap);
  if (changed("envs", snap.environments)) { if (LIVE) S.detailCache.clear(); renderEnvTable(); }
  if (changed("rejected", snap.rejected)) renderRejected(snap);
  if (changed("curriculum", [snap.timeline, snap.hint_effects, snap.environments])) renderCurriculum(snap);
  document.body.dataset.rounds = String((snap.rounds || []).length);
  document.body.dataset.ready = "1";
}

async function poll() {
  const ms = Math.max(200, Number(new URLSearchParams(location.search).get("poll")) || BOOT.poll_ms || 3000);
  try {
    const snap = await API.snapshot();
    S.polls++;
    render(snap);
    document.body.dataset.polls = String(S.polls);
  } catch (e) {
    $("status").textContent = "live · cannot reach the server (" + e.message + "), retrying";
  }
  setTimeout(poll, ms);
}

renderShell();
if (LIVE) poll(); else render(BOOT);
