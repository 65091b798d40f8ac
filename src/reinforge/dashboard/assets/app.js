// reinforge dashboard: one script, no build step. Pages are hash routes (#/run, #/rollouts,
// #/rollout/<id>, #/runners); data comes from the store server's /dashboard/api routes with the store
// token, live updates from its event stream. Everything that shows text uses textContent (never
// innerHTML), so nothing an agent wrote can run as markup.
"use strict";

const base = location.pathname.replace(/\/dashboard\/?$/, "");
const TOKEN_KEY = "reinforge-store-token";
const state = {
  token: "",
  records: [],          // metrics.jsonl records, in order
  counters: null,
  charts: [],           // uPlot instances on the run page
  source: null,         // EventSource
  rolloutsTimer: null,
  runnersTimer: null,
  view: "",
  navigation: 0,        // counts route() calls: a page whose answer comes after the next navigation drops it
};

// ---- token and calls -------------------------------------------------------------------------
(function readToken() {
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
  state.token = fromHash || sessionStorage.getItem(TOKEN_KEY) || "";
  if (fromHash) {
    sessionStorage.setItem(TOKEN_KEY, state.token);
    history.replaceState(null, "", location.pathname + "#/run");  // keep the token out of the address bar
  }
})();

class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, params) {
  const query = params ? "?" + params.toString() : "";
  const response = await fetch(base + "/dashboard/api" + path + query, {
    headers: { "Authorization": "Bearer " + state.token },
  });
  if (response.status === 401) { showLogin(); throw new HttpError(401, "the store refused the token"); }
  const data = await response.json();
  if (!response.ok) throw new HttpError(response.status, data.error ? data.error.message : response.statusText);
  return data;
}

function showLogin() { document.getElementById("login").hidden = false; }
function showError(err) { document.getElementById("error").textContent = err ? String(err.message || err) : ""; }

// ---- DOM helpers -------------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}
const fmt = (v, digits = 3) => (v === null || v === undefined || Number.isNaN(v)) ? "" :
  (Number.isInteger(v) ? String(v) : Number(v).toFixed(digits));
