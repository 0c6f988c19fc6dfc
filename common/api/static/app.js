/* scrape-fleet control plane: the pages' behaviour, hand-written, no library, no build step.
   Every call goes to the JSON API with the login cookie (credentials: 'same-origin'); a 401
   sends the browser to the login page. Each page's code runs from <body data-page="…">. */
"use strict";

const POLL_MS = 1500;
const CHART_POINTS = 120;

/* ---- helpers ------------------------------------------------------------------------- */

class ApiError extends Error {
  constructor(status, body) {
    super(describe(body) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

function describe(body) {
  if (!body) return "";
  const detail = body.detail !== undefined ? body.detail : body;
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) return detail.map((d) => fieldPath(d.loc) + ": " + d.msg).join("; ");
  return JSON.stringify(detail);
}

function fieldPath(loc) {
  return (loc || []).filter((part, i) => !(i === 0 && part === "body")).join(".");
}

async function api(method, path, body) {
  const options = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
  if (body !== undefined) {
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const response = await fetch(path, options);
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = text; }
  if (response.status === 401 && !path.startsWith("/api/login")) {
    location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

/** An element: el("td", {class: "num", text: "3"}, child, …). */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function $(id) { return document.getElementById(id); }

/** A list out of an answer that is a list or holds one under one of `keys`. */
function listOf(data, ...keys) {
  if (Array.isArray(data)) return data;
  for (const key of keys) if (data && Array.isArray(data[key])) return data[key];
  if (data && typeof data === "object") {
    for (const key of keys) {
      if (data[key] && typeof data[key] === "object") {
        return Object.entries(data[key]).map(([name, v]) => ({ name, ...v }));
      }
    }
  }
  return [];
}

/** A job's progress figures (the job itself when they are not nested). */
function progressOf(job) {
  const p = job && typeof job.progress === "object" && job.progress ? job.progress : job || {};
  const state = (job && typeof job.state === "object" && job.state) || {};
  return { ...state, ...p, state: p.state || state.state || (typeof job.state === "string" ? job.state : "") };
}

const number = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en"));
function rate(n) { return n === null || n === undefined ? "–" : String(Math.round(n * 100) / 100); }
function duration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.round(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}
function eta(p) {
  if (p.state === "finished") return "done";
  if (p.state === "cancelled" || p.state === "created" || !p.run) return "–";
  if (p.known && p.known - p.done <= 0) return "0s";
  return duration(p.eta_s);
}
/** A record's time (Unix seconds or ms, or text) as UTC text. */
function when(value) {
  if (value === undefined || value === null || value === "") return "";
  if (typeof value !== "number") return String(value);
  const ms = value > 1e12 ? value : value * 1000;
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}
function percent(p) { return p.known ? Math.min(100, (100 * p.done) / p.known) : 0; }

function setBar(bar, p) {
  const value = percent(p);
  bar.firstElementChild.style.width = value.toFixed(1) + "%";
  bar.setAttribute("aria-valuenow", value.toFixed(0));
  bar.setAttribute("aria-valuetext", `${value.toFixed(0)}%: ${p.done || 0} of ${p.known || 0} URLs`);
  bar.classList.toggle("done", p.state === "finished");
}

/** Show `text` in the page's status line (an error when `bad`); `fromPoll`: a refresh's
 * error, which the next good refresh clears (a user action's message stays). */
function notice(text, bad, fromPoll) {
  const box = $("notice");
  if (!box) return;
  box.textContent = text;
  box.classList.toggle("bad", !!bad);
  box.hidden = !text;
  box.dataset.fromPoll = fromPoll ? "yes" : "";
}

function clearPollNotice() {
  const box = $("notice");
  if (box && box.dataset.fromPoll) notice("");
}

/** Run `task` now and every POLL_MS, one at a time; errors shown, polling goes on. */
function poll(task) {
  let busy = false;
  const tick = async () => {
    if (busy || document.hidden) return;
    busy = true;
    try {
      await task();
      clearPollNotice();
    } catch (e) {
      notice(e.message, true, true);
    } finally {
      busy = false;
    }
  };
  tick();
  return setInterval(tick, POLL_MS);
}

/* ---- login and logout ---------------------------------------------------------------- */

function loginPage() {
  const form = $("login-form");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const error = $("login-error");
    error.hidden = true;
    try {
      const token = $("token").value.trim();
      await api("POST", "/api/login", token ? { token }
        : { user: $("user").value, password: $("password").value });
      location.assign(form.dataset.next || "/");
    } catch (e) {
      error.textContent = e.status === 429 ? "Too many failed logins: try again later."
        : e.status === 401 ? ($("token").value.trim() ? "Unknown, revoked or expired token."
          : "Wrong user name or password.") : e.message;
      error.hidden = false;
      $("password").select();
    }
  });
}

function wireLogout() {
  const button = $("logout");
  if (!button) return;
  button.addEventListener("click", async () => {
    try { await api("POST", "/api/logout"); } catch (e) { notice(e.message, true); return; }
    location.assign("/login");
  });
}

/* ---- jobs list ----------------------------------------------------------------------- */

function jobsPage() {
  const body = document.querySelector("#jobs tbody");
  poll(async () => {
    const jobs = listOf(await api("GET", "/api/jobs"), "jobs", "items");
    $("jobs-empty").hidden = jobs.length > 0;
    body.replaceChildren(...jobs.map((job) => jobRow(job)));
  });
}

function jobRow(job) {
  const p = progressOf(job);
  const name = job.name || p.name;
  const bar = el("div", { class: "bar", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": 100,
    "aria-label": `progress of ${name}` }, el("span"));
  setBar(bar, p);
  return el("tr", { "data-job": name },
    el("td", { class: "job-name" }, el("a", { href: "/jobs/" + encodeURIComponent(name), text: name })),
    el("td", { "data-label": "State" }, el("span", { class: "badge " + p.state, text: p.state })),
    el("td", { "data-label": "Run", text: p.run || "–" }),
    el("td", { "data-label": "Progress" }, bar,
      el("span", { class: "bar-text", text: `${number(p.done || 0)} / ${number(p.known || 0)} (${percent(p).toFixed(0)} %)` })),
    el("td", { class: "num rate", "data-label": "Pages/s", text: rate(p.pages_per_s) }),
    el("td", { class: "num", "data-label": "ETA", text: eta(p) }),
    el("td", { class: "num", "data-label": "Failed", text: number(p.failed || 0) }));
}

/* ---- new job ------------------------------------------------------------------------- */

const FORM_FIELDS = { name: "name", seeds: "seeds", crawl: "depth", politeness: "rate", rules: "rules", text: "rules" };

function clearErrors(form) {
  form.querySelectorAll(".error").forEach((p) => { p.hidden = true; p.textContent = ""; });
  form.querySelectorAll("[aria-invalid]").forEach((i) => i.removeAttribute("aria-invalid"));
}

/** Show a 422's messages next to the fields they name; the rest above the form. */
function showErrors(form, error) {
  const detail = error.body && Array.isArray(error.body.detail) ? error.body.detail : null;
  if (!detail) {
    const top = $("form-error");
    top.textContent = error.message;
    top.hidden = false;
    top.focus();
    return;
  }
  let first = null;
  for (const item of detail) {
    const path = (item.loc || []).filter((part, i) => !(i === 0 && part === "body"));
    const id = FORM_FIELDS[path[0]];
    const box = id ? $(id + "-error") : $("form-error");
    const where = path.join(".") || "job";
    const msg = String(item.msg).startsWith(where + ":") ? item.msg : `${where}: ${item.msg}`;
    box.textContent = (box.hidden ? "" : box.textContent + " ") + msg;
    box.hidden = false;
    if (id) {
      $(id).setAttribute("aria-invalid", "true");
      first = first || $(id);
    }
  }
  if (first) first.focus();
}

/** The rules editor's text as JSON (the server reads YAML); undefined when empty. */
async function rulesValue() {
  const text = $("rules").value;
  if (!text.trim()) return undefined;
  const answer = await api("POST", "/ui/yaml", { text });
  return answer.rules === null ? undefined : answer.rules;
}

function jobSpec(rules) {
  const spec = { name: $("name").value.trim(),
    seeds: { urls: $("seeds").value.split("\n").map((s) => s.trim()).filter(Boolean) } };
  const depth = $("depth").value.trim();
  if (depth !== "") spec.crawl = { max_depth: /^\d+$/.test(depth) ? Number(depth) : depth };
  const limit = $("rate").value.trim();
  if (limit) spec.politeness = { rate_limit: limit };
  if (rules !== undefined) spec.rules = rules;
  return spec;
}

function newJobPage() {
  const form = $("job-form");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      const spec = jobSpec(await rulesValue());
      await api("POST", "/api/jobs", spec);
      location.assign("/jobs/" + encodeURIComponent(spec.name));
    } catch (e) {
      showErrors(form, e);
    } finally {
      button.disabled = false;
    }
  });
  $("try-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const error = $("try-error");
    error.hidden = true;
    $("try-result").hidden = true;
    clearErrors(form);
    try {
      const rules = await rulesValue();
      if (rules === undefined) throw new Error("write some rules in the editor first");
      const html = $("try-html").value, url = $("try-url").value.trim();
      // Pasted HTML is read as if fetched from the URL given (its base); else the URL is fetched.
      const body = html.trim() ? { rules, html, base_url: url || undefined } : { rules, url };
      if (!html.trim() && !url) throw new Error("give a page URL, or paste the page's HTML");
      showTry(await api("POST", "/api/rules/check", body));
    } catch (e) {
      error.textContent = e.message;
      error.hidden = false;
    }
  });
}

