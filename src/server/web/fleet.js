// The fleet status page: fetches /fleet/status.json every few seconds and redraws.
// Every name from the fleet goes into the page through textContent (never as markup), and
// the Content-Security-Policy allows no inline script, so a hostile host name stays text.
"use strict";

const REFRESH_MS = 2000;

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function age(now, then) {
  if (then === null || then === undefined) return "never";
  const s = Math.max(0, now - then);
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
    tr.appendChild(cell instanceof Node ? wrap(cell) : el("td", cell));
  }
  return tr;
}

function wrap(node) {
  const td = el("td");
  td.appendChild(node);
  return td;
}

function groupBy(items, key) {
  const groups = new Map();
  for (const item of items) {
    const k = key(item);
    if (!groups.has(k)) groups.set(k, []);
    groups.get(k).push(item);
  }
  return groups;
}

function drawInstances(data) {
  const box = document.getElementById("instances");
  box.replaceChildren();
  if (data.instances.length === 0) {
    box.appendChild(el("p", "No instance is registered.", "hint"));
    return;
  }
  const clusters = groupBy(data.instances, (i) => i.cluster);
  for (const [cluster, members] of clusters) {
    const title = cluster === "" ? "infrastructure (no cluster)" : "cluster " + cluster;
    box.appendChild(el("h3", title, "cluster"));
    for (const [type, instances] of groupBy(members, (i) => i.serviceType)) {
      const counts = groupBy(instances, (i) => i.state);
      const parts = [];
      for (const state of ["active", "pending", "stale"]) {
        if (counts.has(state)) parts.push(counts.get(state).length + " " + state);
      }
      box.appendChild(el("h4", type + " (" + parts.join(", ") + ")", "type"));
      const rows = instances.map((i) => {
        const tr = row([
          i.hostname,
          el("span", i.state, "state-" + i.state),
          age(data.now, i.lastHeartbeat),
          age(data.now, i.registeredAt),
          el("span", i.configRevision === null ? "none" : i.configRevision, "mono"),
          el("span", i.instance, "mono"),
          i.duplicate ? el("span", "duplicate", "duplicate") : "",
        ], "instance");
        tr.dataset.hostname = i.hostname;
        tr.dataset.state = i.state;
        return tr;
      });
      box.appendChild(table(
        ["host", "state", "last heartbeat", "registered", "config revision", "instance", ""],
        rows));
    }
  }
}

function drawRosters(data) {
  const box = document.getElementById("rosters");
  box.replaceChildren();
  if (data.rosters.length === 0) {
    box.appendChild(el("p", "No roster is published: no member is active.", "hint"));
    return;
  }
  const rows = data.rosters.map((r) => {
    const providers = r.providers.length === 0
      ? el("span", "(empty: no provider is active)", "hint")
      : el("span", r.providers.map((p) => {
          const meta = Object.entries(p.meta || {}).map(([k, v]) => k + "=" + v).join(" ");
          return p.type + " " + p.hostname + (meta ? " [" + meta + "]" : "");
        }).join(", "));
    const tr = row([r.bucket, r.consumer, el("span", r.subject, "mono"), providers], "roster");
    return tr;
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
    box.appendChild(el("p", "The configuration tree names no plugin component.", "hint"));
    return;
  }
  const rows = [];
  for (const r of data.rollouts) {
    for (const v of r.versions) {
      rows.push(row([r.plugin, el("span", v.sha256, "mono"), v.served, v.named], "rollout"));
    }
  }
  box.appendChild(table(["plugin", "sha256", "served", "named by the tree"], rows));
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
    const tr = row([r.name, r.type + (r.cluster ? " in " + r.cluster : ""), r.status,
      (r.stage + 1) + " of " + r.stages, c.members, c.reporting, c.running, c.failed, c.unknown,
      r.reason], "staged");
    tr.dataset.status = r.status;
    return tr;
  });
  box.appendChild(table(["rollout", "covers", "status", "stage", "members", "reporting",
    "running", "failed", "without report", "last decision"], rows));
}

function drawSummary(data) {
  const counts = groupBy(data.instances, (i) => i.state);
  const n = (s) => (counts.get(s) || []).length;
  const clusters = new Set(data.instances.map((i) => i.cluster)).size;
  document.getElementById("summary").textContent =
    data.instances.length + " instance(s) in " + clusters + " group(s): " + n("active") +
    " active, " + n("pending") + " pending, " + n("stale") + " stale. Stale after " +
    data.staleAfterSeconds + " s without a heartbeat. Updated " +
    new Date(data.now * 1000).toLocaleTimeString() + ".";
  document.getElementById("user").textContent = data.user === null ? "" : "logged in as " + data.user;
  document.getElementById("logout-form").hidden = data.user === null;
}

function showError(text) {
  const box = document.getElementById("error");
  box.textContent = text;
  box.hidden = text === "";
}

async function refresh() {
  try {
    const response = await fetch("/fleet/status.json", {
      credentials: "same-origin",
      cache: "no-store",
    });
    if (response.status === 401) {
      showError("The session ended: log in again.");
      window.location.assign("/fleet/login");
      return;
    }
    if (!response.ok) {
      showError("The server answered " + response.status + "; retrying.");
      return;
    }
    const data = await response.json();
    drawSummary(data);
    drawInstances(data);
    drawRosters(data);
    drawRollouts(data);
    drawStaged(data);
    showError("");
  } catch (e) {
    showError("The server cannot be reached; retrying.");
  }
}

document.addEventListener("DOMContentLoaded", () => {
  refresh();
  setInterval(refresh, REFRESH_MS);
});
