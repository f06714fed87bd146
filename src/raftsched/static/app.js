// raftsched dashboard: a single-page app with no build step.
//
// Data flow: every POLL_MS the current view re-fetches what it shows and
// re-renders (no page reload). `/v1/overview` comes from the node that served
// the page (it answers from its own replica, with or without a leader); it
// names the leader, and every other request goes straight to the leader's
// URL, because a browser will not follow a follower's redirect to another
// origin. Endpoints that this node does not serve (404 "no route", 405) are
// shown as "not available", so the page works on builds without them.
// Actions ask for confirmation and a reason, and send `Raftsched-Actor:
// dashboard`, which the node records in the job history and an audit log line.

const POLL_MS = 2000;
const view = document.getElementById("view");
const statusLine = document.getElementById("status");
let leaderBase = null;
let pollTimer = null;
let renderSeq = 0;
let previousCounters = null;

// -- helpers ----------------------------------------------------------------

const esc = (value) =>
  String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const badge = (text) => `<span class="badge s-${esc(text)}">${esc(text)}</span>`;
const dash = (value) => (value === null || value === undefined || value === "" ? '<span class="muted">–</span>' : esc(value));
const num = (value, digits = 0) => (value === null || value === undefined ? "–" : Number(value).toFixed(digits));
const jobLink = (id) => `<a class="mono" href="#/jobs/${encodeURIComponent(id)}">${esc(id)}</a>`;
const when = (iso) => (iso ? `<span title="${esc(iso)}">${esc(iso.replace("T", " ").replace("Z", ""))}</span>` : dash(null));
const ms = (at) => (at ? new Date(at).toISOString() : null);

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${(seconds / 60).toFixed(1)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function table(headers, rows, empty = "none") {
  if (!rows.length) return `<p class="muted">${esc(empty)}</p>`;
  const head = headers.map((h) => `<th class="${h.endsWith("#") ? "num" : ""}">${esc(h.replace(/#$/, ""))}</th>`).join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${rows
    .map((cells) => `<tr>${cells.map((c, i) => `<td class="${headers[i].endsWith("#") ? "num" : ""}">${c}</td>`).join("")}</tr>`)
    .join("")}</tbody></table>`;
}

function notAvailable(what) {
  return `<p class="na" data-na="${esc(what)}">not available on this cluster (${esc(what)})</p>`;
}

function toast(text, error = false) {
  const el = document.getElementById("toast");
  el.textContent = text;
  el.className = `show${error ? " error" : ""}`;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (el.className = ""), 4000);
}

// -- the API ----------------------------------------------------------------

// {ok, status, body, missing}: `missing` is true when the node has no such
// route (a feature this build lacks), as opposed to a missing record.
async function api(path, { method = "GET", body, local = false } = {}) {
  const bases = [];
  if (!local && leaderBase && leaderBase !== location.origin) bases.push(leaderBase);
  bases.push(location.origin);
  let lastError = null;
  for (const base of bases) {
    try {
      const headers = { Accept: "application/json" };
      if (method !== "GET") headers["Raftsched-Actor"] = "dashboard";
      if (body !== undefined) headers["Content-Type"] = "application/json";
      const response = await fetch(base + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      let parsed = null;
      try {
        parsed = await response.json();
      } catch {
        parsed = null;
      }
      const message = parsed?.error?.message ?? "";
      const missing = response.status === 405 || (response.status === 404 && message.startsWith("no route"));
      return { ok: response.ok, status: response.status, body: parsed, missing };
    } catch (error) {
      lastError = error;
    }
  }
  return { ok: false, status: 0, body: { error: { code: "network", message: String(lastError) } }, missing: false };
}

const errorText = (answer) => {
  const error = answer.body?.error;
  if (!error) return `HTTP ${answer.status}`;
  const field = error.details?.field ? ` (${error.details.field})` : "";
  return `${error.code}: ${error.message}${field}`;
};

// -- confirmation and actions -----------------------------------------------

function confirmAction(title, text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  const reason = document.getElementById("confirm-reason");
  reason.value = "";
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => resolve(dialog.returnValue === "ok" ? { reason: reason.value.trim() || "from the dashboard" } : null),
      { once: true },
    );
    dialog.showModal();
    reason.focus();
  });
}

const ACTIONS = {
  "cancel-job": (id, reason) => api(`/v1/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST", body: { reason } }),
  "replay-job": (id, reason) => api(`/v1/jobs/${encodeURIComponent(id)}/replay`, { method: "POST", body: { reason } }),
  "pause-queue": (name) => api(`/v1/queues/${encodeURIComponent(name)}`, { method: "PUT", body: { paused: true } }),
  "resume-queue": (name) => api(`/v1/queues/${encodeURIComponent(name)}`, { method: "PUT", body: { paused: false } }),
  "pause-schedule": (id) => api(`/v1/schedules/${encodeURIComponent(id)}/pause`, { method: "POST" }),
  "resume-schedule": (id) => api(`/v1/schedules/${encodeURIComponent(id)}/resume`, { method: "POST" }),
  "trigger-schedule": (id) => api(`/v1/schedules/${encodeURIComponent(id)}/trigger`, { method: "POST" }),
  "cancel-workflow": async (id, reason) => {
    const path = `/v1/workflows/${encodeURIComponent(id)}/cancel`;
    const answer = await api(path, { method: "POST", body: { reason } });
    // A cancel endpoint without a reason field rejects it; send none then.
    if (answer.status === 400 && answer.body?.error?.details?.field === "reason") return api(path, { method: "POST" });
    return answer;
  },
};

const actionButton = (action, target, label, danger = true) =>
  `<button data-action="${esc(action)}" data-target="${esc(target)}" class="${danger ? "danger" : ""}">${esc(label)}</button>`;

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-action]");
  if (!button) return;
  const { action, target } = button.dataset;
  const decision = await confirmAction(button.textContent, `${button.textContent}: ${target}?`);
  if (!decision) return;
  button.disabled = true;
  const answer = await ACTIONS[action](target, decision.reason);
  button.disabled = false;
  if (answer.missing) toast(`${button.textContent}: not available on this cluster`, true);
  else if (!answer.ok) toast(`${button.textContent} failed: ${errorText(answer)}`, true);
  else toast(`${button.textContent}: done`);
  refresh();
});