function showTry(answer) {
  const data = answer.data !== undefined ? answer.data : answer;
  $("try-data").textContent = JSON.stringify(data, null, 2)
    + (answer.rule ? `\n\n(rule: ${answer.rule})` : "")
    + (answer.data_errors && Object.keys(answer.data_errors).length
      ? "\n\nerrors: " + JSON.stringify(answer.data_errors, null, 2) : "");
  const links = answer.links || answer.kept_links || answer.rule_follow || answer.follow || [];
  $("try-links").replaceChildren(...links.map((link) =>
    el("li", { text: typeof link === "string" ? link : link.url || JSON.stringify(link) })));
  $("try-links-title").firstChild.textContent = answer.links_from === "page"
    ? "Links on the page (the rule follows none) " : "Kept links ";
  $("try-links-count").textContent = `(${links.length})`;
  $("try-result").hidden = false;
}

/* ---- one job ------------------------------------------------------------------------- */

function jobPage() {
  const name = document.body.dataset.job;
  const base = "/api/jobs/" + encodeURIComponent(name);
  const points = [];
  let lastResults = -1;
  poll(async () => {
    await showDeadLetters(name);  // first: the errors table takes its examples
    const job = await api("GET", base);
    const p = progressOf(job);
    showProgress(p, job);
    points.push(p.pages_per_s || 0);
    if (points.length > CHART_POINTS) points.shift();
    drawChart($("chart"), points);
    if (p.run && p.results !== lastResults) {
      lastResults = p.results;
      await showResults(base, p.run);
    }
    showDomains(job.domains || []);
  });
  window.addEventListener("resize", () => drawChart($("chart"), points));
  document.querySelectorAll("[data-action]").forEach((button) => {
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        const answer = await api("POST", `${base}/${button.dataset.action}`);
        notice(`Job ${name} is now ${(answer && answer.state) || button.dataset.action}.`);
      } catch (e) {
        notice(e.message, true);
      } finally {
        button.disabled = false;
      }
    });
  });
  const replay = $("replay");
  if (replay) {
    replay.addEventListener("click", async () => {
      replay.disabled = true;
      try {
        const answer = await api("POST", "/api/dead-letters/replay", { job: name });
        const kept = Object.entries(answer.refused || {}).map(([why, n]) => `${n} ${why}`).join(", ");
        notice(`Replayed ${answer.replayed || 0} dead letters` + (answer.kept ? `; ${answer.kept} kept in the queue (${kept})` : "") + ".");
        await showDeadLetters(name);
      } catch (e) {
        notice(e.message, true);
      } finally {
        replay.disabled = false;
      }
    });
  }
}