// A column of real numbers (advantages) keeps its decimals when a value is whole: 0.0000 beside 0.5774.
const fixed = (v, digits) => (v === null || v === undefined || Number.isNaN(v)) ? "" : Number(v).toFixed(digits);
const when = (t) => t ? new Date(t * 1000).toLocaleTimeString() : "";
const ago = (t) => { if (!t) return ""; const s = Date.now() / 1000 - t; return s < 90 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(1)} min ago`; };
const badge = (text) => el("span", { class: "badge " + text, text });
function table(headers, rows) {
  return el("table", {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", { class: h.endsWith("#") ? "num" : "", text: h.replace(/#$/, "") })))),
    el("tbody", {}, rows));
}

// ---- header: counts and live state -------------------------------------------------------------
function renderCounts() {
  const c = state.counters;
  if (!c) return;
  const r = c.rollouts_by_status || {};
  const total = Object.values(r).reduce((a, b) => a + b, 0);
  document.getElementById("counts").textContent =
    `${total} rollouts · ${r.running || 0} running · ${r.queued || 0} queued · ${c.spans} spans · policy resources v${c.latest_resources_version ?? "-"}`;
}

function connectEvents() {
  if (state.source || !state.token) return;
  const params = new URLSearchParams({ token: state.token, since: String(state.records.length) });
  const source = new EventSource(base + "/dashboard/api/events?" + params.toString());
  state.source = source;
  const live = document.getElementById("live");
  source.onopen = () => { live.textContent = "live"; live.className = "live on"; };
  source.onerror = () => { live.textContent = "reconnecting"; live.className = "live off"; };
  source.addEventListener("metrics", (e) => {
    const data = JSON.parse(e.data);
    if (data.next - data.records.length !== state.records.length) return;  // already had them
    state.records.push(...data.records);
    if (state.view === "run") updateRun();
  });
  source.addEventListener("counters", (e) => {
    state.counters = JSON.parse(e.data);
    renderCounts();
    if (state.view === "rollouts") scheduleRolloutsRefresh();
  });
}

// ---- Run page ----------------------------------------------------------------------------------
const CURATED = [
  { title: "Reward", keys: ["train/reward", "val/reward", "val/greedy_reward"], always: true },
  { title: "Success", keys: ["train/success", "val/success", "val/greedy_success"], always: true },
  { title: "Steps per second", derived: "steps_per_s", always: true },
  { title: "Policy version", keys: ["policy_version"], always: true },
  { title: "Entropy", keys: ["policy/entropy"], always: true },
  { title: "KL", prefix: "kl/", always: true },
  { title: "Clip fraction", prefix: "clip/", always: true },
  { title: "Merge rate", keys: ["credit/merge_rate"], always: true },
  { title: "AIR signals", match: (k) => k.startsWith("credit/air_") || k === "credit/share_air", always: true },
];
const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];
const MAX_SHOWN_SERIES = 6;
const COLORS = ["#2f5fd0", "#d1495b", "#3c9a5f", "#d19a35", "#8e5bd0", "#1b9aaa", "#6b7480", "#e07a5f"];

function numericKeys(records) {
  const keys = new Set();
  for (const r of records) for (const [k, v] of Object.entries(r)) if (typeof v === "number" && k !== "step" && k !== "final") keys.add(k);
  return [...keys].sort();
}

function chartSpecs(records) {
  const keys = numericKeys(records);
  const used = new Set(["step"]);
  const specs = [];
  for (const c of CURATED) {
    let ks = [];
    if (c.derived) ks = [];
    else if (c.keys) ks = c.keys.filter((k) => keys.includes(k));
    else if (c.prefix) ks = keys.filter((k) => k.startsWith(c.prefix));
    else if (c.match) ks = keys.filter(c.match);
    ks.forEach((k) => used.add(k));
    specs.push({ title: c.title, keys: ks, derived: c.derived });
  }
  // Every other metric, one chart per prefix ("adv/", "loss/", "update/", "time/", ...).
  const groups = new Map();
  for (const k of keys) {
    if (used.has(k)) continue;
    const prefix = k.includes("/") ? k.split("/")[0] : "other";
    if (!groups.has(prefix)) groups.set(prefix, []);
    groups.get(prefix).push(k);
  }
  for (const [prefix, ks] of groups) specs.push({ title: prefix, keys: ks });
  return specs;
}

function seriesData(records, spec) {
  // One point per step; a step's validation record and its training record are merged.
  const byStep = new Map();
  for (const r of records) {
    if (typeof r.step !== "number") continue;
    byStep.set(r.step, Object.assign(byStep.get(r.step) || {}, r));
  }
  const steps = [...byStep.keys()].sort((a, b) => a - b);
  if (spec.derived === "steps_per_s") {
    const ys = steps.map((s) => { const t = byStep.get(s)["time/step_s"]; return typeof t === "number" && t > 0 ? 1 / t : null; });
    const keep = steps.map((_, i) => ys[i] !== null);
    return { names: ["steps/s"], data: [steps.filter((_, i) => keep[i]), ys.filter((_, i) => keep[i])] };
  }
  const keep = steps.filter((s) => spec.keys.some((k) => typeof byStep.get(s)[k] === "number"));
  const data = [keep, ...spec.keys.map((k) => keep.map((s) => { const v = byStep.get(s)[k]; return typeof v === "number" ? v : null; }))];
  return { names: spec.keys, data };
}

function renderRun(view) {
  view.replaceChildren(
    el("h1", { text: "Run" }),
    el("div", { class: "cards", id: "run-cards" }),
    el("div", { class: "charts", id: "charts" }),
  );
  state.charts = [];
  updateRun();
}

function runCards() {
  const cards = document.getElementById("run-cards");
  if (!cards) return;
  const steps = state.records.filter((r) => "train/reward" in r);
  const last = steps[steps.length - 1] || {};
  const lastVal = [...state.records].reverse().find((r) => "val/success" in r) || {};
  const card = (k, v) => el("div", { class: "card" }, el("div", { class: "v", text: v }), el("div", { class: "k", text: k }));
  cards.replaceChildren(
    card("step", last.step ?? "-"),
    card("policy version", last.policy_version ?? "-"),
    card("train reward", fmt(last["train/reward"])),
    card("held-out success", fmt(lastVal["val/success"])),
    card("steps/s", last["time/step_s"] ? fmt(1 / last["time/step_s"]) : "-"),
    card("metrics records", state.records.length),
  );
}

function updateRun() {
  runCards();
  const host = document.getElementById("charts");
  if (!host) return;
  const specs = chartSpecs(state.records);
  const signature = specs.map((s) => s.title + ":" + (s.keys || []).join(",")).join("|");
  if (host.dataset.signature !== signature) {
    for (const c of state.charts) if (c.plot) c.plot.destroy();
    host.replaceChildren();
    state.charts = specs.map((spec) => {
      const box = el("div", { class: "chart", "data-title": spec.title }, el("h3", { text: spec.title }));
      host.append(box);
      return { spec, box, plot: null };
    });
    host.dataset.signature = signature;
  }
  for (const chart of state.charts) drawChart(chart);
}

function drawChart(chart) {
  const { names, data } = seriesData(state.records, chart.spec);
  chart.box.dataset.points = String(data[0].length);
  if (data[0].length === 0) {
    if (chart.plot) { chart.plot.destroy(); chart.plot = null; }
    if (!chart.box.querySelector(".empty")) chart.box.append(el("div", { class: "empty", text: "not logged by this run yet" }));
    return;
  }
  const empty = chart.box.querySelector(".empty");
  if (empty) empty.remove();
  if (chart.plot && chart.plot.series.length === names.length + 1) { chart.plot.setData(data); return; }
  if (chart.plot) chart.plot.destroy();
  const width = Math.max(360, chart.box.clientWidth - 16);
  chart.plot = new uPlot({
    width, height: 190,
    scales: { x: { time: false } },
    axes: [{ label: "step", incrs: STEP_INCRS }, {}],
    legend: { live: names.length <= MAX_SHOWN_SERIES },
    // A group with many series shows the first few; the others are a click on their legend entry away.
    series: [{ label: "step" }, ...names.map((n, i) => ({
      label: n, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true, show: i < MAX_SHOWN_SERIES,
      points: { show: data[0].length < 60 },
    }))],
  }, data, chart.box);
}

// ---- Rollouts page -----------------------------------------------------------------------------
const STATUSES = ["queued", "running", "succeeded", "failed", "cancelled"];
let rolloutsPage = { cursors: [null], index: 0, last: null };
let rolloutsLoads = 0; // the latest load wins: an older answer arriving late must not overwrite a newer filter's

function filterParams() {
  const hash = location.hash.split("?")[1] || "";
  return new URLSearchParams(hash);
}

function renderRollouts(view) {
  const p = filterParams();
  const chosen = new Set(p.getAll("status"));
  const input = (name, label, attrs) => el("label", {}, label, el("input", { name, value: p.get(name) || "", ...attrs }));
  const form = el("form", { class: "filters", id: "filters" },
    el("div", {}, el("div", { class: "muted", text: "status" }),
      el("div", { class: "statuses" }, STATUSES.map((s) => el("label", {},
        el("input", { type: "checkbox", name: "status", value: s, checked: chosen.has(s) }), s)))),
    el("label", {}, "mode", el("select", { name: "mode" },
      ["", "train", "val"].map((m) => el("option", { value: m, selected: (p.get("mode") || "") === m, text: m || "any" })))),
    input("reward_min", "reward ≥", { type: "number", step: "any" }),
    input("reward_max", "reward ≤", { type: "number", step: "any" }),
    input("task", "task text", { type: "search", placeholder: "substring" }),
    input("agent", "agent name", { type: "search" }),
    input("policy_version", "policy version", { type: "number", min: "0", step: "1" }),
    el("button", { type: "submit", text: "Apply" }),
    el("button", { type: "button", text: "Clear", onclick: () => { location.hash = "#/rollouts"; } }),
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form).entries()) if (String(v).trim() !== "") q.append(k, String(v).trim());
    location.hash = "#/rollouts" + (q.toString() ? "?" + q.toString() : "");
  });
  form.addEventListener("change", (e) => { if (e.target.type === "checkbox" || e.target.tagName === "SELECT") form.requestSubmit(); });
  view.replaceChildren(
    el("h1", { text: "Rollouts" }), form,
    el("div", { class: "pager" },
      el("button", { id: "newer", text: "◀ Newer", onclick: () => pageRollouts(-1) }),
      el("button", { id: "older", text: "Older ▶", onclick: () => pageRollouts(1) }),
      el("span", { id: "page-note", class: "muted" })),
    el("div", { id: "rollout-table", "aria-busy": "true" }),
  );
  rolloutsPage = { cursors: [null], index: 0, last: null };
  loadRollouts();
}

function pageRollouts(delta) {
  const next = rolloutsPage.index + delta;
  if (next < 0 || next >= rolloutsPage.cursors.length) return;
  rolloutsPage.index = next;
  loadRollouts();
}

function scheduleRolloutsRefresh() {
  // Live: the first page follows new rollouts; a page further back stays put.
  if (rolloutsPage.index !== 0 || state.rolloutsTimer) return;
  state.rolloutsTimer = setTimeout(() => { state.rolloutsTimer = null; if (state.view === "rollouts") loadRollouts(); }, 1500);
}

async function loadRollouts() {
  const params = filterParams();
  const cursor = rolloutsPage.cursors[rolloutsPage.index];
  if (cursor !== null) params.set("before", String(cursor));
  params.set("limit", "50");
  const load = ++rolloutsLoads;
  const box = document.getElementById("rollout-table");
  box.setAttribute("aria-busy", "true");
  let page;
  try { page = await api("/rollouts", params); } catch (err) {
    if (load === rolloutsLoads) { showError(err); box.setAttribute("aria-busy", "false"); }
    return;
  }
  if (load !== rolloutsLoads || state.view !== "rollouts") return;
  showError(null);
  rolloutsPage.cursors = rolloutsPage.cursors.slice(0, rolloutsPage.index + 1);
  if (page.next_cursor !== null) rolloutsPage.cursors.push(page.next_cursor);
  const rows = page.items.map((r) => el("tr", { "data-rollout": r.rollout_id },
    el("td", {}, el("a", { href: "#/rollout/" + encodeURIComponent(r.rollout_id), text: r.rollout_id })),
    el("td", {}, badge(r.status)), el("td", { text: r.mode }),
    el("td", { class: "num", text: r.policy_version ?? "" }),
    el("td", { class: "num", text: fmt(r.reward) }),
    el("td", { class: "num", text: r.attempt_count }),
    el("td", { class: "task", title: r.task_preview, text: r.task_preview }),
    el("td", { text: when(r.updated_at) }),
    el("td", { class: "muted", text: r.error || "" })));
  box.replaceChildren(
    rows.length ? table(["rollout", "status", "mode", "policy v#", "reward#", "attempts#", "task", "updated", "error"], rows)
      : el("p", { class: "note", id: "no-rollouts", text: page.complete ? "No rollouts match." : "No match yet in the rollouts searched so far." }));
  const note = page.complete ? `page ${rolloutsPage.index + 1}` :
    `page ${rolloutsPage.index + 1}: searched down to rollout #${page.next_cursor} (the filter matches few; Older ▶ searches on)`;
  document.getElementById("page-note").textContent = note;
  document.getElementById("newer").disabled = rolloutsPage.index === 0;
  document.getElementById("older").disabled = page.next_cursor === null;
  box.setAttribute("aria-busy", "false");
}

