// The fleet status page. The server does the work: the page asks for the summary, one page
// of the members its view names (filtered, sorted with what needs attention first) and, less
// often, the rosters and rollouts. Every request carries the entity tag of the last answer,
// so an unchanged view costs a 304; the next request is sent only after the last one was
// drawn, failures back off, and a hidden tab asks for nothing. The view (filters and page)
// lives in the URL, so it can be shared and bookmarked.
// Every name from the fleet goes into the page through textContent (never as markup), and
// the Content-Security-Policy allows no inline script, so a hostile host name stays text.
"use strict";

const REFRESH_MS = 2000;
const MAX_BACKOFF_MS = 60000;
const PAGE_SIZE = 100;
// The rosters and rollouts cost the server more and change seldom: every this many rounds.
const OVERVIEW_EVERY = 5;
const FILTER_KEYS = ["host", "state", "cluster", "type", "version", "failing", "duplicate"];

// What the last answers were, per URL: {tag, data}.
const answers = new Map();
let offsetToServer = 0; // the server's clock minus ours, seconds
let timer = null;
let running = false;
let round = 0;
let failures = 0;
// Set when the view changed during a round: the next round starts as soon as it ends.
let again = false;
// Counted for the browser test: requests sent.
window.ccfleetRequests = 0;
// For the browser test: whether a round runs or is scheduled.
window.ccfleetBusy = () => running || timer !== null;
// For the page's measurement: when the summary was first drawn (ms after the navigation
// that loaded the page began: the login's form post, when it led here).
window.ccfleetSummaryDrawnAt = null;

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function now() {
  return Math.floor(Date.now() / 1000) + offsetToServer;
}

function age(then) {
  if (then === null || then === undefined) return "never";
  const s = Math.max(0, now() - then);
  if (s < 120) return s + " s ago";
  if (s < 7200) return Math.floor(s / 60) + " min ago";
  if (s < 172800) return Math.floor(s / 3600) + " h ago";
  return Math.floor(s / 86400) + " d ago";
}

function table(headings, rows) {
  const t = el("table");
  const head = t.createTHead().insertRow();
  for (const h of headings) head.appendChild(el("th", h));
  const body = t.createTBody();
  for (const row of rows) body.appendChild(row);
  return t;
}

function row(cells, className) {
  const tr = el("tr", null, className);
  for (const cell of cells) {
    if (cell instanceof Node) {
      const td = el("td");
      td.appendChild(cell);
      tr.appendChild(td);
    } else {
      tr.appendChild(el("td", cell));
    }
  }
  return tr;
}

// --- the view, kept in the URL ---------------------------------------------------------

function view() {
  const params = new URLSearchParams(window.location.search);
  const v = { page: Math.max(0, parseInt(params.get("page") || "0", 10) || 0) };
  for (const key of FILTER_KEYS) v[key] = params.get(key) || "";
  return v;
}

function setView(changes, keepPage) {
  const v = Object.assign(view(), changes);
  if (!keepPage) v.page = 0;
  const params = new URLSearchParams();
  for (const key of FILTER_KEYS) if (v[key]) params.set(key, v[key]);
  if (v.page > 0) params.set("page", String(v.page));
  const search = params.toString();
  history.pushState(null, "", "/fleet/" + (search ? "?" + search : "") + "#members");
  showView();
  refreshNow();
}

// The server's query for a view: a search without pattern characters finds names that
// contain it.
function filterQuery(v) {
  const q = new URLSearchParams();
  if (v.host) q.set("host", /[*?[\],]/.test(v.host) ? v.host : "*" + v.host + "*");
  for (const key of ["state", "cluster", "type", "version"]) if (v[key]) q.set(key, v[key]);
  if (v.failing) q.set("failing", "true");
  if (v.duplicate) q.set("duplicate", "true");
  return q;
}

function showView() {
  const v = view();
  document.getElementById("f-host").value = v.host;
  document.getElementById("f-state").value = v.state;
  ensureOption(document.getElementById("f-cluster"), v.cluster);
  document.getElementById("f-cluster").value = v.cluster;
  ensureOption(document.getElementById("f-type"), v.type);
  document.getElementById("f-type").value = v.type;
  document.getElementById("f-version").value = v.version;
  document.getElementById("f-failing").checked = v.failing === "true";
  document.getElementById("f-duplicate").checked = v.duplicate === "true";
}

