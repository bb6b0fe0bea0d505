// permitd dashboard: plain JavaScript, no dependencies, served from the node's
// binary. It reads the API of the node that served it (same origin only, as the
// page's Content-Security-Policy enforces):
//   cluster  ← GET /cluster/status, GET /cluster/shards (the leader map) and
//              GET /metrics (this node's view)
//   keys     ← GET /v1/semaphores (usage, groups) and …/holders per key shown
//   events   ← GET /v1/events, read with fetch so the token travels as a header
// and refreshes every REFRESH_MS. The token is kept in sessionStorage (this tab
// only); `#token=…` in the address is moved there and removed from the address.
"use strict";

const REFRESH_MS = 2000;
/** Keys listed, and keys whose holders are asked for, per refresh. */
const MAX_KEYS_SHOWN = 200;
const MAX_HOLDER_CALLS = 25;
/** Events kept on the page, newest first. */
const MAX_EVENTS_SHOWN = 200;
const TOKEN_STORAGE = "permitd.token";

const $ = (selector) => document.querySelector(selector);

// ---- token ---------------------------------------------------------------

function adoptTokenFromAddress() {
  const match = /^#token=(.+)$/.exec(location.hash);
  if (match) {
    sessionStorage.setItem(TOKEN_STORAGE, decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_STORAGE);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

class Unauthorized extends Error {}

/** GET `path` as JSON; `null` when this token may not (403). */
async function getJson(path) {
  const answer = await fetch(path, { headers: authHeaders(), cache: "no-store" });
  if (answer.status === 401) throw new Unauthorized();
  if (answer.status === 403) return null;
  if (!answer.ok) throw new Error(`${path}: ${answer.status}`);
  return answer.json();
}

async function getText(path) {
  const answer = await fetch(path, { headers: authHeaders(), cache: "no-store" });
  if (answer.status === 401) throw new Unauthorized();
  return answer.ok ? answer.text() : null;
}

/** True from a refused (or missing) token until a token is submitted. */
let awaitingToken = false;

function showSignIn(message) {
  awaitingToken = true;
  $("#board").hidden = true;
  $("#sign-out").hidden = true;
  $("#sign-in").hidden = false;
  $("#sign-in-error").textContent = message || "";
  $("#token-input").focus();
}

function showBoard() {
  $("#sign-in").hidden = true;
  $("#board").hidden = false;
  $("#sign-out").hidden = !sessionStorage.getItem(TOKEN_STORAGE);
}

// ---- small DOM helpers ---------------------------------------------------

function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "class") node.className = value;
    else if (name.startsWith("data-")) node.setAttribute(name, value);
    else node[name] = value;
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const cell = (text, className = "") => element("td", { class: className }, text);

function fact(label, value) {
  return element("div", {}, element("dt", {}, label), element("dd", {}, value ?? "–"));
}

// ---- cluster ---------------------------------------------------------------

/** `name{labels} value` lines of the Prometheus text, as [{name, labels, value}]. */
function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    const match = /^([a-z_:][a-z0-9_:]*)(\{[^}]*\})?\s+(\S+)/i.exec(line);
    if (!match) continue;
    const labels = {};
    for (const pair of (match[2] || "").matchAll(/(\w+)="([^"]*)"/g)) labels[pair[1]] = pair[2];
    samples.push({ name: match[1], labels, value: Number(match[3]) });
  }
  return samples;
}

function metricValue(samples, name) {
  const sample = samples.find((entry) => entry.name === name);
  return sample ? sample.value : undefined;
}

/** The leader map: one row per shard (GET /cluster/shards). */
function showShards(map) {
  $("#shards tbody").replaceChildren(
    ...(map ? map.shards : []).map((shard) => element(
      "tr",
      { "data-shard": String(shard.shard) },
      cell(shard.shard),
      cell(shard.leader ?? "none", "leader"),
      cell(shard.term, "num"),
      cell(shard.appliedIndex ?? "–", "num"),
      cell(shard.members.join(", ")),
    )),
  );
}