// ---- Rollout page ------------------------------------------------------------------------------
async function renderRollout(view, rolloutId, navigation) {
  view.replaceChildren(el("h1", { text: "Rollout " + rolloutId }), el("p", { class: "muted", text: "loading…" }));
  let d;
  try { d = await api("/rollout", new URLSearchParams({ rollout_id: rolloutId })); } catch (err) {
    if (navigation === state.navigation) view.replaceChildren(el("h1", { text: "Rollout " + rolloutId }), el("p", { class: "note", text: String(err.message) }));
    return;
  }
  if (navigation !== state.navigation) return;  // the reader has moved on: this answer must not replace their page
  showError(null);
  const r = d.rollout;
  const summary = el("div", { class: "cards" },
    [["status", badge(r.status)], ["mode", r.mode], ["reward", fmt(r.reward)], ["policy version", d.policy_version ?? "-"],
      ["attempts", r.attempt_count], ["group", r.group_id || "-"]].map(([k, v]) =>
      el("div", { class: "card" }, el("div", { class: "v" }, v), el("div", { class: "k", text: k }))));
  const attempts = table(["attempt", "no#", "runner", "status", "reward#", "started", "finished", "error"],
    d.attempts.map((a) => el("tr", {}, el("td", { class: "mono", text: a.attempt_id }), el("td", { class: "num", text: a.attempt_no }),
      el("td", { text: a.runner_id }), el("td", {}, badge(a.status)), el("td", { class: "num", text: fmt(a.reward) }),
      el("td", { text: when(a.started_at) }), el("td", { text: when(a.finished_at) }), el("td", { class: "muted", text: a.error || "" }))));
  view.replaceChildren(
    el("p", {}, el("a", { href: "#/rollouts", text: "← rollouts" })),
    el("h1", { text: "Rollout " + r.rollout_id }), summary,
    ...(r.error ? [el("pre", { class: "error-text", text: r.error })] : []),
    el("h2", { text: "Task" }), el("pre", { text: JSON.stringify(r.task, null, 2) }),
    el("h2", { text: "Attempts" }), attempts,
    el("h2", { text: `Trace (${d.spans.length} spans)` }), traceTree(d.spans, r.rollout_id),
    el("h2", { text: `Transitions (${d.transitions.length})` }), transitionsView(d),
  );
}