function ensureOption(select, value) {
  if (value === "" || [...select.options].some((o) => o.value === value)) return;
  const option = el("option", value === "" ? "infrastructure" : value);
  option.value = value;
  select.appendChild(option);
}

function readForm() {
  return {
    host: document.getElementById("f-host").value.trim(),
    state: document.getElementById("f-state").value,
    cluster: document.getElementById("f-cluster").value,
    type: document.getElementById("f-type").value,
    version: document.getElementById("f-version").value.trim(),
    failing: document.getElementById("f-failing").checked ? "true" : "",
    duplicate: document.getElementById("f-duplicate").checked ? "true" : "",
  };
}

// --- fetching ---------------------------------------------------------------------------

class SessionEnded extends Error {}

// Asks `url`, sending the last tag; answers the data (the last one on 304).
async function get(url) {
  const last = answers.get(url);
  const headers = last ? { "If-None-Match": last.tag } : {};
  window.ccfleetRequests += 1;
  const response = await fetch(url, { credentials: "same-origin", cache: "no-store", headers });
  if (response.status === 401) throw new SessionEnded();
  if (response.status === 304 && last) return last.data;
  if (!response.ok) {
    let reason = "";
    try {
      reason = (await response.json()).error || "";
    } catch (e) {
      reason = "";
    }
    throw new Error("The server answered " + response.status + (reason ? ": " + reason : ""));
  }
  const data = await response.json();
  offsetToServer = data.now - Math.floor(Date.now() / 1000);
  answers.set(url, { tag: response.headers.get("ETag") || "", data });
  // Only the latest answer of each route is worth keeping.
  for (const key of answers.keys()) {
    if (key !== url && key.split("?")[0] === url.split("?")[0]) answers.delete(key);
  }
  return data;
}

async function refresh() {
  const v = view();
  const filters = filterQuery(v);
  const rows = new URLSearchParams(filters);
  rows.set("sort", "state");
  rows.set("offset", String(v.page * PAGE_SIZE));
  rows.set("limit", String(PAGE_SIZE));
  const wantOverview = round % OVERVIEW_EVERY === 0;
  round += 1;
  const [all, shown, listed, overview] = await Promise.all([
    get("/fleet/summary.json"),
    filters.toString() ? get("/fleet/summary.json?" + filters) : null,
    get("/fleet/instances.json?" + rows),
    wantOverview ? get("/fleet/overview.json") : null,
  ]);
  const whole = expandSummary(all);
  drawSummary(whole, shown ? expandSummary(shown) : null);
  drawGroups(whole);
  drawInstances(listed, v);
  if (overview) {
    drawUser(overview);
    drawRosters(overview);
    drawRollouts(overview);
    drawStaged(overview);
  }
}

function schedule(ms) {
  clearTimeout(timer);
  timer = null;
  if (document.hidden) return;
  timer = setTimeout(cycle, ms);
}

// One round: ask, draw, then schedule the next (later after failures).
async function cycle() {
  if (running || document.hidden) return;
  running = true;
  try {
    await refresh();
    failures = 0;
    showError("");
  } catch (e) {
    if (e instanceof SessionEnded) {
      showError("The session ended: log in again.");
      // The login leads back to the view the URL names.
      window.location.assign("/fleet/login" + window.location.search);
      running = false;
      return;
    }
    failures += 1;
    showError((e instanceof TypeError ? "The server cannot be reached" : e.message) +
      "; retrying.");
  }
  running = false;
  const delay = again ? 0 : Math.min(MAX_BACKOFF_MS, REFRESH_MS * 2 ** Math.min(failures, 5));
  again = false;
  schedule(delay);
}

function refreshNow() {
  round = 0;
  if (running) {
    again = true;
    return;
  }
  schedule(0);
}

function showError(text) {
  const box = document.getElementById("error");
  box.textContent = text;
  box.hidden = text === "";
}

// --- drawing ----------------------------------------------------------------------------

function members(c) {
  return c.active + c.pending + c.stale;
}

