// The status page's script: reads GET /_pooler/overview every 2 s (the same snapshot as
// `pooler status`) and renders it; the buttons call the admin API with the page session's
// cookie and its CSRF token (x-pooler-csrf). Every text is set with textContent, through
// shown(): text from outside (an upstream's error, a label, an id) is written out visibly.
"use strict";

const CSRF = document.querySelector('meta[name="pooler-csrf"]').content;
const REFRESH_MS = 2000;

// The characters the CLI shows escaped too (`format::hidden` in host/src/cli/format.rs):
// C0, DEL and C1 controls, bidi controls, zero-width and other invisible format
// characters, line and paragraph separators, tag characters (U+E0000–U+E007F, as UTF-16).
const HIDDEN = /[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]|\udb40[\udc00-\udc7f]/g;

// `text` with each hidden character written out as the CLI writes it: \n, \t, \x1b,
// \u{202e}. Nothing is dropped: a bidi override shows as itself instead of reordering.
function shown(text) {
  return String(text).replace(HIDDEN, (c) => {
    if (c === "\n") return "\\n";
    if (c === "\r") return "\\r";
    if (c === "\t") return "\\t";
    const n = c.codePointAt(0);
    return n <= 0xff ? "\\x" + n.toString(16).padStart(2, "0") : "\\u{" + n.toString(16) + "}";
  });
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null) node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(shown(child)) : child);
  }
  return node;
}

// "in 2 h 10 m", "5 m ago", "now": `ms` against the host clock's `now`.
function relative(ms, now) {
  const future = ms >= now;
  let s = Math.floor(Math.abs(ms - now) / 1000);
  if (s < 1) return "now";
  let text;
  if (s < 60) text = s + " s";
  else if (s < 3600) text = Math.floor(s / 60) + " m";
  else if (s < 86400) {
    const m = Math.floor((s % 3600) / 60);
    text = Math.floor(s / 3600) + " h" + (m ? " " + m + " m" : "");
  } else {
    const h = Math.floor((s % 86400) / 3600);
    text = Math.floor(s / 86400) + " d" + (h ? " " + h + " h" : "");
  }
  return future ? "in " + text : text + " ago";
}

function when(ms, now) {
  const d = new Date(ms);
  const sameDay = new Date(now).toDateString() === d.toDateString();
  const clock = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  const local = sameDay ? clock : d.toLocaleDateString([], { month: "short", day: "numeric" }) + " " + clock;
  return local + " (" + relative(ms, now) + ")";
}

function availability(a, now) {
  if (!a) return "—";
  switch (a.kind) {
    case "ready": return "can serve now";
    case "not-routed": return "not routed";
    case "blocked": return "blocked (" + a.cause + ") until " + when(a.retry_at, now);
    case "unavailable": return "unavailable: " + a.reason;
    default: return a.kind;
  }
}

function bar(utilization) {
  const pct = Math.max(0, Math.min(1, utilization)) * 100;
  const cls = pct >= 100 ? "bar full" : pct >= 80 ? "bar high" : "bar";
  return el("span", { class: cls }, el("span", { style: null }));
}

function windowsOf(account, now) {
  const box = el("div");
  for (const w of account.windows) {
    const name = w.family ? w.name + " (" + w.family + ")" : w.name;
    const line = el("div", { class: "window" }, name + " ");
    if (w.utilization !== null && w.utilization !== undefined) {
      const b = bar(w.utilization);
      // Width through the CSSOM, which the policy allows (no inline style attribute).
      b.firstChild.style.width = Math.round(Math.min(1, w.utilization) * 100) + "%";
      line.append(b, " " + Math.round(w.utilization * 100) + "%");
    }
    if (w.resets_at) line.append(" · resets " + when(w.resets_at, now));
    box.append(line);
  }
  if (!account.windows.length) box.append(el("span", { class: "muted" }, "no usage seen yet"));
  return box;
}

// The options a person set that differ from the defaults, in words.
function optionsOf(a) {
  const words = [];
  if (a.last_resort) words.push("last-resort");
  if (a.extra_usage === "allow") words.push("extra usage allowed");
  if (a.max_in_flight > 0) words.push("≤ " + a.max_in_flight + " in flight");
  if (a.preserve < 1) words.push("preserve " + Math.round(a.preserve * 100) + "%");
  return words.join(" · ");
}

function why(account) {
  if (account.error) return account.error;
  if (account.status === "held") return "held after a rate limit";
  if (account.status === "exhausted") {
    const blocking = account.windows.filter((w) => w.blocking).map((w) => w.name);
    return "quota exhausted" + (blocking.length ? " (" + blocking.join(", ") + ")" : "");
  }
  if (account.status === "disabled") return "disabled by a person";
  if (account.needs_sign_in) return "sign in again soon";
  return "";
}