// -- views ------------------------------------------------------------------

// The leader's overview when there is one (stuck jobs, recent errors and
// clock skew are the leader's knowledge), else this node's own.
async function overview() {
  const first = await api("/v1/overview");
  if (!first.ok) return first;
  const leader = first.body.node.leader;
  const base = leader?.http_url ? new URL(leader.http_url).origin : null;
  const changed = base !== leaderBase;
  leaderBase = base;
  if (first.body.node.role !== "leader" && base && changed) {
    const again = await api("/v1/overview");
    if (again.ok) return again;
  }
  return first;
}

function rates(counters) {
  // Per queue, per minute, from the change since the previous poll.
  const now = Date.now();
  const result = {};
  if (previousCounters) {
    const seconds = (now - previousCounters.at) / 1000;
    for (const [queue, totals] of Object.entries(counters)) {
      const before = previousCounters.values[queue] || {};
      result[queue] = {};
      for (const key of ["submitted", "succeeded", "failed"]) {
        const delta = (totals[key] || 0) - (before[key] || 0);
        result[queue][key] = seconds > 0 ? (Math.max(0, delta) * 60) / seconds : 0;
      }
    }
  }
  previousCounters = { at: now, values: counters };
  return result;
}

async function onCallView() {
  const [over, queues, events] = await Promise.all([overview(), api("/v1/queues"), api("/v1/events?after=0")]);
  if (!over.ok) return `<section class="wide"><h2>Cluster</h2><p class="na">cannot read this node: ${esc(errorText(over))}</p></section>`;
  const o = over.body;
  const skew = Object.fromEntries(o.clock_skew.map((s) => [s.node_id, s]));
  const nodeRow = (n, self) => {
    const s = skew[n.id];
    return [
      `<a href="${esc(n.http_url)}/">${esc(n.id)}</a>${self ? ' <span class="muted">(answering)</span>' : ""}`,
      badge(self ? n.role : n.reachable ? n.role : "unreachable"),
      self ? esc(n.term) : dash(null),
      self ? esc(n.applied_index) : dash(n.match_index),
      badge(n.reachable === false ? "unreachable" : "ok"),
      s ? `${num(s.skew_ms, 1)} ms <span class="muted">±${num(s.round_trip_ms / 2, 1)}</span>` : dash(null),
    ];
  };
  const nodes = [nodeRow({ ...o.node, reachable: true }, true), ...o.node.peers.map((p) => nodeRow(p, false))];
  const limitsByQueue = queues.ok ? Object.fromEntries((queues.body.queues || []).map((q) => [q.name, q])) : {};
  const rate = rates(o.counters || {});
  const queueRows = o.queues.map((q) => {
    const limits = limitsByQueue[q.name];
    const r = rate[q.name];
    const limitText = !queues.ok
      ? '<span class="na">not available</span>'
      : limits
        ? [
            limits.paused ? badge("paused") : "",
            limits.rate_limit_per_s != null ? `${esc(limits.rate_limit_per_s)}/s` : "",
            limits.concurrency_limit != null ? `max ${esc(limits.concurrency_limit)}` : "",
          ].filter(Boolean).join(" ") || '<span class="muted">none</span>'
        : '<span class="muted">none</span>';
    const paused = limits?.paused;
    return [
      `<a href="#/jobs?queue=${encodeURIComponent(q.name)}">${esc(q.name)}</a>`,
      esc(q.depth),
      esc(q.running),
      ago(q.oldest_runnable_age_s),
      r ? num(r.submitted, 1) : "–",
      r ? num(r.succeeded, 1) : "–",
      r ? num(r.failed, 1) : "–",
      limitText,
      paused ? actionButton("resume-queue", q.name, "Resume queue", false) : actionButton("pause-queue", q.name, "Pause queue"),
    ];
  });
  const counts = Object.entries(o.status_counts).filter(([, n]) => n > 0).map(([s, n]) => `${badge(s)} ${esc(n)}`).join(" ");
  let outbox;
  if (events.missing) outbox = notAvailable("GET /v1/events");
  else if (!events.ok) outbox = `<p class="na">${esc(errorText(events))}</p>`;
  else {
    const list = events.body.events || [];
    outbox = `<p>last event seq <b>${esc(events.body.last_seq)}</b>${o.outbox_lag ? `, undelivered per subscription: ${Object.entries(o.outbox_lag).map(([k, v]) => `${esc(k)} ${esc(v)}`).join(", ") || "no subscriptions"}` : ""}</p>` +
      table(["seq#", "type", "at"], list.slice(-10).reverse().map((e) => [esc(e.seq), esc(e.type), when(e.at)]), "no events");
  }
  return `
  <section class="wide" id="nodes"><h2>Nodes <span class="muted">term ${esc(o.node.term)}, commit ${esc(o.node.commit_index)}, leader ${esc(o.node.leader?.id ?? "none")}</span></h2>
    ${table(["node", "role", "term#", "applied / match#", "reachable", "clock skew vs leader"], nodes)}
    <p class="muted">Jobs: ${counts || "none"} · replicated time ${esc(o.now ?? "–")}</p></section>
  <section class="wide" id="queues"><h2>Queues</h2>
    ${table(["queue", "depth#", "running#", "oldest runnable", "submitted/min#", "succeeded/min#", "failed/min#", "limits", ""], queueRows, "no queues yet")}
    ${queues.missing ? notAvailable("GET /v1/queues: limits and pause") : ""}</section>
  <section id="stuck"><h2>Stuck jobs <span class="muted">(no heartbeat progress for ${esc(o.stuck_after_s)} s)</span></h2>
    ${table(["job", "queue", "worker", "quiet", ""], o.stuck_jobs.map((j) => [jobLink(j.job_id), esc(j.queue), dash(j.worker_id), ago(j.quiet_s), actionButton("cancel-job", j.job_id, "Cancel job")]), "none")}</section>
  <section id="dlq"><h2>Dead-letter queue <span class="muted">${esc(o.status_counts.dead_letter ?? 0)} jobs</span></h2>
    ${table(["job", "queue", "attempts#", "last error", ""], o.dead_letters.map((j) => [jobLink(j.id), esc(j.queue), esc(j.attempts_made), j.last_error ? `${esc(j.last_error.kind)}: ${esc(j.last_error.message)}` : dash(null), actionButton("replay-job", j.id, "Replay", false)]), "empty")}</section>
  <section id="errors"><h2>Recent errors</h2>
    ${table(["at", "what", "kind", "job", "message"], o.recent_errors.map((e) => [when(ms(e.at_ms)), esc(e.source), esc(e.kind), e.job_id ? jobLink(e.job_id) : dash(null), esc(e.message)]), "none")}</section>
  <section id="leaders"><h2>Leader history <span class="muted">(seen by ${esc(o.node.id)})</span></h2>
    ${table(["at", "term#", "leader", "previous"], o.leader_history.map((c) => [when(ms(c.at_ms)), esc(c.term), dash(c.leader_id), dash(c.previous_id)]), "no change seen")}</section>
  <section id="outbox"><h2>Events (outbox)</h2>${outbox}</section>`;
}