// The summary as the server answers it (the compact form: zeros and empty lists left out,
// a state needing attention as [count, hosts], the stale ones with the oldest one's last
// sign of life) with every count and host list written out, as the page draws it.
function expandSummary(data) {
  const count = (listed) => (listed ? listed[0] : 0);
  const hosts = (listed) => (listed ? listed[1] : "");
  return {
    now: data.now,
    staleAfterSeconds: data.staleAfterSeconds,
    total: Object.assign({ active: 0, pending: 0, stale: 0, duplicate: 0, failing: 0 },
      data.total),
    groups: data.groups.map((g) => ({
      cluster: g.cluster || "",
      serviceType: g.type,
      counts: { active: g.active || 0, stale: count(g.stale), pending: count(g.pending),
        failing: count(g.failing), duplicate: count(g.duplicate) },
      hosts: { stale: hosts(g.stale), pending: hosts(g.pending), failing: hosts(g.failing),
        duplicate: hosts(g.duplicate) },
      oldestStaleSince: g.stale ? g.stale[2] : null,
    })),
  };
}

// `filteredSummary`: the summary of the members the filters pass, null without filters.
function drawSummary(all, filteredSummary) {
  const filtered = filteredSummary !== null;
  const shown = filtered ? filteredSummary : all;
  const t = shown.total;
  document.getElementById("summary").textContent =
    members(t) + " instance(s) in " + shown.groups.length + " group(s)" +
    (filtered ? " match the filters (of " + members(all.total) + ")" : "") + ": " +
    t.active + " active, " + t.pending + " pending, " + t.stale + " stale, " + t.failing +
    " failing, " + t.duplicate + " duplicate. Stale after " + all.staleAfterSeconds +
    " s without a heartbeat. Updated " + new Date(now() * 1000).toLocaleTimeString() + ".";
  if (window.ccfleetSummaryDrawnAt === null) window.ccfleetSummaryDrawnAt = performance.now();
}

function drawUser(data) {
  document.getElementById("user").textContent = data.user === null ? "" : "logged in as " + data.user;
  document.getElementById("logout-form").hidden = data.user === null;
}

// A link that changes the view.
function viewLink(text, changes) {
  const a = el("a", text, "view-link");
  const v = Object.assign({}, changes);
  const params = new URLSearchParams();
  for (const key of FILTER_KEYS) if (v[key]) params.set(key, v[key]);
  a.href = "/fleet/?" + params + "#members";
  a.addEventListener("click", (event) => {
    event.preventDefault();
    setView(Object.assign({ host: "", state: "", cluster: "", type: "", version: "",
      failing: "", duplicate: "" }, changes));
  });
  return a;
}

function countCell(n, changes, className) {
  return n === 0 ? el("span", "0", "zero") : (() => {
    const a = viewLink(String(n), changes);
    a.classList.add(className);
    return a;
  })();
}

let groupsKey = "";

function drawGroups(all) {
  const key = JSON.stringify(all.groups);
  const box = document.getElementById("groups");
  const clusters = document.getElementById("f-cluster");
  const types = document.getElementById("f-type");
  for (const g of all.groups) {
    ensureOption(clusters, g.cluster);
    ensureOption(types, g.serviceType);
  }
  if (key === groupsKey) {
    for (const cell of box.querySelectorAll("[data-since]")) {
      cell.textContent = age(Number(cell.dataset.since));
    }
    return;
  }
  groupsKey = key;
  box.replaceChildren();
  if (all.groups.length === 0) {
    box.appendChild(el("p", "No instance is registered.", "hint"));
    return;
  }
  const rows = all.groups.map((g) => {
    const where = { cluster: g.cluster, type: g.serviceType };
    const hosts = el("div", null, "hostlists");
    for (const what of ["stale", "pending", "failing", "duplicate"]) {
      if (g.hosts[what]) {
        const line = el("div");
        line.appendChild(el("span", what + ": ", "state-" + what));
        line.appendChild(el("span", g.hosts[what], "mono"));
        hosts.appendChild(line);
      }
    }
    const since = el("span", g.oldestStaleSince === null ? "" : age(g.oldestStaleSince));
    if (g.oldestStaleSince !== null) since.dataset.since = String(g.oldestStaleSince);
    const tr = row([
      viewLink(g.cluster === "" ? "infrastructure" : g.cluster, { cluster: g.cluster }),
      g.serviceType,
      countCell(g.counts.active, Object.assign({ state: "active" }, where), "state-active"),
      countCell(g.counts.stale, Object.assign({ state: "stale" }, where), "state-stale"),
      countCell(g.counts.pending, Object.assign({ state: "pending" }, where), "state-pending"),
      countCell(g.counts.failing, Object.assign({ failing: "true" }, where), "failing"),
      countCell(g.counts.duplicate, Object.assign({ duplicate: "true" }, where), "duplicate"),
      since,
      hosts,
    ], "group");
    tr.dataset.cluster = g.cluster;
    tr.dataset.type = g.serviceType;
    return tr;
  });
  box.appendChild(table(["cluster", "type", "active", "stale", "pending", "failing",
    "duplicate", "oldest stale seen", "hosts needing attention"], rows));
}