async function refreshCluster() {
  const [status, shards, metricsText] = await Promise.all([
    getJson("/cluster/status"),
    getJson("/cluster/shards"),
    getText("/metrics"),
  ]);
  showShards(shards);
  const samples = metricsText ? parseMetrics(metricsText) : [];
  const lag = {};
  for (const sample of samples) {
    if (sample.name === "permitd_follower_lag_entries") lag[sample.labels.follower] = sample.value;
  }
  const facts = $("#cluster-facts");
  const tbody = $("#members tbody");
  if (!status) {
    $("#node-summary").textContent = "cluster status needs an admin token";
    facts.replaceChildren(
      fact("term", metricValue(samples, "permitd_term")),
      fact("committed", metricValue(samples, "permitd_committed_index")),
      fact("applied", metricValue(samples, "permitd_applied_index")),
    );
    tbody.replaceChildren();
    $("#cluster-note").textContent = "Members need an admin token.";
    return;
  }
  const leads = status.leader === status.id;
  $("#node-summary").textContent =
    `node ${status.id} · ${leads ? "leader" : status.leader ? `follower of ${status.leader}` : "no leader"} · term ${status.term}`;
  facts.replaceChildren(
    fact("this node", status.id),
    fact("leader", status.leader ?? "none"),
    fact("term", status.term),
    fact("last log index", status.lastLogIndex),
    fact("committed", leads ? metricValue(samples, "permitd_committed_index") : "leader's view"),
    fact("applied", status.lastApplied),
    fact("members", status.members.length),
  );
  tbody.replaceChildren(
    ...status.members.map((member) => {
      const role = element("span", { class: "badge" }, member.role);
      const name = element("td", {}, `${member.id} `);
      if (member.id === status.leader) name.append(element("span", { class: "badge leader" }, "leader"));
      if (member.id === status.id) name.append(" ", element("span", { class: "badge" }, "this node"));
      const memberLag = lag[String(member.id)];
      return element(
        "tr",
        { "data-node": String(member.id) },
        name,
        element("td", {}, role),
        cell(member.addr),
        cell(member.raftAddr),
        cell(memberLag === undefined ? "–" : `${memberLag} entries`, "num lag"),
      );
    }),
  );
  $("#cluster-note").textContent = leads
    ? "Lag: log entries each follower is behind this leader."
    : "Follower lag is known to the leader: open its /ui to see it.";
}

// ---- keys --------------------------------------------------------------

function usageBar(usage) {
  const limit = Math.max(usage.limit, usage.granted + usage.leased, 1);
  const part = (className, value) => {
    const span = element("span", { class: className });
    span.style.width = `${(100 * value) / limit}%`; // CSSOM: allowed by the CSP.
    return span;
  };
  const bar = element("div", { class: "bar", title: `${usage.granted} granted, ${usage.leased} leased of ${usage.limit}` },
    part("granted", usage.granted), part("leased", usage.leased));
  return bar;
}

function groupsText(usage) {
  return Object.entries(usage.groups || {})
    .map(([group, entry]) => `${group} ${entry.granted}${entry.limit == null ? "" : `/${entry.limit}`}`)
    .join(", ");
}

/** Holders summary of a key: [clients holding, permits waiting], or null. */
async function holdersSummary(key) {
  const view = await getJson(`/v1/semaphores/${encodeURIComponent(key)}/holders`);
  if (!view) return null;
  let holding = 0;
  let waiting = 0;
  for (const client of Object.values(view.clients)) {
    if (client.grants.length || client.leases.length) holding += 1;
    for (const demand of client.waiting) waiting += demand.count;
  }
  return [holding, waiting];
}