const SEARCH_FIELDS = [
  ["id", "job id"],
  ["idempotency_key", "idempotency key"],
  ["queue", "queue"],
  ["status", "status"],
  ["tenant", "tenant"],
  ["correlation_id", "correlation id"],
];
const STATUSES = ["", "scheduled", "pending", "claimed", "running", "retry_wait", "succeeded", "dead_letter", "cancelled"];

async function jobsView(params) {
  const form = SEARCH_FIELDS.map(([key, label]) => {
    const value = params.get(key) || "";
    const input = key === "status"
      ? `<select name="status">${STATUSES.map((s) => `<option${s === value ? " selected" : ""}>${s}</option>`).join("")}</select>`
      : `<input name="${key}" value="${esc(value)}">`;
    return `<label>${esc(label)}${input}</label>`;
  }).join("");
  let results;
  if (params.get("id")) {
    const answer = await api(`/v1/jobs/${encodeURIComponent(params.get("id"))}`);
    results = answer.ok ? [answer.body.job] : answer.status === 404 ? [] : null;
    if (results === null) return searchPage(form, `<p class="na">${esc(errorText(answer))}</p>`);
  } else {
    const query = new URLSearchParams();
    for (const [key] of SEARCH_FIELDS) if (params.get(key)) query.set(key, params.get(key));
    query.set("limit", "50");
    const answer = await api(`/v1/jobs?${query}`);
    if (!answer.ok) return searchPage(form, `<p class="na">${esc(errorText(answer))}</p>`);
    results = answer.body.jobs;
  }
  const rows = results.map((j) => [jobLink(j.id), esc(j.queue), badge(j.status), esc(j.attempts_made), dash(j.tenant), dash(j.idempotency_key), dash(j.correlation_id), when(j.updated_at)]);
  return searchPage(form, table(["job", "queue", "status", "attempts#", "tenant", "idempotency key", "correlation id", "updated"], rows, "no matching jobs"));
}

