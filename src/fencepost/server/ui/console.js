// The fencepost web console: plain DOM code, no framework, nothing fetched from
// elsewhere. It calls this server's JSON API with the key typed into the page.
//
// Everything the API returns is shown through textContent or text nodes, never
// innerHTML: a lock's operation or metadata is shown as text whatever it holds.
// The key lives in sessionStorage (this tab only), never in localStorage or a cookie.

const KEY_STORAGE = "fencepost.console.key";
const POLL_MS = 3000;
const CHART_SAMPLES = 60; // three minutes at one poll every 3 s
const CHART_COLORS = { admissions: "#2563eb", throttles: "#dc2626", grid: "#d4d4d8", text: "#52525b" };

const state = {
  key: null,
  whoami: null,
  view: null,
  timer: null,
  ticker: null,
  busy: false,
  again: false,
  selectedLock: null,
  selectedPool: null,
  rendered: { locks: "", pools: "", lock: "", pool: "", keys: "" },
  chart: { pool: null, last: null, samples: [] },
};

const $ = (id) => document.getElementById(id);

/** An element with a class and children; strings become text nodes (never markup). */
function el(tag, className, ...children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

function button(label, className, onClick) {
  const node = el("button", className, label);
  node.type = "button";
  node.addEventListener("click", onClick);
  return node;
}

// --- the API ------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path) {
  let response;
  try {
    // Relative to the page, so the console works behind a path prefix too.
    response = await fetch(path, {
      method,
      headers: { Authorization: `Bearer ${state.key}`, Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
    });
  } catch (error) {
    throw new ApiError(0, "unreachable", "The server did not answer.");
  }
  let body = null;
  try {
    body = await response.json();
  } catch (error) {
    body = null;
  }
  if (!response.ok) {
    const info = body && body.error ? body.error : {};
    throw new ApiError(response.status, info.code || `http_${response.status}`,
      info.message || response.statusText || "The request failed.");
  }
  return body;
}

/** One sentence for the person at the screen. */
function explain(error) {
  if (!(error instanceof ApiError)) return `Something went wrong: ${error}`;
  if (error.status === 401) {
    return `The server refused this key (401 ${error.code}): ${error.message}`;
  }
  if (error.status === 403) {
    return `This key may not do that (403 ${error.code}): ${error.message}`;
  }
  if (error.status === 0) return error.message;
  return `${error.status} ${error.code}: ${error.message}`;
}

function showMessage(text) {
  $("message").textContent = text;
  $("message").hidden = !text;
}

function showNotice(text) {
  $("notice").textContent = text;
  $("notice").hidden = !text;
}

// --- times --------------------------------------------------------------------

function duration(ms) {
  let seconds = Math.max(0, Math.round(ms / 1000));
  const parts = [];
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (seconds >= size) {
      parts.push(`${Math.floor(seconds / size)}${unit}`);
      seconds %= size;
    }
  }
  if (seconds || parts.length === 0) parts.push(`${seconds}s`);
  return parts.slice(0, 2).join(" ");
}

function ageText(iso) {
  return iso ? duration(Date.now() - Date.parse(iso)) : "—";
}

function expiryText(iso, overdue) {
  if (!iso) return "—";
  const left = Date.parse(iso) - Date.now();
  if (overdue || left < 0) return `overdue by ${duration(-left)}`;
  return `in ${duration(left)}`;
}

/** A cell whose text follows the clock (refreshed every second by `tick`). */
function clockCell(kind, iso, overdue) {
  const cell = el("td", "clock");
  cell.dataset.clock = kind;
  cell.dataset.at = iso || "";
  cell.dataset.overdue = overdue ? "1" : "";
  cell.title = iso || "";
  cell.textContent = kind === "age" ? ageText(iso) : expiryText(iso, overdue);
  return cell;
}

