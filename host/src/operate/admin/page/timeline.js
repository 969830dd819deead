// The status page's quota timeline: reads GET /_pooler/timeline (the pool's quota history,
// the threads' waiting periods) every 30 s and draws, per account, its 5-hour and weekly
// utilization over the last day or week as an inline SVG, with holds, errors and resets
// marked, and the threads' waits beneath. Its own file and functions: app.js draws the rest.
// Every sample is a circle carrying its data (data-at, data-utilization), and each chart
// its scale (data-from, data-to, data-x0, data-x1, data-y0, data-y1), so a test can check
// a known observation is drawn at its place.
"use strict";

const TIMELINE_REFRESH_MS = 30000;
const SPANS = { day: 24 * 3600 * 1000, week: 7 * 24 * 3600 * 1000 };
const SVG_NS = "http://www.w3.org/2000/svg";
// The chart's geometry in viewBox units.
const CHART = { width: 800, height: 130, x0: 44, x1: 790, y0: 12, y1: 112 };
// Shared windows only: the short one and the weekly one of each provider.
const SHORT_WINDOWS = ["5h", "primary"];
const WEEKLY_WINDOWS = ["7d", "secondary"];

let timelineSpan = "day";
let timelineData = null;
let timelineTimer = null;

// Outside text written out visibly (app.js's shown(), when loaded).
function tlText(text) {
  return typeof shown === "function" ? shown(text) : String(text);
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null) node.setAttribute(name, String(value));
  }
  if (text !== undefined) node.textContent = tlText(text);
  return node;
}

function scaleOf(from, to) {
  const x = (t) => CHART.x0 + ((t - from) / (to - from)) * (CHART.x1 - CHART.x0);
  const y = (u) => CHART.y0 + (1 - Math.max(0, Math.min(1, u))) * (CHART.y1 - CHART.y0);
  return { from, to, x, y };
}

function round(v) {
  return Math.round(v * 100) / 100;
}

// Time ticks: every 3 hours over a day, every day over a week (local time).
function timeTicks(from, to) {
  const step = to - from > SPANS.day * 1.5 ? SPANS.day : 3 * 3600 * 1000;
  const first = new Date(from);
  if (step === SPANS.day) first.setHours(24, 0, 0, 0);
  else first.setHours(Math.ceil((first.getHours() + first.getMinutes() / 60) / 3) * 3, 0, 0, 0);
  const ticks = [];
  for (let t = first.getTime(); t <= to; t += step) ticks.push(t);
  return { ticks, daily: step === SPANS.day };
}

function axes(box, s) {
  for (const u of [0, 0.5, 1]) {
    box.append(svg("line", { class: "grid", x1: CHART.x0, x2: CHART.x1, y1: round(s.y(u)), y2: round(s.y(u)) }));
    box.append(svg("text", { class: "axis", x: 2, y: round(s.y(u)) + 3 }, Math.round(u * 100) + "%"));
  }
  const { ticks, daily } = timeTicks(s.from, s.to);
  for (const t of ticks) {
    const d = new Date(t);
    const label = daily
      ? d.toLocaleDateString([], { month: "short", day: "numeric" })
      : d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    box.append(svg("line", { class: "grid", x1: round(s.x(t)), x2: round(s.x(t)), y1: CHART.y0, y2: CHART.y1 }));
    // A label that would run past the chart's right edge is left out.
    if (s.x(t) < CHART.x1 - 24) {
      box.append(svg("text", { class: "axis", x: round(s.x(t)) - 14, y: CHART.height - 4 }, label));
    }
  }
}

// The samples of one window kind of an account, oldest first.
function samplesOf(entries, account, names) {
  return entries.filter((e) => e.account === account && e.kind === "window" &&
    names.includes(e.window.name) && e.window.utilization !== null && e.window.utilization !== undefined);
}

// A step line of a window: each sample holds until the next one, or until its reset (the
// window starts over at 0); drawn from the span's start (the last sample before it
// carries in) to now.
function windowPath(samples, s, now) {
  const points = [];
  const before = samples.filter((e) => e.at < s.from);
  const inside = samples.filter((e) => e.at >= s.from);
  const series = (before.length ? [before[before.length - 1]] : []).concat(inside);
  for (let i = 0; i < series.length; i++) {
    const e = series[i];
    const start = Math.max(e.at, s.from);
    const end = i + 1 < series.length ? series[i + 1].at : now;
    const reset = e.window.resets_at;
    points.push([start, e.window.utilization]);
    if (reset && reset > start && reset < end) {
      points.push([reset, e.window.utilization], [reset, 0], [end, 0]);
    } else {
      points.push([end, e.window.utilization]);
    }
  }
  if (!points.length) return null;
  let d = "";
  points.forEach(([t, u], i) => {
    d += (i ? " L" : "M") + round(s.x(t)) + " " + round(s.y(u));
  });
  return d;
}