const searchPage = (form, results) => `
  <section class="wide"><h2>Find jobs</h2><form class="search" id="job-search">${form}<button type="submit">Search</button></form></section>
  <section class="wide" id="job-results"><h2>Jobs</h2>${results}</section>`;

// The search form has an input named "id", which shadows `form.id` (DOM
// clobbering): ask for the attribute.
const isSearchForm = (form) => form?.getAttribute?.("id") === "job-search";

document.addEventListener("submit", (event) => {
  if (!isSearchForm(event.target)) return;
  event.preventDefault();
  const query = new URLSearchParams();
  for (const [key, value] of new FormData(event.target)) if (value) query.set(key, value);
  location.hash = `#/jobs?${query}`;
});

async function jobView(id) {
  const [jobAnswer, historyAnswer] = await Promise.all([
    api(`/v1/jobs/${encodeURIComponent(id)}`),
    api(`/v1/jobs/${encodeURIComponent(id)}/history`),
  ]);
  if (!jobAnswer.ok) return `<section class="wide"><h2>Job ${esc(id)}</h2><p class="na">${esc(errorText(jobAnswer))}</p></section>`;
  const j = jobAnswer.body.job;
  const final = ["succeeded", "dead_letter", "cancelled"].includes(j.status);
  const actions = [
    !final && !j.cancel_requested ? actionButton("cancel-job", j.id, "Cancel job") : "",
    j.status === "dead_letter" ? actionButton("replay-job", j.id, "Replay", false) : "",
  ].join("");
  const fields = [
    ["status", badge(j.status) + (j.cancel_requested ? " " + badge("cancel requested") : "")],
    ["queue", esc(j.queue)], ["tenant", esc(j.tenant)], ["priority", esc(j.priority)],
    ["attempts", `${esc(j.attempts_made)} of ${esc(j.max_attempts)}`],
    ["idempotency key", dash(j.idempotency_key)], ["correlation id", dash(j.correlation_id)],
    ["ordering key", dash(j.ordering_key)],
    ["schedule", j.schedule_id ? `<a href="#/schedules/${encodeURIComponent(j.schedule_id)}">${esc(j.schedule_id)}</a>` : dash(null)],
    ["workflow", j.workflow_id ? `<a href="#/workflows/${encodeURIComponent(j.workflow_id)}">${esc(j.workflow_id)}</a> step ${esc(j.step)}` : dash(null)],
    ["created", when(j.created_at)], ["run at", when(j.run_at)], ["next run", when(j.next_run_at)],
    ["lease", j.lease ? `${esc(j.lease.worker_id)} · epoch ${esc(j.lease.epoch)} · token ${esc(j.lease.fencing_token)} · until ${when(j.lease.expires_at)}` : dash(null)],
    ["last error", j.last_error ? `${esc(j.last_error.kind)}: ${esc(j.last_error.message)}` : dash(null)],
    ["payload", `<pre>${esc(JSON.stringify(j.payload, null, 1))}</pre>`],
    ["result", j.result === null ? dash(null) : `<pre>${esc(JSON.stringify(j.result, null, 1))}</pre>`],
  ];
  const attempts = j.attempts.map((a) => [esc(a.number), dash(a.worker_id), esc(a.epoch), esc(a.fencing_token), when(a.claimed_at), when(a.started_at), when(a.ended_at), a.outcome ? badge(a.outcome) : dash(null), a.error ? `${esc(a.error.kind)}: ${esc(a.error.message)}` : dash(null)]);
  const events = historyAnswer.ok ? historyAnswer.body.events : [];
  const timeline = events.map((e) => `<li data-event="${esc(e.event)}"><b>${esc(e.event)}</b> ${e.from_status ? `${badge(e.from_status)} → ` : ""}${badge(e.to_status)} <span class="muted">${when(e.at)} · ${esc(e.actor)} · epoch ${esc(e.epoch)}${e.fencing_token != null ? ` · token ${esc(e.fencing_token)}` : ""}</span>${e.detail ? `<br><span class="muted">${esc(e.detail)}</span>` : ""}</li>`).join("");
  return `
  <section class="wide" id="job"><h2>Job <span class="mono">${esc(j.id)}</span></h2>
    <div class="actions">${actions}</div>
    <dl class="kv">${fields.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${v}</dd>`).join("")}</dl></section>
  <section id="attempts"><h2>Attempts</h2>${table(["#", "worker", "epoch#", "token#", "claimed", "started", "ended", "outcome", "error"], attempts, "no attempts yet")}</section>
  <section id="history"><h2>Timeline</h2>${historyAnswer.ok ? `<ol class="timeline">${timeline}</ol>` : `<p class="na">${esc(errorText(historyAnswer))}</p>`}</section>`;
}

async function schedulesView() {
  const answer = await api("/v1/schedules");
  if (answer.missing) return `<section class="wide"><h2>Schedules</h2>${notAvailable("GET /v1/schedules")}</section>`;
  if (!answer.ok) return `<section class="wide"><h2>Schedules</h2><p class="na">${esc(errorText(answer))}</p></section>`;
  const rows = (answer.body.schedules || []).map((s) => [
    `<a href="#/schedules/${encodeURIComponent(s.id)}">${esc(s.id)}</a>`,
    esc(s.cron ?? (s.interval_s != null ? `every ${s.interval_s} s` : "")), dash(s.timezone),
    s.paused ? badge("paused") : badge("running"), when(s.next_fire_at), when(s.last_fired_at),
  ]);
  return `<section class="wide" id="schedules"><h2>Schedules</h2>${table(["schedule", "when", "time zone", "state", "next", "last"], rows, "no schedules")}</section>`;
}

async function scheduleView(id) {
  const path = `/v1/schedules/${encodeURIComponent(id)}`;
  const [answer, occurrences] = await Promise.all([api(path), api(`${path}/occurrences?limit=100`)]);
  if (answer.missing) return `<section class="wide"><h2>Schedule ${esc(id)}</h2>${notAvailable("GET /v1/schedules/{id}")}</section>`;
  if (!answer.ok) return `<section class="wide"><h2>Schedule ${esc(id)}</h2><p class="na">${esc(errorText(answer))}</p></section>`;
  const s = answer.body.schedule ?? answer.body;
  const actions = [
    s.paused ? actionButton("resume-schedule", s.id, "Resume schedule", false) : actionButton("pause-schedule", s.id, "Pause schedule"),
    actionButton("trigger-schedule", s.id, "Trigger now", false),
  ].join("");
  const fields = Object.entries(s).filter(([k]) => k !== "job").map(([k, v]) => `<dt>${esc(k)}</dt><dd>${typeof v === "object" && v !== null ? `<code>${esc(JSON.stringify(v))}</code>` : dash(v)}</dd>`).join("");
  let occ;
  if (occurrences.missing) occ = notAvailable("GET /v1/schedules/{id}/occurrences");
  else if (!occurrences.ok) occ = `<p class="na">${esc(errorText(occurrences))}</p>`;
  else occ = table(["nominal time", "decided", "decision", "job", "reason"], (occurrences.body.occurrences || []).map((o) => [when(o.nominal_time), when(o.decided_at), badge(o.decision), o.job_id ? jobLink(o.job_id) : dash(null), dash(o.reason)]), "no occurrences yet");
  return `
  <section class="wide" id="schedule"><h2>Schedule ${esc(s.id)}</h2><div class="actions">${actions}</div><dl class="kv">${fields}</dl></section>
  <section class="wide" id="occurrences"><h2>Occurrences and decisions</h2>${occ}</section>`;
}

async function workflowsView() {
  const answer = await api("/v1/workflows");
  if (answer.missing) return `<section class="wide"><h2>Workflows</h2>${notAvailable("GET /v1/workflows")}</section>`;
  if (!answer.ok) return `<section class="wide"><h2>Workflows</h2><p class="na">${esc(errorText(answer))}</p></section>`;
  const rows = (answer.body.workflows || []).map((w) => [`<a href="#/workflows/${encodeURIComponent(w.id)}">${esc(w.id)}</a>`, badge(w.status), dash(w.tenant), when(w.created_at)]);
  return `<section class="wide" id="workflows"><h2>Workflows</h2>${table(["workflow", "status", "tenant", "created"], rows, "no workflows")}</section>`;
}

// Lay steps out in columns by dependency depth; edges from each dependency.
function stepGraph(steps) {
  const names = Object.keys(steps);
  const depth = {};
  const depthOf = (name, seen = new Set()) => {
    if (depth[name] !== undefined) return depth[name];
    if (seen.has(name)) return 0;
    seen.add(name);
    const deps = steps[name]?.depends_on || [];
    depth[name] = deps.length ? 1 + Math.max(...deps.map((d) => depthOf(d, seen))) : 0;
    return depth[name];
  };
  names.forEach((n) => depthOf(n));
  const columns = [];
  for (const n of names) (columns[depth[n]] ||= []).push(n);
  const W = 150, H = 44, GX = 60, GY = 18;
  const pos = {};
  columns.forEach((col, x) => col.forEach((n, y) => (pos[n] = { x: 10 + x * (W + GX), y: 10 + y * (H + GY) })));
  const width = 20 + columns.length * (W + GX);
  const height = 20 + Math.max(1, ...columns.map((c) => c.length)) * (H + GY);
  const fill = { succeeded: "#c6f6d5", running: "#c6f6d5", active: "#bee3f8", waiting: "#edf2f7", compensating: "#feebc8", failed: "#fed7d7", dead_letter: "#fed7d7", cancelled: "#e2e8f0", pending: "#bee3f8", claimed: "#bee3f8", retry_wait: "#feebc8" };
  const edges = names.flatMap((n) => (steps[n]?.depends_on || []).filter((d) => pos[d]).map((d) =>
    `<line x1="${pos[d].x + W}" y1="${pos[d].y + H / 2}" x2="${pos[n].x - 4}" y2="${pos[n].y + H / 2}"/>`));
  const boxes = names.map((n) => {
    const st = steps[n]?.status || "waiting";
    return `<g data-step="${esc(n)}" data-status="${esc(st)}"><rect x="${pos[n].x}" y="${pos[n].y}" width="${W}" height="${H}" fill="${fill[st] || "#fff"}"/>
      <text x="${pos[n].x + 8}" y="${pos[n].y + 18}" font-weight="600">${esc(n)}</text>
      <text x="${pos[n].x + 8}" y="${pos[n].y + 35}">${esc(st)}</text></g>`;
  });
  return `<svg class="graph" width="${width}" height="${height}" role="img" aria-label="step graph">
    <defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0L10,5L0,10z" fill="#a0aec0"/></marker></defs>
    ${edges.join("")}${boxes.join("")}</svg>`;
}

async function workflowView(id) {
  const answer = await api(`/v1/workflows/${encodeURIComponent(id)}`);
  if (answer.missing) return `<section class="wide"><h2>Workflow ${esc(id)}</h2>${notAvailable("GET /v1/workflows/{id}")}</section>`;
  if (!answer.ok) return `<section class="wide"><h2>Workflow ${esc(id)}</h2><p class="na">${esc(errorText(answer))}</p></section>`;
  const w = answer.body.workflow;
  const steps = Array.isArray(w.steps) ? Object.fromEntries(w.steps.map((s) => [s.name, s])) : w.steps || {};
  const final = ["succeeded", "failed", "cancelled", "timed_out"].includes(w.status);
  const rows = Object.entries(steps).map(([name, s]) => [esc(name), badge(s.status || "waiting"), s.job_id ? jobLink(s.job_id) : dash(null), dash((s.depends_on || []).join(", ")), s.result === undefined || s.result === null ? dash(null) : `<code>${esc(JSON.stringify(s.result))}</code>`]);
  return `
  <section class="wide" id="workflow"><h2>Workflow <span class="mono">${esc(w.id)}</span> ${badge(w.status)}</h2>
    <div class="actions">${final ? "" : actionButton("cancel-workflow", w.id, "Cancel workflow")}</div>
    ${stepGraph(steps)}</section>
  <section class="wide" id="steps"><h2>Steps</h2>${table(["step", "state", "job", "depends on", "result"], rows, "no steps")}</section>`;
}

// -- routing and polling ----------------------------------------------------

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query = ""] = hash.split("?");
  const params = new URLSearchParams(query);
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "jobs" && parts[1]) return ["jobs", () => jobView(parts[1])];
  if (parts[0] === "jobs") return ["jobs", () => jobsView(params)];
  if (parts[0] === "schedules" && parts[1]) return ["schedules", () => scheduleView(parts[1])];
  if (parts[0] === "schedules") return ["schedules", schedulesView];
  if (parts[0] === "workflows" && parts[1]) return ["workflows", () => workflowView(parts[1])];
  if (parts[0] === "workflows") return ["workflows", workflowsView];
  return ["oncall", onCallView];
}

async function refresh() {
  const seq = ++renderSeq;
  const [name, render] = route();
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.dataset.nav === name));
  try {
    if (!leaderBase && name !== "oncall") await overview();
    const html = await render();
    if (seq !== renderSeq) return; // a newer render started meanwhile
    // Keep what the user is typing in the search form.
    const active = document.activeElement;
    if (active && isSearchForm(active.form)) return;
    if (document.getElementById("confirm").open) return;
    view.innerHTML = html;
    view.dataset.view = name;
    view.dataset.rendered = String(Number(view.dataset.rendered || 0) + 1);
    statusLine.textContent = `updated ${new Date().toLocaleTimeString()} · leader ${leaderBase ?? "unknown"}`;
  } catch (error) {
    statusLine.textContent = `error: ${error}`;
  }
}

function schedulePolling() {
  clearInterval(pollTimer);
  pollTimer = setInterval(refresh, POLL_MS);
}

window.addEventListener("hashchange", () => {
  previousCounters = null;
  refresh();
  schedulePolling();
});
refresh();
schedulePolling();