function traceTree(spans, rolloutId) {
  if (!spans.length) return el("p", { class: "note", id: "no-spans", text: "No spans recorded." });
  const ids = new Set(spans.map((s) => s.span_id));
  const children = new Map();
  for (const s of spans) {
    const parent = s.parent_id && ids.has(s.parent_id) ? s.parent_id : null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(s);
  }
  const t0 = Math.min(...spans.map((s) => s.start_time));
  const t1 = Math.max(...spans.map((s) => s.end_time || s.start_time));
  const span = Math.max(t1 - t0, 1e-6);
  const box = el("div", { class: "trace", id: "trace" });
  const walk = (parent, depth) => {
    for (const s of (children.get(parent) || []).sort((a, b) => a.start_time - b.start_time)) {
      const left = ((s.start_time - t0) / span) * 100;
      const width = (((s.end_time || s.start_time) - s.start_time) / span) * 100;
      const label = s.llm ? `${s.llm.prompt_tokens}→${s.llm.completion_tokens} tok` :
        s.reward !== null ? `reward ${fmt(s.reward)}` : s.tool_name ? s.tool_name : "";
      const detail = el("div", { class: "detail", hidden: true });
      const row = el("div", { class: "row", "data-span": s.span_id, "data-kind": s.kind },
        el("div", { class: "name", style: `padding-left:${depth * 1.1}rem` }, el("span", { class: "kind", text: s.kind }), s.name,
          s.status === "error" ? el("span", { class: "badge error", text: " error" }) : null,
          s.air_signal ? el("span", { class: "badge failed", text: " AIR " + s.air_signal }) : null),
        el("div", { class: "bar-area" }, el("div", { class: `bar ${s.kind} ${s.status === "error" ? "error" : ""}`,
          style: `left:${left}%;width:${Math.max(width, 0.3)}%`, title: `${((s.end_time || s.start_time) - s.start_time).toFixed(3)} s` })),
        el("div", { class: "muted", text: label }));
      row.addEventListener("click", () => {
        if (!detail.hidden) { detail.hidden = true; return; }
        if (!detail.childElementCount) detail.append(...spanDetail(s, rolloutId));
        detail.hidden = false;
      });
      box.append(row, detail);
      walk(s.span_id, depth + 1);
    }
  };
  walk(null, 0);
  return box;
}

