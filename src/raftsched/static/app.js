// raftsched dashboard: a single-page app with no build step.
//
// Data flow: every POLL_MS the current view re-fetches what it shows and
// re-renders (no page reload). `/v1/overview` comes from the node that served
// the page (it answers from its own replica, with or without a leader); it
// names the leader, and every other request goes straight to the leader's
// URL, because a browser will not follow a follower's redirect to another
// origin. Endpoints that this node does not serve (404 "no route", 405) are
// shown as "not available", so the page works on builds without them.
// Charts (the Charts view, and the last hour on the on-call view) are drawn
// by uPlot, vendored under /static/vendor/ (its README names the version),
// from `GET /v1/stats/series`; a chart is made once and given new data on
// every poll, so it does not flicker.
// Actions ask for confirmation and a reason, and send `Raftsched-Actor:
// dashboard`; the job history and the audit log line name the caller's token
// (`name (tok_...)`) once authentication is on, the header only while it is off.
//
// Authentication (docs/security.md, "Dashboard"): the page and its files are
// public. Once the cluster has tokens, the page asks for one, keeps it in this
// tab's sessionStorage (never localStorage, never a cookie: a cookie would be
// sent by the browser on its own, and a cross-site request could use it) and
// sends it as `Authorization: Bearer` on every call, to this node and to the
// leader. The secret is never written into the page, the console or a URL.
// A 401 from any call ends the session and shows the login form again.
// Actions the caller's role may not take are not shown at all (ROLE_PERMISSIONS
// below, a copy of the server's table); a 403 on a cluster-wide view (a
// viewer scoped to some tenants) shows a short note and the data in scope.

const POLL_MS = 2000;
const view = document.getElementById("view");
const statusLine = document.getElementById("status");
// The leader's origin, kept for the tab (it is no secret) so that a reload
// does not have to find it again.
const LEADER_KEY = "raftsched.leader";
let leaderBase = sessionStorage.getItem(LEADER_KEY);
function setLeader(base) {
  leaderBase = base;
  if (base) sessionStorage.setItem(LEADER_KEY, base);
  else sessionStorage.removeItem(LEADER_KEY);
}
let pollTimer = null;
let renderSeq = 0;
let previousCounters = null;

// -- who is logged in ---------------------------------------------------------

const TOKEN_KEY = "raftsched.token";
const secret = () => sessionStorage.getItem(TOKEN_KEY);
// null: not known yet (or logged out); {auth: "off"} while the cluster has no
// tokens; else {auth: "on", name, role, id, tenants, queues}.
let me = null;
// The on-call view's /v1/overview answered 403: do not ask again each poll.
let overviewDenied = false;

// Mirrors ROLE_PERMISSIONS and CLUSTER_NEEDS_ALL_TENANTS in
// src/raftsched/api/permissions.py; ACTION_PERMISSIONS names each action's
// route's entry in ROUTE_PERMISSIONS there. The server decides (403); this
// only keeps the page from offering what it would refuse.
// tests/unit/test_dashboard_permissions.py checks the copy against the table.
const ROLE_PERMISSIONS = {
  admin: ["authenticated", "read", "read.job", "effects.read", "cluster", "submit", "cancel", "operate", "work", "tokens", "membership", "backup"],
  operator: ["authenticated", "read", "read.job", "effects.read", "cluster", "submit", "cancel", "operate"],
  submitter: ["authenticated", "read", "read.job", "effects.read", "submit", "cancel"],
  worker: ["authenticated", "read.job", "effects.read", "work"],
  viewer: ["authenticated", "read", "read.job", "effects.read", "cluster"],
};
const CLUSTER_NEEDS_ALL_TENANTS = ["viewer"];
const ACTION_PERMISSIONS = {
  "cancel-job": "cancel", // POST /v1/jobs/{job_id}/cancel
  "replay-job": "operate", // POST /v1/jobs/{job_id}/replay
  "replay-reconciled-job": "operate", // POST /v1/jobs/{job_id}/replay
  "reconcile-job": "operate", // POST /v1/jobs/{job_id}/reconcile
  "pause-queue": "operate", // PUT /v1/queues/{name}
  "resume-queue": "operate", // PUT /v1/queues/{name}
  "pause-schedule": "operate", // POST /v1/schedules/{schedule_id}/pause
  "resume-schedule": "operate", // POST /v1/schedules/{schedule_id}/resume
  "trigger-schedule": "operate", // POST /v1/schedules/{schedule_id}/trigger
  "cancel-workflow": "cancel", // POST /v1/workflows/{workflow_id}/cancel
};

function may(permission) {
  if (!me || me.auth === "off") return true; // no tokens yet: every caller is admin
  if (!(ROLE_PERMISSIONS[me.role] || []).includes(permission)) return false;
  if (permission === "cluster" && CLUSTER_NEEDS_ALL_TENANTS.includes(me.role)) return me.tenants.includes("*");
  return true;
}

// -- helpers ----------------------------------------------------------------

const esc = (value) =>
  String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const badge = (text) => `<span class="badge s-${esc(text)}">${esc(text)}</span>`;