function showProgress(p, job) {
  const state = $("job-state");
  state.textContent = p.state;
  state.className = "badge " + p.state;
  $("job-run").textContent = p.run ? `(run ${p.run})` : "(no run yet)";
  const reason = p.reason || (job && job.reason) || "";
  $("job-reason").textContent = reason ? "Reason: " + reason : "";
  setBar($("job-bar"), p);
  $("f-done").textContent = `${number(p.done || 0)} / ${number(p.known || 0)}`;
  $("f-percent").textContent = percent(p).toFixed(1) + " %";
  $("f-rate").textContent = rate(p.pages_per_s);
  $("f-eta").textContent = eta(p);
  $("f-results").textContent = number(p.results || 0);
  $("f-failed").textContent = number(p.failed || 0);
  $("f-cancelled").textContent = number(p.cancelled || 0);
  $("f-bytes").textContent = number(p.bytes || 0);
  const allowed = { pause: p.state === "running", resume: p.state === "paused",
    cancel: p.state === "running" || p.state === "paused" || p.state === "created" };
  document.querySelectorAll("[data-action]").forEach((b) => { b.disabled = !allowed[b.dataset.action]; });
  const reasons = Object.entries(p.failed_by_reason || {});
  $("errors-none").hidden = reasons.length > 0;
  $("errors").hidden = reasons.length === 0;
  $("errors").tBodies[0].replaceChildren(...reasons.map(([reason, n]) =>
    el("tr", {}, el("td", { text: reason }), el("td", { class: "num", text: number(n) }),
      el("td", { class: "example", text: examples.get(reason) || "–" }))));
}