function spanDetail(s, rolloutId) {
  const out = [];
  const meta = [`attempt ${s.attempt_id}`, s.agent_name ? `agent ${s.agent_name}` : null,
    `${(((s.end_time || s.start_time) - s.start_time) * 1000).toFixed(1)} ms`].filter(Boolean).join(" · ");
  out.push(el("div", { class: "note", text: meta }));
  if (s.status_message) out.push(el("pre", { class: "error-text", text: s.status_message }));
  if (s.llm) {
    const l = s.llm;
    out.push(el("div", { class: "note", text: `${l.endpoint || ""} ${l.model || ""} · prompt ${l.prompt_tokens} tokens · completion ${l.completion_tokens} tokens · finish ${l.finish_reason || "-"} · policy v${l.policy_version ?? "-"} · mean logprob ${fmt(l.mean_logprob)}` }));
    for (const m of l.messages) out.push(el("div", { class: "msg" }, el("div", { class: "role", text: m.role }), el("pre", { text: m.text })));
    out.push(el("div", { class: "msg" }, el("div", { class: "role", text: "response" }), el("pre", { class: "response", text: l.response_text })));
    for (const c of l.tool_calls) out.push(el("div", { class: "msg" }, el("div", { class: "role", text: "tool call " + c.name }), el("pre", { text: c.arguments })));
    const tokens = el("div", { class: "tokens" });
    const button = el("button", { type: "button", text: "Show logprobs", class: "logprobs" });
    button.addEventListener("click", async (e) => {
      e.stopPropagation();
      button.disabled = true;
      try {
        const lp = await api("/logprobs", new URLSearchParams({ rollout_id: rolloutId, span_id: s.span_id }));
        tokens.replaceChildren(...lp.token_ids.map((id, i) => {
          const p = Math.exp(lp.logprobs[i] ?? 0);
          return el("span", { class: "tok", title: `token ${id} · logprob ${fmt(lp.logprobs[i], 4)} · p ${fmt(p)}`,
            style: `background: rgba(47,95,208,${(0.08 + 0.6 * p).toFixed(2)})`, text: String(id) });
        }));
      } catch (err) { tokens.replaceChildren(el("span", { class: "note", text: String(err.message) })); }
    });
    out.push(button, tokens);
  }
  if (s.reward !== null) out.push(el("div", { class: "note", text: `reward ${fmt(s.reward, 4)}${s.reward_name ? " (" + s.reward_name + ")" : ""}` }));
  const attrs = Object.fromEntries(Object.entries(s.attributes).filter(([k]) => k !== "reinforge.json_keys"));
  if (Object.keys(attrs).length) out.push(el("pre", { class: "attrs", text: JSON.stringify(attrs, null, 2) }));
  for (const ev of s.events) out.push(el("pre", { text: `${ev.name}: ${JSON.stringify(ev.attributes)}` }));
  return out;
}