const dash = (value) => (value === null || value === undefined || value === "" ? '<span class="muted">–</span>' : esc(value));
const num = (value, digits = 0) => (value === null || value === undefined ? "–" : Number(value).toFixed(digits));
// A job id names its shard in a cluster of several shards (docs/shards.md):
// `job<k>_...`, and a workflow step's `job_wf<k>_...`; shard 0's read `job_`.
const shardOf = (id) => Number((/^job(?:_wf)?([1-9][0-9]*)_/.exec(id) || [null, 0])[1]);
const shardNote = (id) => (shardOf(id) ? ` <span class="muted shard" title="shard ${shardOf(id)}">s${shardOf(id)}</span>` : "");
const jobLink = (id) => `<a class="mono" href="#/jobs/${encodeURIComponent(id)}">${esc(id)}</a>${shardNote(id)}`;
// The outbox's last seq: a number, or with several shards a cursor of each
// shard's (`v1.<seq0>.<seq1>...`), shown per shard.
const lastSeqs = (value) =>
  typeof value === "string" && value.startsWith("v1.") ? value.split(".").slice(1).map((seq, shard) => `shard ${shard}: ${seq}`).join(", ") : String(value);
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
//
// `token` overrides the stored secret (the login form tries one); `login`
// keeps a 401 from ending the session (the caller shows it).
async function api(path, { method = "GET", body, local = false, token = secret(), login = false, retried = false } = {}) {
  const bases = [];
  if (!local && leaderBase && leaderBase !== location.origin) bases.push(leaderBase);
  bases.push(location.origin);
  let lastError = null;
  for (const base of bases) {
    try {
      const headers = { Accept: "application/json" };
      if (token) headers.Authorization = `Bearer ${token}`;
      if (method !== "GET") headers["Raftsched-Actor"] = "dashboard";
      if (body !== undefined) headers["Content-Type"] = "application/json";
      const response = await fetch(base + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        credentials: "omit",
        cache: "no-store",
      });
      // A follower redirects to the leader, and the browser drops the
      // Authorization header on a redirect to another origin: the leader
      // then answers 401 (429 once this address failed too often). That
      // names the leader; ask it again directly. Tokens that may read the
      // overview learn the leader from it instead (findLeader).
      if ((response.status === 401 || response.status === 429) && response.redirected && token && !retried) {
        setLeader(new URL(response.url).origin);
        return api(path, { method, body, token, login, retried: true });
      }
      let parsed = null;
      try {
        parsed = await response.json();
      } catch {
        parsed = null;
      }
      const message = parsed?.error?.message ?? "";
      const missing = response.status === 405 || (response.status === 404 && message.startsWith("no route"));
      const answer = { ok: response.ok, status: response.status, body: parsed, missing };
      // 429: this token failed, and failed again (valid tokens are never limited).
      if ((response.status === 401 || (response.status === 429 && token)) && !login) sessionEnded(answer);
      return answer;
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

// What a 403 means to the caller: a short note, not an error. Views that mix
// every tenant's data need a token for all tenants; others are not the role's.
function deniedNote(what) {
  const scoped = me && me.auth === "on" && !me.tenants.includes("*");
  const why = scoped ? 'only with a token for all tenants (tenants ["*"])' : `not for the ${me?.role ?? "current"} role`;
  return `<p class="scope-note" data-denied="${esc(what)}">${esc(what)}: ${esc(why)}.</p>`;
}

// The body of a section whose request failed: not available, a note on a
// 403, or the error.
function failed(answer, what) {
  if (answer.missing) return notAvailable(what);
  if (answer.status === 403) return deniedNote(what);
  return `<p class="na">${esc(errorText(answer))}</p>`;
}

// -- charts -----------------------------------------------------------------

// Made once per key and kept across polls: {plot, signature, width}.
const charts = new Map();
const CHART_HEIGHT = 170;
const SERIES_WINDOWS = [[900, "15 min"], [3600, "1 h"]];
const COLORS = { succeeded: "#1f8a4c", failed: "#b7791f", dead: "#c53030", depth: "#2b6cb0", age: "#6b46c1", lag: "#2c7a7b" };

function shortNumber(value) {
  if (value === null || value === undefined) return "–";
  const size = Math.abs(value);
  if (size >= 1e6) return `${(value / 1e6).toFixed(1)}M`;
  if (size >= 1e4) return `${(value / 1e3).toFixed(0)}k`;
  if (size >= 100 || Number.isInteger(value)) return value.toFixed(0);
  return value.toFixed(size >= 10 ? 1 : 2);
}

// One chart's description: the line series and their values over `at`.
// `data` is uPlot's: seconds since the epoch, then one array per series.
function chartSpec(key, title, body, lines) {
  const xs = body.at.map((iso) => Date.parse(iso) / 1000);
  return {
    key,
    title,
    series: lines.map(([label, , color]) => ({ label, stroke: color })),
    data: [xs, ...lines.map(([, values]) => values)],
  };
}

const chartHolder = (spec) =>
  `<figure class="chart"><figcaption>${esc(spec.title)}</figcaption><div data-chart="${esc(spec.key)}"></div></figure>`;

// The dashboard shows UTC everywhere, as 24-hour times.
const utcTime = (ts, seconds = false) => new Date(ts * 1000).toISOString().slice(11, seconds ? 19 : 16);

// A value with no value on either side (a lone claim's lag, a sample after a
// gap) makes no line: draw it as a dot.
function lonePoints(u, seriesIdx) {
  const values = u.data[seriesIdx];
  const lone = [];
  for (let i = 0; i < values.length; i++) {
    if (values[i] != null && values[i - 1] == null && values[i + 1] == null) lone.push(i);
  }
  return lone;
}

function chartOptions(spec, width) {
  return {
    width,
    height: CHART_HEIGHT,
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } },
    series: [
      { label: "UTC", value: (u, ts) => (ts == null ? "–" : utcTime(ts, true)) },
      ...spec.series.map((s) => ({
        label: s.label, stroke: s.stroke, width: 1.5, spanGaps: false, value: (u, v) => shortNumber(v),
        points: { show: true, size: 5, fill: s.stroke, filter: lonePoints },
      })),
    ],
    axes: [{ values: (u, splits) => splits.map((ts) => utcTime(ts)) }, { size: 52, values: (u, splits) => splits.map(shortNumber) }],
    cursor: { drag: { x: false, y: false } },
  };
}