async function refreshKeys() {
  const page = await getJson(`/v1/semaphores?limit=${MAX_KEYS_SHOWN}`);
  if (!page) {
    $("#keys-note").textContent = "Listing keys needs a reader or admin token.";
    return;
  }
  const shown = page.keys;
  const summaries = await Promise.all(
    shown.map((entry, index) => (index < MAX_HOLDER_CALLS ? holdersSummary(entry.key) : null)),
  );
  $("#keys-count").textContent = `${shown.length}${page.next ? "+" : ""}`;
  $("#key-table tbody").replaceChildren(
    ...shown.map(({ key, usage }, index) => {
      const summary = summaries[index];
      const link = element("a", { href: "#", onclick: (event) => { event.preventDefault(); openHolders(key); } }, key);
      return element(
        "tr",
        { "data-key": key },
        element("td", { class: "key", title: key }, link),
        element("td", {}, usageBar(usage)),
        cell(usage.granted, "num granted"),
        cell(usage.leased, "num leased"),
        cell(usage.available, "num available"),
        cell(usage.limit, "num limit"),
        cell(groupsText(usage), "groups"),
        cell(summary ? summary[0] : "–", "num holders"),
        cell(summary ? summary[1] : "–", "num waiting"),
      );
    }),
  );
  const notes = [];
  if (page.next) notes.push(`Only the first ${shown.length} keys are shown (permitctl keys lists all).`);
  if (summaries.some((summary) => summary === null) && shown.length) {
    notes.push("Holders and waiting need a reader or admin token" + (shown.length > MAX_HOLDER_CALLS ? ` and are asked for the first ${MAX_HOLDER_CALLS} keys.` : "."));
  }
  $("#keys-note").textContent = notes.join(" ");
  if (openHoldersKey) await refreshHolders();
}

let openHoldersKey = null;

function openHolders(key) {
  openHoldersKey = key;
  $("#holders").hidden = false;
  $("#holders-key").textContent = key;
  refreshHolders().catch(reportError);
}

async function refreshHolders() {
  const key = openHoldersKey;
  const view = await getJson(`/v1/semaphores/${encodeURIComponent(key)}/holders`);
  const tbody = $("#holders-table tbody");
  if (!view) {
    tbody.replaceChildren(element("tr", {}, element("td", { colSpan: 4 }, "Holders need a reader or admin token.")));
    return;
  }
  tbody.replaceChildren(
    ...Object.entries(view.clients).map(([clientId, client]) =>
      element(
        "tr",
        {},
        cell(clientId, "key"),
        cell(client.grants.map((g) => `${g.group}: ${g.permits} (${g.claimed}, ${g.released})`).join("; ") || "–"),
        cell(client.leases.map((l) => `${l.group}: ${l.permits} (${l.drawn}, ${new Date(l.expiresAtMs).toLocaleTimeString()})${l.retired ? " retired" : ""}`).join("; ") || "–"),
        cell(client.waiting.map((w) => `${w.group}: ${w.count}`).join("; ") || "–"),
      ),
    ),
  );
}

// ---- events --------------------------------------------------------------

/**
 * Where the event stream resumes: `{ from: 0 }` at first (every event the node
 * keeps), then `{ cursor }`, the last message's id (a log index, or with several
 * shards one per shard: passed back as it came); `null` for new events only.
 */
let eventsResume = { from: 0 };

function describeEvent(record) {
  switch (record.type) {
    case "round":
      return `requested ${record.requested}, granted ${record.granted}; now ${record.usage.granted} granted, ${record.usage.leased} leased, ${record.usage.available} free`;
    case "blocked":
      return `${record.count} of group ${record.group} queued: ${record.reason}`;
    case "client_released":
      return `${record.clientId}: ${record.grants} grants, ${record.leases} leases, ${record.permits} permits dropped`;
    case "key_deleted":
      return `key deleted: ${record.grants} grants, ${record.leases} leases, ${record.permits} permits released`;
    default:
      return `${record.clientId} ${record.group}: ${record.permits} permits`;
  }
}