/** A line chart of `values` as inline SVG (no library). */
function drawChart(box, values) {
  const NS = "http://www.w3.org/2000/svg";
  // Drawn at the box's own width in pixels, so that its text is as large on a phone as on
  // a laptop (a scaled viewBox would shrink or blow it up).
  const W = Math.max(240, Math.round(box.clientWidth || 600)), H = 150, L = 40, B = 20, T = 8;
  const top = Math.max(1, ...values) * 1.1;
  const svg = document.createElementNS(NS, "svg");
  const make = (tag, attrs) => {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    return node;
  };
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  svg.setAttribute("role", "img");
  const last = values.length ? values[values.length - 1] : 0;
  svg.setAttribute("aria-label", `Pages per second over the last ${values.length} readings; now ${rate(last)}, highest ${rate(Math.max(0, ...values))}`);
  for (const f of [0, 0.5, 1]) {
    const y = T + (H - T - B) * (1 - f);
    svg.append(make("line", { class: f ? "grid" : "axis", x1: L, x2: W, y1: y, y2: y }));
    const label = make("text", { x: L - 4, y: y + 4, "text-anchor": "end" });
    label.textContent = rate((top * f) >= 10 ? Math.round(top * f) : top * f);
    svg.append(label);
  }
  const x = (i) => L + ((W - L) * i) / Math.max(1, CHART_POINTS - 1);
  const y = (v) => T + (H - T - B) * (1 - v / top);
  if (values.length > 1) {
    const line = values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    svg.append(make("polygon", { class: "area", points: `${x(0)},${y(0)} ${line} ${x(values.length - 1)},${y(0)}` }));
    svg.append(make("polyline", { class: "line", points: line }));
  }
  const caption = make("text", { x: L, y: H - 4 });
  caption.textContent = `${values.length} readings · now ${rate(last)} pages/s`;
  svg.append(caption);
  box.replaceChildren(svg);
}

const RECENT = 20;
const recent = { after: null, run: 0, records: [] };
const opened = new Set();

/** The run's newest RECENT records: pages read on from the last one seen (oldest first). */
async function showResults(base, run) {
  if (run !== recent.run) Object.assign(recent, { after: null, run, records: [] });
  for (let pages = 0; pages < 5; pages++) {
    const query = `run=${run}&limit=200` + (recent.after ? "&after=" + encodeURIComponent(recent.after) : "");
    const page = await api("GET", `${base}/results?${query}`);
    const items = listOf(page, "items", "results");
    recent.records = recent.records.concat(items).slice(-RECENT);
    if (items.length) recent.after = items[items.length - 1].id || recent.after;
    if (!page || !page.next) break;
  }
  const records = recent.records.slice().reverse();
  $("results-none").hidden = records.length > 0;
  $("results").replaceChildren(...records.map((record) => {
    const data = record.data !== undefined ? record.data : record;
    const details = el("details", { open: opened.has(record.id) },
      el("summary", { text: record.url || "(no URL)" }),
      el("p", { class: "meta", text: [record.status && `HTTP ${record.status}`, record.run && `run ${record.run}`,
        when(record.fetched_at || record.at)].filter(Boolean).join(" · ") }),
      el("pre", { class: "code", tabindex: 0, text: JSON.stringify(data, null, 2) }));
    // A refresh redraws the list: what the user opened stays open.
    details.addEventListener("toggle", () => {
      if (details.open) opened.add(record.id); else opened.delete(record.id);
    });
    return el("li", {}, details);
  }));
}