async function act(button, method, path, done) {
  button.disabled = true;
  const notice = document.getElementById("notice");
  try {
    const response = await fetch("/_pooler/" + path, {
      method,
      credentials: "same-origin",
      headers: { "x-pooler-csrf": CSRF, "content-type": "application/json" },
      body: "{}",
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error((answer.error && answer.error.message) || response.statusText);
    notice.className = "";
    notice.textContent = shown(done);
  } catch (e) {
    notice.className = "bad";
    notice.textContent = shown(e.message);
  }
  await refresh();
}

function renderProviders(o) {
  const box = document.getElementById("providers");
  box.replaceChildren();
  for (const p of o.providers) {
    if (!p.accounts) continue;
    const s = p.serving;
    let text;
    if (s.kind === "ready") text = "serving now";
    else if (s.kind === "blocked") text = "blocked (" + s.cause + "); serves again " + when(s.retry_at, o.now);
    else text = "unavailable: " + s.reason;
    box.append(el("div", { class: "card", "data-provider": p.provider },
      el("b", {}, p.provider), " ",
      el("span", { class: "status " + s.kind }, text),
      el("div", { class: "muted" }, p.serving_accounts + " of " + p.accounts + " accounts serving, " + p.enabled + " enabled" +
        (p.strategy ? " · new conversations: " + p.strategy : ""))));
  }
  if (!box.children.length) box.append(el("span", { class: "muted" }, "no accounts yet"));
}

function count(n) {
  return n < 1000 ? String(n) : n < 1e6 ? (n / 1e3).toFixed(1) + "k" : (n / 1e6).toFixed(1) + "M";
}

// An account's tokens today and in the last 5 hours, with the share of input read from the
// prompt cache.
function tokensOf(t) {
  if (!t || !t.today.answers) return "—";
  const line = (c) => {
    const input = c.input + c.cache_read + c.cache_write;
    const hit = input ? " · cache hit " + Math.round((100 * c.cache_read) / input) + " %" : "";
    return "in " + count(c.input) + " · out " + count(c.output) + " · cache read " + count(c.cache_read) +
      " · write " + count(c.cache_write) + hit;
  };
  return el("div", { "data-tokens": "" }, line(t.today), el("div", { class: "muted" }, "last 5 h: " + line(t.last_5h)));
}

function renderAccounts(o) {
  const body = document.querySelector("#accounts tbody");
  body.replaceChildren();
  for (const a of o.accounts) {
    const button = a.enabled
      ? el("button", { "data-action": "disable" }, "Disable")
      : el("button", { "data-action": "enable" }, "Enable");
    const action = a.enabled ? "disable" : "enable";
    button.addEventListener("click", () =>
      act(button, "POST", "accounts/" + encodeURIComponent(a.id) + "/" + action, a.label + ": " + action + "d"));
    body.append(el("tr", { "data-account": a.id, "data-status": a.status },
      el("td", {}, a.label, el("div", { class: "muted" }, el("code", {}, a.id), " · " + a.provider + " · " + a.secret_hint),
        optionsOf(a) ? el("div", { class: "muted", "data-options": "" }, optionsOf(a)) : null),
      el("td", { class: "status " + a.status }, a.status),
      el("td", {}, windowsOf(a, o.now)),
      el("td", {}, a.blocking_reset ? when(a.blocking_reset, o.now) : a.held_until ? when(a.held_until, o.now) : "—"),
      el("td", {}, why(a)),
      el("td", { class: "pins" }, String((o.pinned_sessions || {})[a.id] || 0)),
      el("td", { class: "tokens" }, tokensOf((o.tokens || {})[a.id])),
      el("td", {}, button)));
  }
  if (!o.accounts.length) body.append(el("tr", {}, el("td", { colspan: "8", class: "muted" }, "no accounts")));
}

function renderThreads(o) {
  const body = document.querySelector("#threads tbody");
  body.replaceChildren();
  for (const t of o.threads) {
    const r = t.retry;
    const sendAt = t.row ? t.row.send_at : r && r.send_at;
    let next = "—";
    if (sendAt) next = "attempt " + (t.row ? t.row.attempt : r.next_attempt) + " at " + when(sendAt, o.now);
    else if (r && r.state === "watching") next = "watching until the pool can serve";
    const reason = r ? r.reason : t.row ? t.row.reason : "";
    let button = null;
    if (t.row) {
      button = el("button", { "data-action": "send-now" }, "Send now");
      button.addEventListener("click", () =>
        act(button, "POST", "threads/" + encodeURIComponent(t.id) + "/send-now", t.id + ": retry sent"));
    }
    body.append(el("tr", { "data-thread": t.id, "data-status": t.status },
      el("td", {}, el("code", {}, t.id), el("div", { class: "muted" }, t.provider + (t.model ? " · " + t.model : ""))),
      el("td", {}, t.agent),
      el("td", { class: "status " + t.status }, t.status + (t.input_queued ? " (message queued)" : "")),
      el("td", {}, availability(t.availability, o.now)),
      el("td", { class: "retry " + (r ? r.state : ""), "data-send-at": sendAt || null }, next),
      el("td", {}, reason),
      el("td", {}, button)));
  }
  if (!o.threads.length) body.append(el("tr", {}, el("td", { colspan: "7", class: "muted" }, "no threads")));
}

function renderProblems(o) {
  const list = document.getElementById("problems");
  list.replaceChildren(...o.problems.map((p) => el("li", {}, el("b", {}, p.part + ": "), p.message)));
  document.getElementById("problems-section").hidden = !o.problems.length;
}

let timer = null;
async function refresh() {
  clearTimeout(timer);
  const updated = document.getElementById("updated");
  try {
    // "Today" of the token counts is the browser's local day.
    const offset = -new Date().getTimezoneOffset() * 60;
    const response = await fetch("/_pooler/overview?utc_offset_s=" + offset, { credentials: "same-origin" });
    if (response.status === 401) {
      updated.textContent = "signed out: run `pooler page` for a new link";
      return;
    }
    const o = await response.json();
    if (!response.ok) throw new Error((o.error && o.error.message) || response.statusText);
    renderProviders(o);
    renderAccounts(o);
    renderThreads(o);
    renderProblems(o);
    updated.textContent = "updated " + new Date(o.now).toLocaleTimeString();
    updated.dataset.now = String(o.now);
  } catch (e) {
    updated.textContent = shown("cannot reach the server: " + e.message);
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

refresh();