function plugins(i) {
  if (!i.plugins) return el("span", "no report", "hint");
  const span = el("span");
  i.plugins.forEach((p, n) => {
    if (n > 0) span.appendChild(document.createTextNode(", "));
    const failed = ["restarting", "quarantined", "download-failed", "load-failed", "refused"]
      .includes(p.health);
    span.appendChild(el("span", p.name + (p.sha256 ? "@" + p.sha256.slice(0, 8) : "") + " " +
      p.health + (p.why ? " (" + p.why + ")" : ""), failed ? "failing" : ""));
  });
  return span;
}

// Rows are kept across rounds and rebuilt only when what they show changed.
const rowsByKey = new Map();

function drawInstances(data, v) {
  const box = document.getElementById("instances");
  const first = data.total === 0 ? 0 : data.offset + 1;
  const last = data.offset + data.instances.length;
  document.getElementById("page-info").textContent = data.total === 0
    ? "No member matches."
    : "Members " + first + "–" + last + " of " + data.total +
      ", those needing attention first.";
  document.getElementById("prev").disabled = v.page === 0;
  document.getElementById("next").disabled = last >= data.total;
  let body = box.querySelector("tbody");
  if (!body) {
    box.replaceChildren(table(["host", "cluster", "type", "state", "last heartbeat",
      "registered", "config revision", "instance", "plugins (reported)", ""], []));
    body = box.querySelector("tbody");
  }
  const seen = new Set();
  const ordered = data.instances.map((i) => {
    const key = i.cluster + "\u0000" + i.serviceType + "\u0000" + i.hostname;
    seen.add(key);
    const shape = JSON.stringify([i.state, i.lastHeartbeat, i.registeredAt, i.configRevision,
      i.instance, i.duplicate, i.plugins]);
    let tr = rowsByKey.get(key);
    if (!tr || tr.dataset.shape !== shape) {
      // The row drawn before goes; the new one takes its place below.
      if (tr) tr.remove();
      const heartbeat = el("span", age(i.lastHeartbeat));
      if (i.lastHeartbeat !== null) heartbeat.dataset.since = String(i.lastHeartbeat);
      const registered = el("span", age(i.registeredAt));
      registered.dataset.since = String(i.registeredAt);
      tr = row([
        i.hostname,
        viewLink(i.cluster === "" ? "infrastructure" : i.cluster, { cluster: i.cluster }),
        i.serviceType,
        el("span", i.state, "state-" + i.state),
        heartbeat,
        registered,
        el("span", i.configRevision === null ? "none" : i.configRevision, "mono"),
        el("span", i.instance, "mono"),
        plugins(i),
        i.duplicate ? el("span", "duplicate", "duplicate") : "",
      ], "instance");
      tr.dataset.hostname = i.hostname;
      tr.dataset.state = i.state;
      tr.dataset.shape = shape;
      rowsByKey.set(key, tr);
    } else {
      for (const cell of tr.querySelectorAll("[data-since]")) {
        cell.textContent = age(Number(cell.dataset.since));
      }
    }
    return tr;
  });
  for (const [key, tr] of rowsByKey) {
    if (!seen.has(key)) {
      tr.remove();
      rowsByKey.delete(key);
    }
  }
  // Appending an attached row moves it: the order is the server's, unchanged rows stay.
  ordered.forEach((tr, n) => {
    if (body.children[n] !== tr) body.insertBefore(tr, body.children[n] || null);
  });
}