function showEvent(record) {
  const list = $("#event-list");
  const item = element(
    "li",
    { "data-type": record.type },
    element("span", { class: "index" }, record.logIndex),
    element("span", { class: "type" }, record.type),
    element("span", {}, `${record.key} · ${describeEvent(record)}`),
  );
  list.prepend(item);
  while (list.children.length > MAX_EVENTS_SHOWN) list.lastElementChild.remove();
}

/** Splits Server-Sent Events text into messages; returns the unfinished rest. */
function takeMessages(buffer, onMessage) {
  const blocks = buffer.split(/\r?\n\r?\n/);
  const rest = blocks.pop();
  for (const block of blocks) {
    const message = { event: "message", data: [] };
    for (const line of block.split(/\r?\n/)) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "data") message.data.push(value);
      else if (field === "event") message.event = value;
      else if (field === "id") message.id = value;
    }
    if (message.data.length) onMessage(message);
  }
  return rest;
}

async function streamEventsOnce() {
  const query =
    eventsResume === null
      ? ""
      : eventsResume.cursor !== undefined
        ? `?cursor=${encodeURIComponent(eventsResume.cursor)}`
        : `?from=${eventsResume.from}`;
  const answer = await fetch(`/v1/events${query}`, { headers: authHeaders(), cache: "no-store" });
  if (answer.status === 401) throw new Unauthorized();
  if (answer.status === 410) {
    eventsResume = null; // Too far behind: carry on with new events only.
    return "resumed too late; showing new events";
  }
  if (!answer.ok) return `not streaming (${answer.status})`;
  $("#events-state").textContent = "live";
  const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return "stream closed; reconnecting";
    buffer = takeMessages(buffer + value, (message) => {
      if (message.event === "stream_error") {
        eventsResume = null;
        return;
      }
      const record = JSON.parse(message.data.join("\n"));
      if (message.id !== undefined) eventsResume = { cursor: message.id };
      showEvent(record);
    });
  }
}

async function streamEvents() {
  for (;;) {
    let state;
    try {
      state = await streamEventsOnce();
    } catch (error) {
      if (error instanceof Unauthorized) return;
      state = `disconnected (${error.message}); reconnecting`;
    }
    $("#events-state").textContent = state;
    await new Promise((resolve) => setTimeout(resolve, REFRESH_MS));
  }
}

// ---- main loop -------------------------------------------------------------

function reportError(error) {
  if (error instanceof Unauthorized) {
    showSignIn(sessionStorage.getItem(TOKEN_STORAGE) ? "The node refused this token." : "");
    return;
  }
  $("#refreshed").textContent = `last refresh failed: ${error.message}`;
}

let streaming = false;

async function refresh() {
  try {
    await Promise.all([refreshCluster(), refreshKeys()]);
    showBoard();
    $("#refreshed").textContent = `updated ${new Date().toLocaleTimeString()}`;
    if (!streaming) {
      streaming = true;
      streamEvents().finally(() => { streaming = false; });
    }
  } catch (error) {
    reportError(error);
  }
}

function start() {
  adoptTokenFromAddress();
  $("#token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_STORAGE, $("#token-input").value.trim());
    $("#token-input").value = "";
    awaitingToken = false;
    refresh();
  });
  $("#sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_STORAGE);
    location.reload();
  });
  $("#holders-close").addEventListener("click", () => {
    openHoldersKey = null;
    $("#holders").hidden = true;
  });
  refreshForever();
}

/**
 * Refreshes every REFRESH_MS, one refresh at a time, unless the page waits for
 * a token. A refresh that failed (a 503 while the cluster elects, a node
 * restarting) is tried again: only a refused token stops the loop's calls.
 */
async function refreshForever() {
  for (;;) {
    if (!awaitingToken) await refresh();
    await new Promise((resolve) => setTimeout(resolve, REFRESH_MS));
  }
}

start();