// After the view's HTML is in place: draw its charts into their holders,
// reusing the plot of the same key (uPlot's root moves into the new holder),
// and drop the plots the view no longer shows.
function mountCharts(specs) {
  const shown = new Set();
  for (const spec of specs) {
    const holder = view.querySelector(`[data-chart="${CSS.escape(spec.key)}"]`);
    if (!holder || typeof uPlot === "undefined") continue;
    shown.add(spec.key);
    const width = Math.max(320, holder.clientWidth || 480);
    const signature = spec.series.map((s) => s.label).join("|");
    let entry = charts.get(spec.key);
    if (!entry || entry.signature !== signature) {
      entry?.plot.destroy();
      entry = { plot: new uPlot(chartOptions(spec, width), spec.data, holder), signature, width };
      charts.set(spec.key, entry);
    } else {
      holder.appendChild(entry.plot.root);
      entry.plot.setData(spec.data);
      if (entry.width !== width) {
        entry.plot.setSize({ width, height: CHART_HEIGHT });
        entry.width = width;
      }
      entry.plot.syncRect();
    }
    // For people and tests: how many values there are, their largest and their sum.
    const values = spec.data.slice(1).flat().filter((v) => v !== null && v !== undefined);
    holder.dataset.points = String(values.length);
    holder.dataset.max = String(values.reduce((a, b) => Math.max(a, b), 0));
    holder.dataset.sum = String(values.reduce((a, b) => a + b, 0));
  }
  for (const [key, entry] of charts) {
    if (!shown.has(key)) {
      entry.plot.destroy();
      charts.delete(key);
    }
  }
}

window.addEventListener("resize", () => {
  for (const entry of charts.values()) {
    const width = Math.max(320, entry.plot.root.parentElement?.clientWidth || entry.width);
    if (width !== entry.width) {
      entry.plot.setSize({ width, height: CHART_HEIGHT });
      entry.width = width;
    }
  }
});

// The figures of one series answer, as chart descriptions.
function seriesCharts(prefix, body) {
  const ms = (values) => values.map((v) => (v === null ? null : v * 1000));
  return [
    chartSpec(`${prefix}-rates`, "Jobs per second", body, [
      ["succeeded/s", body.succeeded_per_s, COLORS.succeeded],
      ["failed/s", body.failed_per_s, COLORS.failed],
      ["dead-lettered/s", body.dead_lettered_per_s, COLORS.dead],
    ]),
    chartSpec(`${prefix}-depth`, "Queue depth (runnable jobs)", body, [["depth", body.depth, COLORS.depth]]),
    chartSpec(`${prefix}-age`, "Oldest runnable job, age (s)", body, [["age s", body.oldest_runnable_age_s, COLORS.age]]),
    chartSpec(`${prefix}-lag`, "Due-to-lease lag, p99 (ms)", body, [["p99 ms", ms(body.due_to_lease_p99_s), COLORS.lag]]),
  ];
}

const chartsMissing = () =>
  typeof uPlot === "undefined" ? notAvailable("the charting library, /static/vendor/uPlot.iife.min.js") : "";

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
  // An unknown outcome nobody reconciled: the reason states how it was checked.
  "replay-reconciled-job": (id, reason) => api(`/v1/jobs/${encodeURIComponent(id)}/replay`, { method: "POST", body: { reason, reconciled: true } }),
  // ... or ask its reconcilers again.
  "reconcile-job": (id, reason) => api(`/v1/jobs/${encodeURIComponent(id)}/reconcile`, { method: "POST", body: { reason } }),
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

// Nothing at all for an action the caller's role may not take.
const actionButton = (action, target, label, danger = true) =>
  may(ACTION_PERMISSIONS[action])
    ? `<button data-action="${esc(action)}" data-target="${esc(target)}" class="${danger ? "danger" : ""}">${esc(label)}</button>`
    : "";

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-action]");
  if (!button) return;
  const { action, target } = button.dataset;
  if (!ACTIONS[action] || !may(ACTION_PERMISSIONS[action])) return;
  const decision = await confirmAction(button.textContent, `${button.textContent}: ${target}?`);
  if (!decision) return;
  button.disabled = true;
  const answer = await ACTIONS[action](target, decision.reason);
  button.disabled = false;
  if (answer.status === 401) return; // the session ended: the login form says why
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
  overviewDenied = first.status === 403;
  if (!first.ok) return first;
  const leader = first.body.node.leader;
  const base = leader?.http_url ? new URL(leader.http_url).origin : null;
  const changed = base !== leaderBase;
  setLeader(base);
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

// A token that may not read the overview finds the leader with one read
// before the view's requests (each redirect costs a failed authentication at
// the leader, see api): redirected, or answered here, which then leads.
async function findLeader() {
  if (leaderBase) return;
  const probe = await api("/v1/jobs?limit=1");
  if (probe.ok && !leaderBase) setLeader(location.origin);
}

// For a token without the cluster-wide views (a viewer scoped to some
// tenants, a submitter): a note, and the jobs it may see.
async function scopedOnCallView() {
  await findLeader();
  const [dead, recent] = await Promise.all([api("/v1/jobs?status=dead_letter&limit=20"), api("/v1/jobs?limit=20")]);
  const jobRows = (answer, rows) => (answer.ok ? table(...rows(answer.body.jobs || [])) : failed(answer, "GET /v1/jobs"));
  return `
  <section class="wide" id="scope"><h2>Cluster</h2>
    ${deniedNote("The cluster-wide views (nodes, queues, stuck jobs, recent errors, events)")}
    <p class="muted">Below: the jobs of ${me?.tenants?.includes("*") ? "every tenant" : `tenant${me?.tenants?.length === 1 ? "" : "s"} ${esc((me?.tenants || []).join(", "))}`}.</p></section>
  <section id="dlq"><h2>Dead-letter queue</h2>
    ${jobRows(dead, (jobs) => [["job", "queue", "tenant", "attempts#", "last error", ""], jobs.map((j) => [jobLink(j.id), esc(j.queue), dash(j.tenant), esc(j.attempts_made), j.last_error ? `${esc(j.last_error.kind)}: ${esc(j.last_error.message)}` : dash(null), actionButton("replay-job", j.id, "Replay", false)]), "empty"])}</section>
  <section id="recent-jobs"><h2>Recent jobs</h2>
    ${jobRows(recent, (jobs) => [["job", "queue", "status", "tenant", "updated"], jobs.map((j) => [jobLink(j.id), esc(j.queue), badge(j.status), dash(j.tenant), when(j.updated_at)]), "no jobs"])}</section>`;
}