function drawRosters(data) {
  const box = document.getElementById("rosters");
  box.replaceChildren();
  if (!data.publishesRosters) {
    box.appendChild(el("p", "This server has no NATS connection: rosters are not published. " +
      "What it would send:", "hint no-nats"));
  }
  if (data.rosters.length === 0) {
    box.appendChild(el("p", "No roster is published: no member is active.", "hint"));
    return;
  }
  const rows = data.rosters.map((r) => {
    let providers;
    if (r.count === 0) {
      providers = el("span", "(empty: no provider is active)", "hint");
    } else if (r.providers) {
      providers = el("span", r.providers.map((p) => {
        const meta = Object.entries(p.meta || {}).map(([k, v]) => k + "=" + v).join(" ");
        return p.type + " " + p.hostname + (meta ? " [" + meta + "]" : "");
      }).join(", "));
    } else {
      providers = el("span", r.count + ": " + r.hosts, "mono");
    }
    const cluster = r.bucket === "infra" ? el("span", "infra")
      : viewLink(r.bucket, { cluster: r.bucket });
    return row([cluster, r.consumer, el("span", r.subject, "mono"), providers], "roster");
  });
  box.appendChild(table(["cluster", "consumer", "subject", "providers"], rows));
}

function drawRollouts(data) {
  const box = document.getElementById("rollouts");
  box.replaceChildren();
  const unknown = document.getElementById("served-unknown");
  unknown.hidden = data.servedUnknown === 0;
  unknown.textContent = data.servedUnknown + " live instance(s) were served a configuration " +
    "whose plugins this server does not know (served by another server, or before a restart).";
  if (data.rollouts.length === 0) {
    box.appendChild(el("p", "The configuration tree names no plugin component and no agent " +
      "reports one.", "hint"));
    return;
  }
  const rows = [];
  for (const r of data.rollouts) {
    for (const v of r.versions) {
      const version = v.sha256.slice(0, 16);
      rows.push(row([r.plugin, el("span", v.sha256, "mono"), v.served, v.named,
        v.reporting === 0 ? "0" : viewLink(String(v.reporting), { version }),
        v.running,
        v.failed === 0 ? "0" : viewLink(String(v.failed), { version, failing: "true" })],
      "rollout"));
    }
  }
  box.appendChild(table(["plugin", "sha256", "served", "named by the tree", "reporting",
    "running", "failed"], rows));
}

function drawStaged(data) {
  const box = document.getElementById("staged");
  box.replaceChildren();
  for (const refused of data.stagedRefused) {
    box.appendChild(el("p", "Refused: " + refused, "error"));
  }
  if (data.staged.length === 0) {
    box.appendChild(el("p", "No staged rollout.", "hint"));
    return;
  }
  const rows = data.staged.map((r) => {
    const c = r.counts;
    // How the failing members fail, with the agents' reasons (a refusal names the grant).
    const how = (r.failing || []).map((f) => f.members + " " + f.health +
      (f.why ? " (" + f.why + ")" : "")).join(", ");
    const tr = row([r.name, r.type + (r.cluster ? " in " + r.cluster : ""), r.status,
      (r.stage + 1) + " of " + r.stages, c.members, c.reporting, c.running,
      how ? c.failed + ": " + how : c.failed, c.unknown, r.reason], "staged");
    tr.dataset.status = r.status;
    return tr;
  });
  box.appendChild(table(["rollout", "covers", "status", "stage", "members", "reporting",
    "running", "failed", "without report", "last decision"], rows));
}

document.addEventListener("DOMContentLoaded", () => {
  showView();
  document.getElementById("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    setView(readForm());
  });
  for (const id of ["f-state", "f-cluster", "f-type", "f-failing", "f-duplicate"]) {
    document.getElementById(id).addEventListener("change", () => setView(readForm()));
  }
  document.getElementById("f-clear").addEventListener("click", () => {
    setView({ host: "", state: "", cluster: "", type: "", version: "", failing: "",
      duplicate: "" });
  });
  document.getElementById("prev").addEventListener("click", () => {
    setView({ page: Math.max(0, view().page - 1) }, true);
  });
  document.getElementById("next").addEventListener("click", () => {
    setView({ page: view().page + 1 }, true);
  });
  window.addEventListener("popstate", () => {
    showView();
    refreshNow();
  });
  // A hidden tab asks for nothing; shown again, it catches up at once.
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      clearTimeout(timer);
      timer = null;
    } else {
      refreshNow();
    }
  });
  cycle();
});