function accountChart(data, account, s) {
  const box = svg("svg", {
    viewBox: "0 0 " + CHART.width + " " + CHART.height,
    role: "img",
    "aria-label": "utilization of " + account.label,
    "data-from": s.from, "data-to": s.to,
    "data-x0": CHART.x0, "data-x1": CHART.x1, "data-y0": CHART.y0, "data-y1": CHART.y1,
  });
  axes(box, s);
  const mine = data.entries.filter((e) => e.account === account.id);
  // Holds: a band over their span, a mark where each began.
  for (const e of mine.filter((e) => e.kind === "hold" && e.until > s.from && e.at <= s.to)) {
    const x1 = s.x(Math.max(e.at, s.from));
    const x2 = s.x(Math.min(e.until, s.to));
    box.append(svg("rect", { class: "hold", "data-at": e.at, "data-until": e.until,
      x: round(x1), y: CHART.y0, width: round(Math.max(1, x2 - x1)), height: CHART.y1 - CHART.y0 }));
    if (e.at >= s.from) {
      const x = round(s.x(e.at));
      box.append(svg("path", { class: "hold-mark", d: "M" + x + " " + (CHART.y0 - 1) + " l-4 -8 h8 z" }));
    }
  }
  // Resets that passed within the span, once each per window.
  const resets = new Set();
  for (const e of mine.filter((e) => e.kind === "window")) {
    const r = e.window.resets_at;
    if (r && r >= s.from && r <= s.to && !resets.has(e.window.name + r)) {
      resets.add(e.window.name + r);
      box.append(svg("line", { class: "reset", "data-window": e.window.name, "data-at": r,
        x1: round(s.x(r)), x2: round(s.x(r)), y1: CHART.y0, y2: CHART.y1 }));
    }
  }
  for (const [kind, names] of [["w7d", WEEKLY_WINDOWS], ["w5h", SHORT_WINDOWS]]) {
    const samples = samplesOf(data.entries, account.id, names);
    const d = windowPath(samples, s, data.now);
    if (d) box.append(svg("path", { class: kind, d }));
    for (const e of samples.filter((e) => e.at >= s.from)) {
      box.append(svg("circle", { class: "sample " + kind + "-dot", r: 2.5,
        "data-window": e.window.name, "data-at": e.at, "data-utilization": e.window.utilization,
        cx: round(s.x(e.at)), cy: round(s.y(e.window.utilization)) },
      ));
    }
  }
  for (const e of mine.filter((e) => e.kind === "error" && e.at >= s.from)) {
    const x = round(s.x(e.at));
    box.append(svg("line", { class: "error-mark", "data-at": e.at, x1: x, x2: x, y1: CHART.y0, y2: CHART.y1 }));
  }
  return box;
}

function waitsChart(data, s) {
  const threads = [...new Set(data.waits.map((w) => w.thread))];
  const row = 16;
  const height = CHART.y0 + threads.length * row + 6;
  const box = svg("svg", { viewBox: "0 0 " + CHART.width + " " + height, role: "img",
    "aria-label": "threads waiting", "data-from": s.from, "data-to": s.to });
  threads.forEach((thread, i) => {
    const y = CHART.y0 + i * row;
    box.append(svg("text", { class: "wait-label", x: 2, y: y + 10 }, thread.length > 8 ? thread.slice(0, 7) + "…" : thread));
    for (const w of data.waits.filter((w) => w.thread === thread)) {
      const until = w.until === null ? data.now : w.until;
      if (until < s.from) continue;
      const x1 = s.x(Math.max(w.from, s.from));
      const x2 = s.x(Math.min(until, s.to));
      box.append(svg("rect", { class: "wait", "data-thread": thread, "data-from": w.from, "data-until": w.until,
        x: round(x1), y, width: round(Math.max(1, x2 - x1)), height: row - 4 }, undefined));
    }
  });
  return box;
}

function renderTimeline() {
  const root = document.getElementById("timeline");
  if (!root || !timelineData) return;
  const data = timelineData;
  const s = scaleOf(data.now - SPANS[timelineSpan], data.now);
  root.replaceChildren();
  for (const account of data.accounts) {
    const card = document.createElement("div");
    card.className = "chart";
    card.dataset.account = account.id;
    const title = document.createElement("h3");
    title.textContent = tlText(account.label + " · " + account.provider);
    card.append(title, accountChart(data, account, s));
    root.append(card);
  }
  if (data.waits.length) {
    const card = document.createElement("div");
    card.className = "chart";
    card.id = "timeline-waits";
    const title = document.createElement("h3");
    title.textContent = "Threads waiting";
    card.append(title, waitsChart(data, s));
    root.append(card);
  }
  if (!data.accounts.length) {
    const none = document.createElement("span");
    none.className = "muted";
    none.textContent = "no accounts yet";
    root.append(none);
  }
  root.dataset.span = timelineSpan;
  root.dataset.now = String(data.now);
}

async function refreshTimeline() {
  clearTimeout(timelineTimer);
  try {
    const response = await fetch("/_pooler/timeline", { credentials: "same-origin" });
    if (response.ok) {
      timelineData = await response.json();
      renderTimeline();
    }
  } catch (e) {
    // The overview's line says when the server cannot be reached.
  }
  timelineTimer = setTimeout(refreshTimeline, TIMELINE_REFRESH_MS);
}

for (const button of document.querySelectorAll(".timeline-controls button[data-span]")) {
  button.addEventListener("click", () => {
    timelineSpan = button.dataset.span;
    for (const b of document.querySelectorAll(".timeline-controls button[data-span]")) {
      b.classList.toggle("on", b === button);
    }
    renderTimeline();
  });
}

refreshTimeline();