async function onCallView() {
  if (overviewDenied) return scopedOnCallView();
  // The overview names the leader: until it is known, ask it first, or the
  // other reads would go through a follower's redirect (see api).
  const first = leaderBase ? null : await overview();
  const [over, queues, events, lastHour, subscriptions] = await Promise.all([
    first ?? overview(), api("/v1/queues"), api("/v1/events?after=0"), api("/v1/stats/series?window_s=3600"),
    may("operate") ? api("/v1/subscriptions") : null,
  ]);
  if (over.status === 403) return scopedOnCallView();
  if (!over.ok) return `<section class="wide"><h2>Cluster</h2><p class="na">cannot read this node: ${esc(errorText(over))}</p></section>`;
  const o = over.body;
  const skew = Object.fromEntries(o.clock_skew.map((s) => [s.node_id, s]));
  const nodeRow = (n, self) => {
    const s = skew[n.id];
    return [
      `<a href="${esc(n.http_url)}/">${esc(n.id)}</a>${self ? ' <span class="muted">(answering)</span>' : ""}`,
      badge(self ? n.role : n.reachable ? n.role : "unreachable") + (n.status && n.status !== "member" ? ` ${badge(n.status)}` : ""),
      self ? esc(n.term) : dash(null),
      self ? esc(n.applied_index) : dash(n.match_index),
      badge(n.reachable === false ? "unreachable" : "ok"),
      s ? `${num(s.skew_ms, 1)} ms <span class="muted">±${num(s.round_trip_ms / 2, 1)}</span>` : dash(null),
    ];
  };
  const nodes = [nodeRow({ ...o.node, reachable: true, status: o.node.removed ? "removed" : "member" }, true), ...o.node.peers.map((p) => nodeRow(p, false))];
  const change = o.node.membership_change;
  const changeLine = change
    ? `<p id="membership-change">Membership change in progress: ${badge(change.kind)} <b>${esc(change.id)}</b> ${esc(change.raft_address)} ${badge(change.phase)}</p>`
    : "";
  const limitsByQueue = queues.ok ? Object.fromEntries((queues.body.queues || []).map((q) => [q.name, q])) : {};
  const rate = rates(o.counters || {});
  const queueRows = o.queues.map((q) => {
    const limits = limitsByQueue[q.name];
    const r = rate[q.name];
    const limitText = !queues.ok
      ? `<span class="na">${queues.status === 403 ? "not shown to this token" : "not available"}</span>`
      : limits
        ? [
            limits.paused ? badge("paused") : "",
            limits.rate_limit_per_s != null ? `${esc(limits.rate_limit_per_s)}/s` : "",
            limits.concurrency_limit != null ? `max ${esc(limits.concurrency_limit)}` : "",
          ].filter(Boolean).join(" ") || '<span class="muted">none</span>'
        : '<span class="muted">none</span>';
    const paused = limits?.paused;
    return [
      `<a href="#/jobs?queue=${encodeURIComponent(q.name)}">${esc(q.name)}</a> <a class="muted" href="#/charts?queue=${encodeURIComponent(q.name)}" title="the last hour of ${esc(q.name)}">chart</a>`,
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
  if (!events.ok) outbox = failed(events, "GET /v1/events");
  else {
    const list = events.body.events || [];
    outbox = `<p>last event seq <b>${esc(lastSeqs(events.body.last_seq))}</b>${o.outbox_lag ? `, undelivered per subscription: ${Object.entries(o.outbox_lag).map(([k, v]) => `${esc(k)} ${esc(v)}`).join(", ") || "no subscriptions"}` : ""}</p>` +
      table(["seq#", "type", "at"], list.slice(-10).reverse().map((e) => [e.id ? `<span class="mono" title="shard ${esc(e.shard)}, seq ${esc(e.seq)}">${esc(e.id)}</span>` : esc(e.seq), esc(e.type), when(e.at)]), "no events");
  }
  const relays = relayTable(subscriptions);
  // The cluster's last hour: jobs per second and depth (the rest: Charts).
  const hourCharts = lastHour.ok ? seriesCharts("oncall", lastHour.body).slice(0, 2) : [];
  const hour = lastHour.ok
    ? `${chartsMissing()}<div class="charts">${hourCharts.map(chartHolder).join("")}</div>`
    : failed(lastHour, "GET /v1/stats/series");
  const html = `
  <section class="wide" id="nodes"><h2>Nodes <span class="muted">term ${esc(o.node.term)}, commit ${esc(o.node.commit_index)}, leader ${esc(o.node.leader?.id ?? "none")}</span></h2>
    ${table(["node", "role", "term#", "applied / match#", "reachable", "clock skew vs leader"], nodes)}
    ${changeLine}
    <p class="muted">Jobs: ${counts || "none"} · replicated time ${esc(o.now ?? "–")}</p></section>
  <section class="wide" id="queues"><h2>Queues</h2>
    ${table(["queue", "depth#", "running#", "oldest runnable", "submitted/min#", "succeeded/min#", "failed/min#", "limits", ""], queueRows, "no queues yet")}
    ${queues.missing ? notAvailable("GET /v1/queues: limits and pause") : ""}</section>
  <section class="wide" id="last-hour"><h2>Last hour <span class="muted">the whole cluster, 5 s buckets, as node ${esc(lastHour.body?.node_id ?? "–")} counts them · <a href="#/charts">all charts</a></span></h2>${hour}</section>
  <section id="stuck"><h2>Stuck jobs <span class="muted">(no heartbeat progress for ${esc(o.stuck_after_s)} s)</span></h2>
    ${table(["job", "queue", "worker", "quiet", ""], o.stuck_jobs.map((j) => [jobLink(j.job_id), esc(j.queue), dash(j.worker_id), ago(j.quiet_s), actionButton("cancel-job", j.job_id, "Cancel job")]), "none")}</section>
  <section id="dlq"><h2>Dead-letter queue <span class="muted">${esc(o.status_counts.dead_letter ?? 0)} jobs</span></h2>
    ${table(["job", "queue", "kind", "attempts#", "last error", ""], o.dead_letters.map((j) => [jobLink(j.id), esc(j.queue), dash(j.kind), esc(j.attempts_made), (j.unreconciled ? `${badge("unreconciled")} ` : "") + (j.last_error ? `${esc(j.last_error.kind)}: ${esc(j.last_error.message)}` : dash(null)), j.unreconciled ? `${actionButton("reconcile-job", j.id, "Reconcile", false)} ${actionButton("replay-reconciled-job", j.id, "Reconciled: replay", false)}` : actionButton("replay-job", j.id, "Replay", false)]), "empty")}</section>
  <section id="errors"><h2>Recent errors</h2>
    ${table(["at", "what", "kind", "job", "message"], o.recent_errors.map((e) => [when(ms(e.at_ms)), esc(e.source), esc(e.kind), e.job_id ? jobLink(e.job_id) : dash(null), esc(e.message)]), "none")}</section>
  <section id="leaders"><h2>Leader history <span class="muted">(seen by ${esc(o.node.id)})</span></h2>
    ${table(["at", "term#", "leader", "previous"], o.leader_history.map((c) => [when(ms(c.at_ms)), esc(c.term), dash(c.leader_id), dash(c.previous_id)]), "no change seen")}</section>
  <section id="outbox"><h2>Events (outbox)</h2>${outbox}</section>
  <section class="wide" id="subscriptions"><h2>Subscriptions <span class="muted">each relay to a webhook or a broker</span></h2>${relays}</section>`;
  return { html, charts: hourCharts };
}

// Every subscription's relay (docs/relays.md, section 5) from
// `GET /v1/subscriptions` (null: the role may not read it): its sink kind,
// where it goes (the answer shows a broker URL's password as `***`), its lag
// in events and in age of the oldest event waiting, its parked events, and
// whether its last attempt reached the broker or receiver (the leader's
// knowledge: unknown until the relay has tried).
function relayTable(answer) {
  if (answer === null) return deniedNote("Subscriptions");
  if (!answer.ok) return failed(answer, "GET /v1/subscriptions");
  const destination = (s) =>
    s.sink
      ? [s.sink.url, ...Object.entries(s.sink).filter(([name]) => name !== "kind" && name !== "url").map(([name, value]) => `${name} ${value}`)].filter(Boolean).join(" · ")
      : s.url;
  const connection = (connected) =>
    connected === true ? badge("connected") : connected === false ? badge("unreachable") : '<span class="muted" title="known to the leader once its relay has tried">–</span>';
  const rows = (answer.body.subscriptions || []).map((s) => [
    `<span class="mono" data-subscription="${esc(s.id)}">${esc(s.id)}</span>`,
    badge(s.sink?.kind ?? "webhook"),
    `<span class="mono">${esc(destination(s))}</span>`,
    s.types?.length ? esc(s.types.join(", ")) : '<span class="muted">every type</span>',
    dash(s.lag_events),
    s.lag_s ? ago(s.lag_s) : dash(null), // 0: nothing waits
    s.parked_count ? `<b>${esc(s.parked_count)}</b>` : esc(s.parked_count ?? 0),
    connection(s.connected),
  ]);
  return table(["subscription", "sink", "destination", "types", "lag (events)#", "oldest waiting", "parked#", "connection"], rows, "no subscriptions");
}

// Charts of the last hour (or 15 minutes), for the cluster or one queue,
// from `GET /v1/stats/series` (docs/observability.md, "Charts").
async function chartsView(params) {
  const queue = params.get("queue") || "";
  const windowS = SERIES_WINDOWS.some(([s]) => String(s) === params.get("window_s")) ? Number(params.get("window_s")) : 3600;
  const query = new URLSearchParams({ window_s: String(windowS) });
  if (queue) query.set("queue", queue);
  const [answer, whole] = await Promise.all([api(`/v1/stats/series?${query}`), queue ? api("/v1/stats/series?window_s=5") : null]);
  const queues = (answer.ok ? answer.body : whole?.ok ? whole.body : null)?.queues ?? [];
  const link = (name, label, current) => {
    const target = new URLSearchParams({ window_s: String(windowS) });
    if (name) target.set("queue", name);
    return current ? `<b>${esc(label)}</b>` : `<a href="#/charts?${target}">${esc(label)}</a>`;
  };
  const picker = [link("", "whole cluster", !queue), ...queues.map((name) => link(name, name, name === queue))].join(" · ");
  const windows = SERIES_WINDOWS.map(([s, label]) => {
    const target = new URLSearchParams({ window_s: String(s) });
    if (queue) target.set("queue", queue);
    return s === windowS ? `<b>${esc(label)}</b>` : `<a href="#/charts?${target}">${esc(label)}</a>`;
  }).join(" · ");
  const title = queue ? `queue ${esc(queue)}` : "the whole cluster";
  const head = `<section class="wide" id="charts"><h2>Charts <span class="muted">${title}</span></h2>
    <p id="chart-picker">Show: ${picker}</p><p>Window: ${windows}</p>`;
  if (!answer.ok) return `${head}${failed(answer, "GET /v1/stats/series")}</section>`;
  const b = answer.body;
  const specs = seriesCharts("charts", b);
  return {
    html: `${head}<p class="muted">5 s buckets, counted by node ${esc(b.node_id)} by replicated time (every node counts the same);
      depth and age sampled by it since ${when(b.sampling_since)}. Gaps: what this node cannot know.</p>${chartsMissing()}</section>
    <section class="wide" id="chart-grid"><div class="charts">${specs.map(chartHolder).join("")}</div></section>`,
    charts: specs,
  };
}

const SEARCH_FIELDS = [
  ["id", "job id"],
  ["idempotency_key", "idempotency key"],
  ["queue", "queue"],
  ["kind", "kind"],
  ["status", "status"],
  ["tenant", "tenant"],
  ["correlation_id", "correlation id"],
];
const STATUSES = ["", "scheduled", "pending", "claimed", "running", "retry_wait", "reconciling", "succeeded", "dead_letter", "cancelled"];

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
    if (results === null) return searchPage(form, failed(answer, "GET /v1/jobs/{id}"));
  } else {
    const query = new URLSearchParams();
    for (const [key] of SEARCH_FIELDS) if (params.get(key)) query.set(key, params.get(key));
    query.set("limit", "50");
    const answer = await api(`/v1/jobs?${query}`);
    if (!answer.ok) return searchPage(form, failed(answer, "GET /v1/jobs"));
    results = answer.body.jobs;
  }
  const rows = results.map((j) => [jobLink(j.id), esc(j.queue), dash(j.kind), badge(j.status), esc(j.attempts_made), dash(j.tenant), dash(j.idempotency_key), dash(j.correlation_id), when(j.updated_at)]);
  return searchPage(form, table(["job", "queue", "kind", "status", "attempts#", "tenant", "idempotency key", "correlation id", "updated"], rows, "no matching jobs"));
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
  const [jobAnswer, historyAnswer, effectsAnswer] = await Promise.all([
    api(`/v1/jobs/${encodeURIComponent(id)}`),
    api(`/v1/jobs/${encodeURIComponent(id)}/history`),
    api(`/v1/jobs/${encodeURIComponent(id)}/effects`),
  ]);
  if (!jobAnswer.ok) return `<section class="wide"><h2>Job ${esc(id)}</h2>${failed(jobAnswer, "GET /v1/jobs/{id}")}</section>`;
  const j = jobAnswer.body.job;
  const final = ["succeeded", "dead_letter", "cancelled"].includes(j.status);
  const actions = [
    !final && !j.cancel_requested ? actionButton("cancel-job", j.id, "Cancel job") : "",
    j.status === "dead_letter" ? actionButton("replay-job", j.id, "Replay", false) : "",
  ].join("");
  const fields = [
    ["status", badge(j.status) + (j.cancel_requested ? " " + badge("cancel requested") : "")],
    ["queue", esc(j.queue)], ["kind", dash(j.kind)], ["tenant", esc(j.tenant)], ["priority", esc(j.priority)],
    ["attempts", `${esc(j.attempts_made)} of ${esc(j.max_attempts)}`],
    ["idempotency key", dash(j.idempotency_key)], ["correlation id", dash(j.correlation_id)],
    ["ordering key", dash(j.ordering_key)],
    ["trace", j.traceparent ? `<span title="${esc(j.traceparent)}${j.tracestate ? " · " + esc(j.tracestate) : ""}">${esc(j.traceparent.split("-")[1] || j.traceparent)}</span>` : dash(null)],
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
  <section id="effects"><h2>Effects <span class="muted">recorded in the effects ledger, first writer wins</span></h2>${effectsTable(effectsAnswer)}</section>
  <section id="history"><h2>Timeline</h2>${historyAnswer.ok ? `<ol class="timeline">${timeline}</ol>` : failed(historyAnswer, "GET /v1/jobs/{id}/history")}</section>`;
}

// The effects a job recorded (`GET /v1/jobs/{id}/effects`), oldest first;
// each with the attempt's fencing token, so a repeated side effect shows.
function effectsTable(answer) {
  if (!answer.ok) return failed(answer, "GET /v1/jobs/{id}/effects");
  const { effects, total } = answer.body;
  const rows = effects.map((e) => [`<span class="mono">${esc(e.key)}</span>`, esc(e.fencing_token), esc(e.epoch), when(e.recorded_at), e.result === null ? dash(null) : `<code>${esc(JSON.stringify(e.result))}</code>`]);
  const more = total > effects.length ? `<p class="muted">${esc(effects.length)} of ${esc(total)} shown</p>` : "";
  return table(["key", "token#", "epoch#", "recorded", "result"], rows, "none recorded") + more;
}

async function schedulesView() {
  const answer = await api("/v1/schedules");
  if (!answer.ok) return `<section class="wide"><h2>Schedules</h2>${failed(answer, "GET /v1/schedules")}</section>`;
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
  if (!answer.ok) return `<section class="wide"><h2>Schedule ${esc(id)}</h2>${failed(answer, "GET /v1/schedules/{id}")}</section>`;
  const s = answer.body.schedule ?? answer.body;
  const actions = [
    s.paused ? actionButton("resume-schedule", s.id, "Resume schedule", false) : actionButton("pause-schedule", s.id, "Pause schedule"),
    actionButton("trigger-schedule", s.id, "Trigger now", false),
  ].join("");
  const fields = Object.entries(s).filter(([k]) => k !== "job").map(([k, v]) => `<dt>${esc(k)}</dt><dd>${typeof v === "object" && v !== null ? `<code>${esc(JSON.stringify(v))}</code>` : dash(v)}</dd>`).join("");
  let occ;
  if (!occurrences.ok) occ = failed(occurrences, "GET /v1/schedules/{id}/occurrences");
  else occ = table(["nominal time", "decided", "decision", "job", "reason"], (occurrences.body.occurrences || []).map((o) => [when(o.nominal_time), when(o.decided_at), badge(o.decision), o.job_id ? jobLink(o.job_id) : dash(null), dash(o.reason)]), "no occurrences yet");
  return `
  <section class="wide" id="schedule"><h2>Schedule ${esc(s.id)}</h2><div class="actions">${actions}</div><dl class="kv">${fields}</dl></section>
  <section class="wide" id="occurrences"><h2>Occurrences and decisions</h2>${occ}</section>`;
}

async function workflowsView() {
  const answer = await api("/v1/workflows");
  if (!answer.ok) return `<section class="wide"><h2>Workflows</h2>${failed(answer, "GET /v1/workflows")}</section>`;
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
  if (!answer.ok) return `<section class="wide"><h2>Workflow ${esc(id)}</h2>${failed(answer, "GET /v1/workflows/{id}")}</section>`;
  const w = answer.body.workflow;
  const steps = Array.isArray(w.steps) ? Object.fromEntries(w.steps.map((s) => [s.name, s])) : w.steps || {};
  const final = ["succeeded", "failed", "cancelled", "timed_out"].includes(w.status);
  const rows = Object.entries(steps).map(([name, s]) => [esc(name), badge(s.status || "waiting"), s.job_id ? jobLink(s.job_id) : dash(null), dash(s.kind), dash((s.depends_on || []).join(", ")), s.result === undefined || s.result === null ? dash(null) : `<code>${esc(JSON.stringify(s.result))}</code>`]);
  return `
  <section class="wide" id="workflow"><h2>Workflow <span class="mono">${esc(w.id)}</span> ${badge(w.status)}</h2>
    <div class="actions">${final ? "" : actionButton("cancel-workflow", w.id, "Cancel workflow")}</div>
    ${stepGraph(steps)}</section>
  <section class="wide" id="steps"><h2>Steps</h2>${table(["step", "state", "job", "kind", "depends on", "result"], rows, "no steps")}</section>`;
}

// The reconciliation report (docs/reconciliation.md): jobs waiting for a
// reconcile decision, unknown outcomes per queue and hour, how
// reconciliations ended, and the jobs reconciliation completed. Tenant-scoped
// like the job lists, so every role that reads jobs sees its own part.
const REPORT_WINDOWS = [[1, "1 h"], [24, "24 h"], [168, "7 days"]];

// One bar per hour, oldest first; each says its hour and count on hover.
function hourBars(buckets, counts) {
  const W = 6, GAP = 1, H = 28;
  const top = Math.max(1, ...counts);
  const bars = counts.map((n, i) => {
    const h = n ? Math.max(2, Math.round((n / top) * H)) : 0;
    return `<rect x="${i * (W + GAP)}" y="${H - h}" width="${W}" height="${h}"><title>${esc(buckets[i])}: ${esc(n)}</title></rect>`;
  });
  return `<svg class="bars" width="${counts.length * (W + GAP)}" height="${H}" role="img" aria-label="unknown outcomes per hour">${bars.join("")}</svg>`;
}

async function reconciliationView(params) {
  const hours = Number(params.get("hours")) || 24;
  const answer = await api(`/v1/reconciliation?hours=${encodeURIComponent(hours)}`);
  if (!answer.ok) return `<section class="wide" id="reconciliation"><h2>Reconciliation</h2>${failed(answer, "GET /v1/reconciliation")}</section>`;
  const r = answer.body;
  const windows = REPORT_WINDOWS.map(([h, label]) => (h === r.hours ? `<b>${esc(label)}</b>` : `<a href="#/reconciliation?hours=${h}">${esc(label)}</a>`)).join(" · ");
  const more = (list) => (list.truncated ? `<p class="muted">${esc(list.jobs.length)} of ${esc(list.total)} shown</p>` : "");
  const waiting = r.reconciling.jobs.map((j) => [
    jobLink(j.job_id), esc(j.queue), dash(j.tenant), esc(j.attempt), when(j.since), esc(j.tries), esc(j.reconcile_queue),
    // Same format, so the strings compare as the instants do.
    j.lease
      ? `${esc(j.lease.worker_id)} · token ${esc(j.lease.fencing_token)} · until ${when(j.lease.expires_at)}`
      : j.available_at > r.now ? `<span class="muted">offered again at</span> ${when(j.available_at)}` : '<span class="muted">waiting for a reconciler</span>',
  ]);
  const unknown = r.unknown_outcomes.queues.map((q) => [
    `<a href="#/jobs?queue=${encodeURIComponent(q.queue)}">${esc(q.queue)}</a>`, esc(q.total), hourBars(r.unknown_outcomes.buckets, q.counts),
  ]);
  const endings = r.decisions.map((d) => [esc(d.queue), esc(d.happened), esc(d.did_not_happen), esc(d.cannot_tell), esc(d.unanswered)]);
  const completed = r.completed.jobs.map((j) => [jobLink(j.job_id), esc(j.queue), dash(j.tenant), when(j.completed_at), esc(j.worker_id), dash(j.fencing_token), dash(j.evidence)]);
  return `
  <section class="wide" id="reconciliation"><h2>Reconciliation <span class="muted">since ${when(r.since)}</span></h2>
    <p>Window: ${windows} · replicated time ${when(r.now)}</p></section>
  <section class="wide" id="reconciling"><h2>Waiting for a reconcile decision <span class="muted">${esc(r.reconciling.total)} jobs</span></h2>
    ${table(["job", "queue", "tenant", "attempt#", "reconciling since", "expired tries#", "reconcile queue", "lease"], waiting, "none")}${more(r.reconciling)}</section>
  <section id="unknown-outcomes"><h2>Unknown outcomes per queue <span class="muted">per hour, oldest first</span></h2>
    ${table(["queue", "total#", "per hour"], unknown, "none in this window")}</section>
  <section id="decisions"><h2>Reconciliations ended</h2>
    ${table(["queue", "happened#", "did not happen#", "cannot tell#", "unanswered#"], endings, "none in this window")}</section>
  <section class="wide" id="completed"><h2>Completed by reconciliation <span class="muted">${esc(r.completed.total)} jobs</span></h2>
    ${table(["job", "queue", "tenant", "completed", "reconciler", "token#", "evidence"], completed, "none in this window")}${more(r.completed)}</section>`;
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
  if (parts[0] === "reconciliation") return ["reconciliation", () => reconciliationView(params)];
  if (parts[0] === "charts") return ["charts", () => chartsView(params)];
  return ["oncall", onCallView];
}

async function refresh() {
  if (!me) return; // logged out: the login form is showing
  const seq = ++renderSeq;
  const [name, render] = route();
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.dataset.nav === name));
  try {
    if (!leaderBase && !overviewDenied && name !== "oncall") await overview();
    if (overviewDenied) await findLeader();
    const out = await render();
    if (seq !== renderSeq || !me) return; // a newer render started meanwhile, or logged out
    // A view answers its HTML, or {html, charts} when it draws charts.
    const html = typeof out === "string" ? out : out.html;
    // Keep what the user is typing in the search form.
    const active = document.activeElement;
    if (active && isSearchForm(active.form)) return;
    if (document.getElementById("confirm").open) return;
    view.innerHTML = html;
    mountCharts(typeof out === "string" ? [] : out.charts);
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
  if (!me) return;
  previousCounters = null;
  refresh();
  schedulePolling();
});

// -- logging in and out -------------------------------------------------------

const loginSection = document.getElementById("login");
const loginMessage = document.getElementById("login-message");
const secretInput = document.getElementById("login-secret");

// whoami's answer as `me`: the token's record, or auth off.
function principal(body) {
  if (body?.auth !== "on" || !body.token) return { auth: "off", name: body?.principal?.name ?? "anonymous", role: "admin", tenants: ["*"], queues: ["*"] };
  const t = body.token;
  return { auth: "on", id: t.id, name: t.name, role: t.role, tenants: t.tenants || [], queues: t.queues || [] };
}

function showWho() {
  const who = document.getElementById("who");
  const off = me.auth === "off";
  document.getElementById("who-name").textContent = off ? "authentication off" : me.name;
  const role = document.getElementById("who-role");
  role.textContent = off ? "" : me.role;
  role.hidden = off;
  const scope = [];
  if (!off) scope.push(me.tenants.includes("*") ? "all tenants" : `tenants: ${me.tenants.join(", ")}`);
  if (!off && !me.queues.includes("*")) scope.push(`queues: ${me.queues.join(", ")}`);
  document.getElementById("who-scope").textContent = scope.join(" · ");
  document.getElementById("logout").hidden = off;
  who.hidden = false;
  who.dataset.role = off ? "" : me.role;
}

function showApp() {
  loginSection.hidden = true;
  loginMessage.textContent = "";
  secretInput.value = "";
  document.getElementById("nav").hidden = false;
  view.hidden = false;
  showWho();
  refresh();
  schedulePolling();
}

function showLogin(message = "") {
  me = null;
  setLeader(null);
  overviewDenied = false;
  previousCounters = null;
  clearInterval(pollTimer);
  renderSeq++; // drop any render under way
  view.innerHTML = "";
  mountCharts([]);
  view.hidden = true;
  delete view.dataset.view;
  document.getElementById("confirm").close?.();
  document.getElementById("nav").hidden = true;
  document.getElementById("who").hidden = true;
  statusLine.textContent = "not logged in";
  loginMessage.textContent = message;
  secretInput.value = "";
  loginSection.hidden = false;
  secretInput.focus();
}

// A 401 on any call: the token was revoked or expired (or the cluster has
// just turned authentication on). Back to the login form, saying why.
function sessionEnded(answer) {
  const had = secret() !== null;
  sessionStorage.removeItem(TOKEN_KEY);
  if (loginSection.hidden === false) return;
  const why = answer.body?.error?.message || "the token was refused";
  showLogin(had ? `Your session ended: ${why}. Log in again with a valid token.` : "This cluster now requires a token: log in.");
}

document.getElementById("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const candidate = secretInput.value.trim();
  secretInput.value = ""; // the secret does not stay in the page
  if (!candidate) return;
  const button = document.getElementById("login-submit");
  button.disabled = true;
  loginMessage.textContent = "";
  const answer = await api("/v1/whoami", { local: true, token: candidate, login: true });
  button.disabled = false;
  if (answer.ok) {
    if (answer.body?.auth === "on") sessionStorage.setItem(TOKEN_KEY, candidate);
    me = principal(answer.body);
    showApp();
  } else if (answer.status === 429) {
    const after = answer.body?.error?.details?.retry_after_s;
    loginMessage.textContent = `Too many failed logins from this address; try again in ${after ?? "a few"} s.`;
  } else if (answer.status === 401) {
    loginMessage.textContent = `That token was refused: ${answer.body?.error?.message ?? "not valid"}.`;
  } else {
    loginMessage.textContent = `Cannot log in: ${errorText(answer)}`;
  }
  secretInput.focus();
});

document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin("Logged out.");
});

// First: who are we? Without a stored token, the public /readyz says whether
// this node requires one (asking whoami without a token would count as a
// failed authentication); while the cluster has no tokens whoami answers 200
// with auth "off" and the page works without asking.
async function start() {
  if (secret() === null) {
    const ready = await api("/readyz", { local: true, login: true });
    if (ready.body?.auth === "on") return showLogin();
  }
  const answer = await api("/v1/whoami", { local: true, login: true });
  if (answer.ok) {
    me = principal(answer.body);
    showApp();
  } else if (answer.status === 401 || answer.status === 429) {
    const had = secret() !== null;
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin(had ? `Your session ended: ${answer.body?.error?.message ?? "the token was refused"}. Log in again.` : "");
  } else {
    statusLine.textContent = `cannot reach this node: ${errorText(answer)}; retrying`;
    setTimeout(start, POLL_MS);
  }
}

start();