function transitionsView(d) {
  if (!d.transitions.length) {
    const why = d.transitions_source === "none" ? "This store is served without its run folder (pass --run-dir), so there are no transitions to show." :
      "No transitions were trained from this rollout (a validation rollout, a filtered agent, or not collected yet).";
    return el("p", { class: "note", id: "no-transitions", text: why });
  }
  const legend = el("p", {}, el("span", { class: "legend-chip seg trained", text: "trained tokens" }),
    el("span", { class: "legend-chip seg masked", text: "masked (tool results, observations)" }));
  const rows = d.transitions.map((t) => [
    el("tr", { class: "transition", "data-index": t.index },
      el("td", { class: "num", text: t.step }), el("td", { class: "num", text: t.index }), el("td", { text: t.agent_name || "" }),
      el("td", { class: "num", text: t.num_calls }), el("td", { class: "num", text: fmt(t.reward, 4) }),
      el("td", { class: "mono", text: Object.entries(t.reward_sources).map(([k, v]) => `${k} ${fmt(v, 3)}`).join(", ") }),
      el("td", { class: "num advantage", text: fixed(t.advantage, 4) }),
      el("td", { class: "num", text: `${t.prompt_tokens} / ${t.response_tokens} / ${t.trained_tokens}` })),
    el("tr", {}, el("td", { colspan: 8 }, el("div", { class: "segments" },
      t.segments.map((g) => el("span", { class: "seg " + (g.trained ? "trained" : "masked"), title: `${g.tokens} tokens ${g.trained ? "trained" : "masked"}`, text: g.text }))))),
  ]);
  return el("div", { id: "transitions" }, legend,
    table(["step#", "index#", "agent", "calls#", "reward#", "reward sources (AIR included)", "advantage#", "prompt / response / trained tokens#"], rows.flat()));
}