function tick() {
  for (const cell of document.querySelectorAll("[data-clock]")) {
    const iso = cell.dataset.at;
    cell.textContent = cell.dataset.clock === "age"
      ? ageText(iso) : expiryText(iso, cell.dataset.overdue === "1");
  }
}

// --- small renderers ------------------------------------------------------------

function text(value) {
  if (value === null || value === undefined || value === "") return "—";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function keyName(who) {
  if (!who) return "—";
  return who.key_name ? `${who.key_name} (${who.key_id})` : text(who.key_id);
}

function facts(list, pairs) {
  list.replaceChildren();
  for (const [term, value] of pairs) {
    list.append(el("dt", null, term), el("dd", null, value instanceof Node ? value : text(value)));
  }
}

function emptyRow(body, columns, message) {
  const cell = el("td", "empty", message);
  cell.colSpan = columns;
  body.append(el("tr", null, cell));
}

/** Re-render only when the data changed, so that the table under the pointer
 * does not flicker with every poll (clock cells tick on their own). */
function changed(slot, data) {
  const json = JSON.stringify(data);
  if (state.rendered[slot] === json) return false;
  state.rendered[slot] = json;
  return true;
}

// --- locks ----------------------------------------------------------------------

function mayForceRelease(lock) {
  const me = state.whoami;
  if (me.role === "admin") return true;
  // SPEC: a member may force-release a lease its own key took. A force release
  // ends every lease of a shared lock, and the page sees only the oldest
  // holder: offer it to a member only when that is the only holder.
  return me.role === "member" && lock.holder && lock.holder.key_id === me.key_id &&
    (lock.holders || 1) <= 1;
}

// The holder as the tables show it: a shared lock's oldest holder and how many
// more hold it with it.
function holderText(lock) {
  const more = (lock.holders || 0) - 1;
  return more > 0 ? `${keyName(lock.holder)} (shared, +${more})` : keyName(lock.holder);
}

async function loadLocks() {
  const page = await api("GET", "v1/locks?limit=1000");
  if (changed("locks", page)) renderLocks(page);
  if (state.selectedLock) await loadLock(state.selectedLock);
}

function renderLocks(page) {
  const body = $("locks-body");
  body.replaceChildren();
  $("locks-count").textContent = `(${page.locks.length})`;
  $("locks-empty").hidden = page.locks.length > 0;
  $("locks-more").hidden = !page.next;
  for (const lock of page.locks) {
    const name = button(lock.key, "link", () => selectLock(lock.key));
    name.dataset.lock = lock.key;
    const actions = el("td", "actions");
    if (mayForceRelease(lock)) {
      const release = button("Force release", "danger", () => confirmForceRelease(lock));
      release.dataset.forceRelease = lock.key;
      actions.append(release);
    }
    const row = el("tr", lock.overdue ? "overdue" : null,
      el("td", null, name),
      el("td", null, holderText(lock)),
      el("td", "operation", text(lock.operation)),
      el("td", "number", text(lock.fencing_token)),
      clockCell("age", lock.acquired_at),
      clockCell("expiry", lock.expires_at, lock.overdue),
      el("td", "number", text(lock.waiters)),
      actions);
    row.dataset.lock = lock.key;
    body.append(row);
  }
}

function selectLock(key) {
  state.selectedLock = key;
  state.rendered.lock = "";
  loadLock(key).catch((error) => showMessage(explain(error)));
}

async function loadLock(key) {
  const lock = await api("GET", `v1/locks/${encodeURIComponent(key)}`);
  if (state.selectedLock !== key || !changed("lock", lock)) return;
  $("lock-detail").hidden = false;
  $("lock-detail-key").textContent = lock.key;
  facts($("lock-detail-facts"), [
    ["Held", lock.held ? "yes" : "no"],
    ["Mode", lock.mode],
    ["Holders", lock.holders],
    ["Holder", holderText(lock)],
    ["Operation", lock.operation],
    ["Fencing token", lock.fencing_token],
    ["Acquired", lock.acquired_at ? `${lock.acquired_at} (${ageText(lock.acquired_at)} ago)` : null],
    ["Expires", lock.expires_at ? `${lock.expires_at} (${expiryText(lock.expires_at, lock.overdue)})` : null],
    ["Deadline", lock.deadline_at],
    ["On expiry", lock.on_expiry],
    ["Overdue", lock.overdue ? "yes" : "no"],
    ["Waiters", lock.waiters],
  ]);
  $("lock-detail-metadata").textContent =
    lock.metadata ? JSON.stringify(lock.metadata, null, 2) : "—";
  const hasLine = Array.isArray(lock.line);
  $("lock-line-absent").hidden = hasLine;
  $("lock-line-table").hidden = !hasLine || lock.line.length === 0;
  $("lock-line-count").textContent = hasLine ? `(${lock.waiters} waiting)` : "";
  const body = $("lock-line-body");
  body.replaceChildren();
  (lock.line || []).forEach((waiter, index) => {
    body.append(el("tr", null,
      el("td", "number", String(index + 1)),
      el("td", null, text(waiter.key_name)),
      el("td", null, text(waiter.key_id)),
      el("td", null, text(waiter.since_at)),
      el("td", null, text(waiter.gives_up_at))));
  });
}

function confirmForceRelease(lock) {
  const token = lock.fencing_token;
  const others = (lock.holders || 1) - 1;
  const also = others > 0
    ? ` So do the ${others} other shared lease(s) of this lock, each failing likewise.`
    : "";
  confirmAction({
    title: `Force-release lock ${lock.key}?`,
    facts: [
      ["Lock", lock.key],
      ["Holder", holderText(lock)],
      ["Operation", lock.operation],
      ["Fencing token", token],
    ],
    text: `The lease with fencing token ${token} on lock ${lock.key} ends now, whatever ` +
      `its holder (operation ${text(lock.operation)}) is doing: its next renewal fails with ` +
      "lease_lost, and the next waiter may take the lock." + also,
    action: `Force-release ${lock.key}`,
    run: async () => {
      const path = `v1/locks/${encodeURIComponent(lock.key)}`;
      // The release is not conditional on the token, so look once more: never
      // release a lease other than the one just named.
      const now = await api("GET", path);
      if (!now.held || now.fencing_token !== token) {
        showNotice(`Nothing released: lock ${lock.key} is no longer held with fencing token ` +
          `${token}. Look again before releasing it.`);
        return;
      }
      const result = await api("DELETE", path);
      showNotice(result.released
        ? `Released lock ${result.key} (operation ${text(result.operation)}, fencing token ` +
          `${result.fencing_token}, held for ${duration(result.age_ms)}` +
          (result.released_count > 1 ? `; ${result.released_count} leases ended` : "") + ")."
        : result.message);
    },
  });
}

// --- pools ----------------------------------------------------------------------

async function loadPools() {
  const page = await api("GET", "v1/pools?limit=1000");
  if (changed("pools", page)) renderPools(page);
  if (state.selectedPool) await loadPool(state.selectedPool);
}

function pausedUntil(pool) {
  const learned = pool.learned || {};
  return learned.paused_until_at || null;
}

function renderPools(page) {
  const body = $("pools-body");
  body.replaceChildren();
  $("pools-count").textContent = `(${page.pools.length})`;
  $("pools-empty").hidden = page.pools.length > 0;
  for (const pool of page.pools) {
    const name = button(pool.name, "link", () => selectPool(pool.name));
    name.dataset.pool = pool.name;
    const rate = pool.rpm || pool.effective_rpm
      ? `${text(pool.effective_rpm)} of ${text(pool.rpm)}` : "—";
    const paused = pausedUntil(pool);
    body.append(el("tr", paused ? "paused" : null,
      el("td", null, name),
      el("td", "number", text(pool.in_use)),
      el("td", "number", text(pool.limit)),
      el("td", "number", text(pool.effective_limit)),
      el("td", "number", text(pool.queued)),
      el("td", "number", rate),
      el("td", null, pool.adaptive ? "yes" : "no"),
      el("td", null, text(paused))));
  }
}

function selectPool(name) {
  state.selectedPool = name;
  state.rendered.pool = "";
  state.chart = { pool: name, last: null, samples: [] };
  loadPool(name).catch((error) => showMessage(explain(error)));
}

async function loadPool(name) {
  const pool = await api("GET", `v1/pools/${encodeURIComponent(name)}`);
  if (state.selectedPool !== name) return;
  sample(pool);
  drawChart();
  if (!changed("pool", pool)) return;
  $("pool-detail").hidden = false;
  $("pool-detail-name").textContent = pool.name;
  facts($("pool-detail-state"), [
    ["In use", pool.in_use],
    ["Queued", pool.queued],
    ["Limit", pool.limit],
    ["Effective limit", pool.effective_limit],
    ["Rate limit (per minute)", pool.rpm],
    ["Effective rate", pool.effective_rpm],
    // A unit budget (tokens per minute): configured, paced by, and left now.
    ["Cost budget (per minute)", pool.cost_per_minute],
    ["Effective cost budget", pool.learned ? pool.learned.effective_cost_per_minute : null],
    ["Cost left this minute", pool.learned ? pool.learned.remaining_cost : null],
    ["Adaptive", pool.adaptive ? `yes (at least ${pool.min_limit})` : "no"],
    ["Queue", `${pool.queue_size} waiters, ${pool.queue_timeout_ms} ms at most`],
    ["Term", `${pool.term_ms} ms (renew every ${pool.renew_interval_ms} ms)`],
    // Proxy mode: where calls go and which headers are added, by name only
    // (the server never sends their values).
    ["Upstream", pool.upstream ? pool.upstream.base_url : "none (no proxy mode)"],
    ...(pool.upstream ? [
      ["Upstream headers", pool.upstream.headers.length
        ? pool.upstream.headers.join(", ") : "none"],
      ["Upstream timeout", `${pool.upstream.timeout_ms} ms`],
      ["Largest body", `${pool.max_body_bytes} bytes`],
    ] : []),
  ]);
  // `learned` is shown field by field as the server sends it, so that fields
  // added to it later appear without a change here.
  const learned = pool.learned && typeof pool.learned === "object" ? pool.learned : null;
  facts($("pool-detail-learned"), learned
    ? Object.entries(learned).map(([field, value]) => [field, value])
    : [["learned", "not reported by this server"]]);
  const stats = pool.stats || {};
  facts($("pool-detail-stats"), Object.entries(stats).map(([field, value]) => [field, value]));
}

/** Admissions so far: every slot ever granted is held, released or reclaimed. */
function admissions(pool) {
  const stats = pool.stats || {};
  if (typeof stats.admitted === "number") return stats.admitted;
  return (stats.released || 0) + (stats.reclaimed || 0) + (pool.in_use || 0);
}

function sample(pool) {
  const chart = state.chart;
  const now = {
    admissions: admissions(pool),
    throttled: (pool.stats || {}).throttled || 0,
    status429: (pool.stats || {}).status_429 || 0,
  };
  const last = chart.last;
  chart.last = now;
  if (!last) return;
  const delta = {
    admissions: now.admissions - last.admissions,
    // A holder may report a 429 status, a count of throttles, or both: the
    // larger of the two is what the interval saw at least.
    throttles: Math.max(now.throttled - last.throttled, now.status429 - last.status429),
  };
  if (delta.admissions < 0 || delta.throttles < 0) {
    chart.samples = []; // the pool was deleted and made again: start over
    return;
  }
  chart.samples.push({ at: Date.now(), ...delta });
  if (chart.samples.length > CHART_SAMPLES) chart.samples.shift();
}

function drawChart() {
  const canvas = $("pool-chart");
  const context = canvas.getContext("2d");
  const scale = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.width;
  const height = canvas.clientHeight || canvas.height;
  if (canvas.width !== Math.round(width * scale)) {
    canvas.width = Math.round(width * scale);
    canvas.height = Math.round(height * scale);
  }
  context.setTransform(scale, 0, 0, scale, 0, 0);
  context.clearRect(0, 0, width, height);
  const samples = state.chart.samples;
  const pad = { left: 36, right: 8, top: 8, bottom: 18 };
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const top = Math.max(1, ...samples.map((s) => Math.max(s.admissions, s.throttles)));
  context.font = "11px system-ui, sans-serif";
  context.fillStyle = CHART_COLORS.text;
  context.strokeStyle = CHART_COLORS.grid;
  context.lineWidth = 1;
  for (const fraction of [0, 0.5, 1]) {
    const y = pad.top + plotH * (1 - fraction);
    context.beginPath();
    context.moveTo(pad.left, y);
    context.lineTo(width - pad.right, y);
    context.stroke();
    context.fillText(String(Math.round(top * fraction)), 4, y + 4);
  }
  // The axis grows with the samples, up to CHART_SAMPLES: a chart just opened
  // is readable, not four points squeezed against its right edge.
  const span = Math.min(CHART_SAMPLES, Math.max(20, samples.length));
  context.fillText(`last ${duration(span * POLL_MS)}`, pad.left, height - 4);
  const step = plotW / (span - 1);
  const x = (index) => pad.left + plotW - (samples.length - 1 - index) * step;
  const y = (value) => pad.top + plotH * (1 - value / top);
  for (const series of ["admissions", "throttles"]) {
    context.strokeStyle = CHART_COLORS[series];
    context.fillStyle = CHART_COLORS[series];
    context.lineWidth = 2;
    context.beginPath();
    samples.forEach((s, index) => {
      if (index === 0) context.moveTo(x(index), y(s[series]));
      else context.lineTo(x(index), y(s[series]));
    });
    context.stroke();
    samples.forEach((s, index) => context.fillRect(x(index) - 2, y(s[series]) - 2, 4, 4));
  }
  const latest = samples[samples.length - 1];
  const totals = samples.reduce((sum, s) => ({
    admissions: sum.admissions + s.admissions, throttles: sum.throttles + s.throttles,
  }), { admissions: 0, throttles: 0 });
  $("pool-chart-summary").textContent = latest
    ? `Last ${samples.length} polls: ${totals.admissions} admissions, ${totals.throttles} ` +
      `throttles reported (latest poll: ${latest.admissions} and ${latest.throttles}).`
    : "Collecting: the chart starts with the next poll.";
}

// --- keys -----------------------------------------------------------------------

async function loadKeys() {
  const body = $("keys-body");
  let list;
  try {
    // Every page: a project may have more keys than one page holds.
    list = await api("GET", "v1/keys?limit=1000");
    while (list.next) {
      const more = await api("GET", `v1/keys?limit=1000&after=${encodeURIComponent(list.next)}`);
      list = { keys: [...list.keys, ...more.keys], next: more.next };
    }
  } catch (error) {
    if (error.status !== 403) throw error;
    body.replaceChildren();
    $("keys-count").textContent = "";
    $("keys-table").hidden = true;
    $("keys-refused").hidden = false;
    $("keys-refused").textContent =
      `Only an admin key can list keys; this key is a ${state.whoami.role}. ` +
      `(${explain(error)})`;
    return;
  }
  $("keys-table").hidden = false;
  $("keys-refused").hidden = true;
  if (!changed("keys", list)) return;
  body.replaceChildren();
  $("keys-count").textContent = `(${list.keys.length})`;
  if (list.keys.length === 0) emptyRow(body, 10, "No keys.");
  const byId = new Map(list.keys.map((key) => [key.id, key]));
  for (const [key, depth] of lineageOrder(list.keys)) {
    const actions = el("td", "actions");
    const admin = state.whoami.role === "admin";
    if (key.state === "active" && (admin || key.id === state.whoami.key_id)) {
      const retire = button("Retire", null, () => confirmRetire(key));
      retire.dataset.retire = key.id;
      actions.append(retire);
    }
    if (key.state !== "revoked" && admin) {
      const revoke = button("Revoke", "danger", () => confirmRevoke(key));
      revoke.dataset.revoke = key.id;
      actions.append(revoke);
    }
    const parent = key.refreshed_from ? byId.get(key.refreshed_from) : null;
    const from = key.refreshed_from
      ? `${parent && parent.name ? parent.name + " " : ""}${key.refreshed_from}` : "";
    // A successor is drawn under the key it was refreshed from, one step in per
    // generation: a lineage reads top to bottom.
    const name = el("td", "lineage", text(key.name));
    name.style.paddingLeft = `${0.4 + depth * 1.2}rem`;
    if (depth > 0) name.prepend("\u21b3 ");
    const when = { revoked: key.revoked_at, expired: key.expires_at }[key.state];
    const status = el("td", `state ${key.state}`, key.state);
    if (when) status.title = `${key.state} ${when}`;
    const row = el("tr", key.state === "active" ? null : `ended ${key.state}`,
      name,
      el("td", "mono", key.id),
      el("td", null, key.role),
      status,
      el("td", "mono", from),
      el("td", null, text(key.created_at)),
      el("td", null, text(key.expires_at)),
      el("td", null, key.allow_ips && key.allow_ips.length ? key.allow_ips.join(", ") : "any"),
      el("td", "number", text(key.rpm_quota)),
      actions);
    row.dataset.key = key.id;
    row.dataset.state = key.state;
    body.append(row);
  }
}

// Each key followed by the keys refreshed from it (depth first, each level in
// the order they were made), with its depth; a key whose parent is not listed
// starts a lineage of its own.
function lineageOrder(keys) {
  const ids = new Set(keys.map((key) => key.id));
  const children = new Map();
  const roots = [];
  for (const key of keys) {
    if (key.refreshed_from && ids.has(key.refreshed_from)) {
      if (!children.has(key.refreshed_from)) children.set(key.refreshed_from, []);
      children.get(key.refreshed_from).push(key);
    } else {
      roots.push(key);
    }
  }
  const ordered = [];
  const visit = (key, depth) => {
    ordered.push([key, depth]);
    for (const child of children.get(key.id) || []) visit(child, depth + 1);
  };
  for (const root of roots) visit(root, 0);
  return ordered;
}

function confirmRetire(key) {
  confirmKeyChange(key, "Retire", "Retired", (name) =>
    `Key ${name} (ID ${key.id}) stops working now: every request made with it is ` +
    "refused with 401 by every server within 2 seconds. The keys refreshed from it keep " +
    "working (a planned rotation; for a leaked key, revoke instead).",
  () => api("POST", `v1/keys/${encodeURIComponent(key.id)}/retire`));
}

function confirmRevoke(key) {
  confirmKeyChange(key, "Revoke", "Revoked", (name) =>
    `Key ${name} (ID ${key.id}) is revoked now, and every key refreshed from it: ` +
    "every request made with them is refused with 401 by every server within 2 seconds. " +
    "This cannot be undone.",
  () => api("DELETE", `v1/keys/${encodeURIComponent(key.id)}`));
}

// A confirmation naming the key and what `verb` does to it, then `call`.
function confirmKeyChange(key, verb, done, says, call) {
  const self = key.id === state.whoami.key_id;
  const name = key.name || "(no name)";
  confirmAction({
    title: `${verb} key ${name}?`,
    facts: [["Name", name], ["ID", key.id], ["Role", key.role]],
    text: says(name) + (self ? " It is the key this console is using." : ""),
    action: `${verb} ${name}`,
    run: async () => {
      await call();
      showNotice(`${done} key ${name} (ID ${key.id}).`);
    },
  });
}

// --- the confirmation dialog -----------------------------------------------------

let pending = null;

function confirmAction(request) {
  pending = request;
  $("confirm-title").textContent = request.title;
  facts($("confirm-facts"), request.facts);
  $("confirm-text").textContent = request.text;
  $("confirm-ok").textContent = request.action;
  $("confirm").showModal();
}

async function confirmed() {
  const request = pending;
  pending = null;
  $("confirm").close();
  if (!request) return;
  showMessage("");
  try {
    await request.run();
  } catch (error) {
    showMessage(explain(error));
  }
  await refresh();
}

// --- views, polling, sign-in ---------------------------------------------------------

const VIEWS = { locks: loadLocks, pools: loadPools, keys: loadKeys };

async function refresh() {
  if (!state.key || !state.view) return;
  if (state.busy) {
    state.again = true; // one load at a time; the one asked for meanwhile follows
    return;
  }
  state.busy = true;
  try {
    do {
      state.again = false;
      await VIEWS[state.view]();
    } while (state.again && state.key && state.view);
  } catch (error) {
    showMessage(explain(error));
    if (error.status === 401) signOut(false); // revoked or expired while open
  } finally {
    state.busy = false;
  }
}

function showView() {
  if (!state.key) return;
  const wanted = location.hash.slice(1);
  const view = Object.hasOwn(VIEWS, wanted) ? wanted : "locks";
  state.view = view;
  state.rendered = { locks: "", pools: "", lock: "", pool: "", keys: "" };
  for (const name of Object.keys(VIEWS)) {
    $(`view-${name}`).hidden = name !== view;
    $(`tab-${name}`).classList.toggle("current", name === view);
  }
  showMessage("");
  refresh();
}

async function signIn(key) {
  state.key = key;
  let whoami;
  try {
    whoami = await api("GET", "v1/whoami");
  } catch (error) {
    state.key = null;
    sessionStorage.removeItem(KEY_STORAGE);
    showMessage(explain(error));
    return;
  }
  sessionStorage.setItem(KEY_STORAGE, key);
  state.whoami = whoami;
  $("api-key").value = "";
  $("sign-in").hidden = true;
  $("tabs").hidden = false;
  $("who").hidden = false;
  // A token from an identity provider (via "jwt") names a person, not a key.
  const who = whoami.via === "jwt"
    ? `${whoami.role} ${whoami.key_name || whoami.key_id}`
    : `${whoami.role} key ${whoami.key_id}`;
  $("who-text").textContent = `${who}, project ${whoami.project}`;
  document.body.dataset.role = whoami.role;
  showMessage("");
  showView();
  state.timer = setInterval(refresh, POLL_MS);
  state.ticker = setInterval(tick, 1000);
}

function signOut(clearMessage = true) {
  sessionStorage.removeItem(KEY_STORAGE);
  clearInterval(state.timer);
  clearInterval(state.ticker);
  Object.assign(state, { key: null, whoami: null, view: null, selectedLock: null,
    selectedPool: null });
  delete document.body.dataset.role;
  for (const name of Object.keys(VIEWS)) $(`view-${name}`).hidden = true;
  $("lock-detail").hidden = true;
  $("pool-detail").hidden = true;
  $("tabs").hidden = true;
  $("who").hidden = true;
  $("sign-in").hidden = false;
  showNotice("");
  if (clearMessage) showMessage("");
}

function start() {
  $("sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault(); // never a form submission: the key goes in a header only
    const key = $("api-key").value.trim();
    if (key) signIn(key);
  });
  $("sign-out").addEventListener("click", () => signOut());
  $("confirm-ok").addEventListener("click", confirmed);
  $("confirm-cancel").addEventListener("click", () => {
    pending = null;
    $("confirm").close();
  });
  $("confirm").addEventListener("close", () => { pending = null; });
  window.addEventListener("hashchange", showView);
  const saved = sessionStorage.getItem(KEY_STORAGE);
  if (saved) signIn(saved);
}

start();