function showDomains(domains) {
  $("domains-none").hidden = domains.length > 0;
  $("domains").hidden = domains.length === 0;
  $("domains").tBodies[0].replaceChildren(...domains.map((d) => el("tr", {},
    el("td", { text: d.domain }), el("td", { text: d.throttle || "not throttled" }),
    el("td", { class: "num", text: number(d.deferred || 0) }))));
}

/** A URL for each failure reason, from the job's dead letters (the errors table's examples). */
const examples = new Map();

async function showDeadLetters(name) {
  const letters = listOf(await api("GET", "/api/dead-letters?job=" + encodeURIComponent(name)),
    "dead_letters", "items", "letters", "messages");
  for (const letter of letters) if (letter.reason && letter.url) examples.set(letter.reason, letter.url);
  $("dead-none").hidden = letters.length > 0;
  const replay = $("replay");
  if (replay) replay.hidden = letters.length === 0;
  $("dead").replaceChildren(...letters.map((letter) => el("li", {},
    el("span", { class: "url", text: letter.url || "(no URL)" }), " ",
    el("span", { class: "meta", text: "— " + (letter.reason || letter.error || "unknown") }))));
}

/* ---- workers ------------------------------------------------------------------------- */

function workersPage() {
  poll(async () => {
    const workers = listOf(await api("GET", "/api/workers"), "workers", "items");
    $("workers-empty").hidden = workers.length > 0;
    $("workers").replaceChildren(...workers.map(workerCard));
    const queues = listOf(await api("GET", "/api/queues"), "queues", "items");
    document.querySelector("#queues tbody").replaceChildren(...queues.map((q) => el("tr", {},
      el("td", { text: q.name || q.queue }), el("td", { class: "num", text: number(q.ready ?? q.messages) }),
      el("td", { class: "num", text: number(q.unacked) }), el("td", { class: "num", text: number(q.consumers) }))));
  });
}

function workerCard(w) {
  const pressure = w.pressure || {};
  const paused = pressure.paused || w.paused;
  const current = w.current || [];
  const jobs = Object.entries(w.jobs || {}).map(([run, n]) => `${run}: ${n}`).join(", ");
  return el("section", { class: "card worker", "data-worker": w.id, "aria-label": "worker " + w.id },
    el("h2", {}, el("span", { text: w.id + " " }),
      el("span", { class: "badge " + (paused ? "paused" : "running"), text: paused ? "paused" : "running" })),
    paused ? el("p", { class: "error", text: String(w.state || "").startsWith("paused") ? "Why: " + w.state
      : "Paused: " + (pressure.reasons || [pressure.reason || w.reason]).join(", ") }) : null,
    w.host ? el("p", { class: "meta", text: `host ${w.host}` + (w.pid ? `, pid ${w.pid}` : "") }) : null,
    el("p", { class: "meta", text: `fetching ${current.length} of ${number(w.concurrency)} · ${number(w.in_flight || 0)} deliveries held · processed ${number(w.processed || 0)}`
      + (w.beat_age_s !== undefined ? ` · beat ${rate(w.beat_age_s)}s ago` : "") + (w.stale ? " (stale)" : "") }),
    jobs ? el("p", { class: "meta", text: "job runs: " + jobs }) : null,
    el("h3", { text: `Current URLs (${current.length})` }),
    current.length ? el("ul", {}, ...current.map((u) => el("li", { text: u }))) : el("p", { class: "hint", text: "None." }));
}

/* ---- start --------------------------------------------------------------------------- */

const PAGES = { login: loginPage, jobs: jobsPage, "new-job": newJobPage, job: jobPage, workers: workersPage };

document.addEventListener("DOMContentLoaded", () => {
  wireLogout();
  const start = PAGES[document.body.dataset.page];
  if (start) start();
});