// ---- Runners page ------------------------------------------------------------------------------
async function renderRunners(view) {
  view.replaceChildren(el("h1", { text: "Runners" }), el("div", { id: "runners" }), el("h2", { text: "Current attempts" }), el("div", { id: "running" }));
  await loadRunners();
}

async function loadRunners() {
  let d;
  try { d = await api("/runners"); showError(null); } catch (err) { showError(err); return; }
  if (state.view !== "runners") return;
  const now = Date.now() / 1000;
  document.getElementById("runners").replaceChildren(d.runners.length ? table(
    ["runner", "attempts#", "running#", "failed#", "last heartbeat", "last attempt started"],
    d.runners.map((r) => el("tr", { "data-runner": r.runner_id }, el("td", { text: r.runner_id }), el("td", { class: "num", text: r.attempts }),
      el("td", { class: "num", text: r.running }), el("td", { class: "num", text: r.failed }),
      el("td", { text: `${when(r.last_heartbeat)} (${ago(r.last_heartbeat)})` }), el("td", { text: when(r.last_started) }))))
    : el("p", { class: "note", text: "No runner has leased a rollout yet." }));
  document.getElementById("running").replaceChildren(d.running.length ? table(
    ["attempt", "rollout", "runner", "no#", "started", "heartbeat", "lease"],
    d.running.map((a) => el("tr", {}, el("td", { class: "mono", text: a.attempt_id }),
      el("td", {}, el("a", { href: "#/rollout/" + encodeURIComponent(a.rollout_id), text: a.rollout_id })),
      el("td", { text: a.runner_id }), el("td", { class: "num", text: a.attempt_no }), el("td", { text: when(a.started_at) }),
      el("td", { text: ago(a.last_heartbeat) }),
      el("td", {}, a.lease_deadline < now ? badge("timeout") : `${(a.lease_deadline - now).toFixed(0)} s left`))))
    : el("p", { class: "note", text: "No attempt is running." }));
}

// ---- routing -----------------------------------------------------------------------------------
async function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path] = hash.split("?");
  const [name, ...rest] = path.split("/");
  const view = document.getElementById("view");
  const navigation = ++state.navigation;
  state.view = name || "run";
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.nav === state.view || (state.view === "rollout" && a.dataset.nav === "rollouts"));
  clearInterval(state.runnersTimer);
  if (!state.token) { showLogin(); return; }
  if (state.view === "run") renderRun(view);
  else if (state.view === "rollouts") renderRollouts(view);
  else if (state.view === "rollout") await renderRollout(view, decodeURIComponent(rest.join("/")), navigation);
  else if (state.view === "runners") {
    await renderRunners(view);
    // Polled while the page is open; not started when the reader left before its first answer.
    if (navigation === state.navigation) state.runnersTimer = setInterval(loadRunners, 3000);
  }
  else view.replaceChildren(el("p", { class: "note", text: "Unknown page." }));
}

async function start() {
  if (!state.token) { showLogin(); return; }
  try {
    const overview = await api("/overview");
    state.counters = overview.counters;
    renderCounts();
    const metrics = await api("/metrics", new URLSearchParams({ since: "0" }));
    state.records = metrics.records;
    document.getElementById("login").hidden = true;
    showError(null);
  } catch (err) { showError(err); return; }
  connectEvents();
  await route();
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  state.token = document.getElementById("token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, state.token);
  start();
});
window.addEventListener("hashchange", () => { if (state.token) route(); });
if (!location.hash || location.hash === "#") history.replaceState(null, "", location.pathname + "#/run");
start();
