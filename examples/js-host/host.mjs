#!/usr/bin/env node
// An example JavaScript host for the two Pooler plugins, on jco (https://github.com/bytecodealliance/jco).
//
// It does what the Rust host does for one request, in one file, to show what any host must
// provide: it transpiles both components with jco, gives them their imports (the contract in
// `wit/worlds.wit`), serves the pool's `wasi:http` incoming handler on 127.0.0.1, sends one
// Claude Messages request through it and feeds the outcome to Provider Retry, wiring the two
// plugins together the way the Rust host's mediator does. It prints one JSON object on stdout.
//
//   node host.mjs --pool account_pool.wasm --retry provider_retry.wasm \
//       --upstream http://127.0.0.1:PORT [--now EPOCH_MS] [--build-dir DIR]
//
// What a host must provide (per world; `wit/*.wit` carries each contract):
// - both plugins (`imports` world): `sqlite` (the plugin's own databases: here sql.js, in
//   memory for the host's life), `log` (lines tagged with the plugin's id), WASI clocks and
//   random, and — only so Rust's std links — the rest of WASI's command imports (stdio,
//   environment, exit), which this host keeps empty: no environment variables (they would
//   leak the host's secrets), and a plugin's stdout goes to stderr (stdout is the report).
// - the pool: `availability-listener` (queue and coalesce the signal, deliver it to every
//   listener after the pool's call returned), `incoming-client` (whether the HTTP client
//   left), and `wasi:http/outgoing-handler`, allowed only to the hosts of the pool's
//   configured upstream and token URLs.
// - Provider Retry: `availability` (answered by a fresh pool instance) and `threads` (the
//   core's threads and retry queue; here a small in-memory one holding this run's thread).
// Each export call and each HTTP request runs in a fresh instance, as the contract says.
//
// jco quirks measured with jco 1.35.0 on Node 20: the generated `.d.ts` names versioned
// import keys (`pooler:plugins/sqlite@0.1.0`) while the generated JS reads unversioned ones
// (`pooler:plugins/sqlite`), so every import is passed under both; exports are synchronous,
// so the host serves one request at a time and the pool's inline waits (a short
// Retry-After, a token refresh in progress) block the whole host while they last.
//
// Clock: with `--now`, the host clock is manual and stays at that instant (wall clock and
// monotonic `now`); timers (`subscribe-duration`) still wait in real time. Without it the
// host clock is the real one.

import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import * as shim from "@bytecodealliance/preview2-shim";
import { HTTPServer } from "@bytecodealliance/preview2-shim/http";
import { transpile } from "@bytecodealliance/jco";
import initSqlJs from "sql.js";

const HELP = `Usage: node host.mjs --pool FILE --retry FILE --upstream URL [--now MS] [--build-dir DIR]

Serves one Claude Messages request through the Account Pooler component (on jco) to the
upstream, feeds its outcome to the Provider Retry component, and prints JSON on stdout.

  --pool FILE       the account-pool component (.wasm)
  --retry FILE      the provider-retry component (.wasm)
  --upstream URL    the Claude API base URL the pool forwards to (claude-upstream-url)
  --now MS          a manual host clock fixed at this unix time in milliseconds
  --build-dir DIR   where jco's output goes (default: build/ beside this file)
  -h, --help        this help

The API key of the account to add is read from POOLER_EXAMPLE_API_KEY (never from argv).

Exit codes: 0 the scenario ran, 1 it failed, 2 bad usage.`;

function usage(message) {
  process.stderr.write(`error: ${message}\n\n${HELP}\n`);
  process.exit(2);
}

let args;
try {
  args = parseArgs({
    options: {
      pool: { type: "string" },
      retry: { type: "string" },
      upstream: { type: "string" },
      now: { type: "string" },
      "build-dir": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  }).values;
} catch (e) {
  usage(e.message);
}
if (args.help) {
  process.stdout.write(`${HELP}\n`);
  process.exit(0);
}
for (const name of ["pool", "retry", "upstream"]) if (!args[name]) usage(`--${name} is required`);
if (!/^https?:\/\/[^/]+/.test(args.upstream)) usage("--upstream must be an absolute http(s) URL");
if (args.now !== undefined && !/^\d+$/.test(args.now)) usage("--now must be unix milliseconds");
const apiKey = process.env.POOLER_EXAMPLE_API_KEY;
if (!apiKey) usage("set POOLER_EXAMPLE_API_KEY to the Claude API key of the account to add");
const here = dirname(fileURLToPath(import.meta.url));
const buildDir = args["build-dir"] ?? join(here, "build");
const fixedNow = args.now === undefined ? undefined : Number(args.now);

// ---- the host clock -------------------------------------------------------------------
const nowMs = () => fixedNow ?? Date.now();
const wallClock = {
  now: () => ({ seconds: BigInt(Math.floor(nowMs() / 1000)), nanoseconds: (nowMs() % 1000) * 1e6 }),
  resolution: () => ({ seconds: 0n, nanoseconds: 1e6 }),
};
const monotonicClock = {
  now: () => BigInt(nowMs()) * 1_000_000n,
  resolution: () => 1_000_000n,
  subscribeDuration: (ns) => shim.clocks.monotonicClock.subscribeDuration(ns),
  subscribeInstant: (at) => {
    const left = at - monotonicClock.now();
    return shim.clocks.monotonicClock.subscribeDuration(left > 0n ? left : 0n);
  },
};

// ---- sqlite over sql.js -------------------------------------------------------------------
// One in-memory database per (plugin, name), kept for the host's life. sql.js runs in this
// thread, so there is no locking (`busy` never happens); a file ATTACHed by a plugin would
// live in sql.js's own in-memory file system, never on the host's disk.
const SQL = await initSqlJs();
const databases = new Map();
const fail = (tag, val) => {
  throw { payload: val === undefined ? { tag } : { tag, val } };
};
function sqlError(e) {
  const text = String(e?.message ?? e);
  if (/constraint failed/i.test(text)) return fail("constraint", text);
  if (/database is locked|busy/i.test(text)) return fail("busy");
  return fail("invalid-statement", text);
}
const toSql = (v) => (v.tag === "null" ? null : v.val);
function fromSql(v) {
  if (v === null) return { tag: "null" };
  if (typeof v === "bigint") return { tag: "integer", val: v };
  if (typeof v === "number") return { tag: "real", val: v };
  if (typeof v === "string") return { tag: "text", val: v };
  return { tag: "blob", val: v };
}
function sqliteFor(plugin) {
  class Connection {
    static open(name) {
      if (!name || name.length > 64 || /[/\\\x00-\x1f]|\.\./.test(name) || name.startsWith("."))
        fail("invalid-name", name);
      const key = `${plugin}/${name}`;
      if (!databases.has(key)) {
        const db = new SQL.Database();
        db.exec("PRAGMA foreign_keys = ON");
        databases.set(key, db);
      }
      return new Connection(databases.get(key));
    }
    constructor(db) {
      this.db = db;
    }
    query(sql, params) {
      let stmt;
      try {
        stmt = this.db.prepare(sql);
        stmt.bind(params.map(toSql));
        const rows = [];
        while (stmt.step()) rows.push(stmt.get(null, { useBigInt: true }).map(fromSql));
        return { columns: stmt.getColumnNames(), rows };
      } catch (e) {
        return sqlError(e);
      } finally {
        stmt?.free();
      }
    }
    execute(sql, params) {
      this.query(sql, params);
      return BigInt(this.db.getRowsModified());
    }
    executeBatch(sql) {
      try {
        this.db.exec(sql);
      } catch (e) {
        sqlError(e);
      }
    }
    lastInsertRowid() {
      const stmt = this.db.prepare("SELECT last_insert_rowid()");
      try {
        stmt.step();
        return stmt.get(null, { useBigInt: true })[0];
      } finally {
        stmt.free();
      }
    }
    // A connection dropped with a transaction open rolls it back.
    [Symbol.dispose ?? Symbol.for("dispose")]() {
      rollback(this.db);
    }
  }
  return { Connection };
}
function rollback(db) {
  try {
    db.exec("ROLLBACK");
  } catch {
    // No transaction was open.
  }
}
// After each call of a plugin: a transaction its instance left open (it trapped, or never
// dropped the connection) is rolled back before another instance opens the database.
function rollbackLeftOpen(plugin) {
  for (const [key, db] of databases) if (key.startsWith(`${plugin}/`)) rollback(db);
}

// ---- log ------------------------------------------------------------------------------------
const logFor = (plugin) => ({
  log: (level, message, fields) =>
    process.stderr.write(`${JSON.stringify({ plugin, level, message, fields: Object.fromEntries(fields) })}\n`),
});

// ---- the pool's outgoing HTTP, allowed only to its configured upstream and token URLs -----
const allowedHosts = new Set();
const outgoingHandler = {
  handle(request, options) {
    if (!allowedHosts.has(request.authority())) fail("HTTP-request-denied");
    return shim.http.outgoingHandler.handle(request, options);
  },
};

// ---- availability-listener: queued, coalesced per provider, delivered after the call --------
const pendingChanges = new Map();
const delivered = [];
const availabilityListener = {
  // As the Rust host's `coalesce`: causes unioned in first-seen order, the newest `earliest`
  // hint, the first detection time.
  availabilityChanged(change) {
    const queued = pendingChanges.get(change.provider);
    if (!queued) pendingChanges.set(change.provider, { ...change, causes: [...new Set(change.causes)] });
    else {
      for (const c of change.causes) if (!queued.causes.includes(c)) queued.causes.push(c);
      queued.earliest = change.earliest;
      if (change.detectedAt < queued.detectedAt) queued.detectedAt = change.detectedAt;
    }
  },
};

// ---- threads: the core's threads and retry queue, in memory --------------------------------
const threadsById = new Map();
// Each turn request's attempt and its chain's original request, as the core records them.
const turns = new Map();
const rows = [];
let nextRow = 1n;
const threadError = (id) => fail("no-such-thread", id);
// A live row of `thread`: as the core, a row of another thread is refused as `no-such-row`
// (and said on stderr) and left as it was.
const liveRow = (thread, id) => {
  const row = rows.find((r) => r.id === id) ?? fail("no-such-row", id);
  if (row.thread !== thread) {
    process.stderr.write(`threads call refused: row ${id} is a row of thread ${row.thread}, not of ${thread}\n`);
    fail("no-such-row", id);
  }
  return row;
};
const checkReason = (reason) => {
  if (!reason || reason.length > 200) fail("invalid-argument", "a reason is 1–200 characters");
};
const threads = {
  getThread: (id) => threadsById.get(id) ?? threadError(id),
  getThreads: (ids) =>
    ids.map((id) => (threadsById.has(id) ? { tag: "ok", val: threadsById.get(id) } : { tag: "err", val: { tag: "no-such-thread", val: id } })),
  scheduleRetry(thread, failedRequest, sendAt, reason) {
    const t = threads.getThread(thread);
    checkReason(reason);
    if (t.archived) fail("archived");
    if (t.status !== "error" || t.latestRequest !== failedRequest) fail("no-failed-turn");
    const live = rows.find((r) => r.thread === thread);
    if (live) fail("already-queued", live.id);
    const turn = turns.get(failedRequest);
    const row = {
      id: nextRow++, thread, kind: "retry", failedRequest, originalRequest: turn.original, attempt: turn.attempt + 1,
      sendAt, reason, createdAt: BigInt(nowMs()), waitingForSlot: false,
    };
    rows.push(row);
    return row;
  },
  reschedule(thread, id, sendAt, reason) {
    checkReason(reason);
    return Object.assign(liveRow(thread, id), { sendAt, reason });
  },
  rescheduleMany: (moves) => moves.map((m) => attempt(() => threads.reschedule(m.thread, m.row, m.sendAt, m.reason))),
  cancel(thread, id, reason) {
    checkReason(reason);
    rows.splice(rows.indexOf(liveRow(thread, id)), 1);
  },
  listRows: (thread) => rows.filter((r) => thread === undefined || r.thread === thread),
};
function attempt(f) {
  try {
    return { tag: "ok", val: f() };
  } catch (e) {
    if (e && "payload" in e) return { tag: "err", val: e.payload };
    throw e;
  }
}

// ---- availability: Provider Retry's questions, answered by a fresh pool instance ------------
// A pool that traps is answered for, as the contract says, with `unavailable(source-unavailable)`
// (its 5 s deadline is not enforced here: a synchronous call cannot be interrupted).
const SOURCE_UNAVAILABLE = { tag: "unavailable", val: "source-unavailable" };
function askPool(f, fallback) {
  try {
    return call(POOL, f);
  } catch (e) {
    process.stderr.write(`the pool could not answer an availability query: ${e?.message ?? e}\n`);
    return fallback;
  }
}
const availability = {
  query: (q) => askPool((i) => i.availability.query(q), SOURCE_UNAVAILABLE),
  queryMany(qs) {
    const answers = askPool((i) => i.availability.queryMany(qs), []);
    return answers.length === qs.length ? answers : qs.map(() => SOURCE_UNAVAILABLE);
  },
};

// ---- metrics: what the plugins count, summed per plugin and name ----------------------------
const metrics = {};
function metricsFor(plugin) {
  const mine = (metrics[plugin] ??= {});
  return {
    counterAdd(name, _labels, delta) {
      mine[name] = (mine[name] ?? 0) + Number(delta);
    },
    observe(name, _labels, _value) {
      mine[name] = (mine[name] ?? 0) + 1;
    },
  };
}

// ---- the import table -------------------------------------------------------------------
// One entry per import: its interface, version and the object that implements it for a
// plugin. Adding an import (a new WIT interface) is one more entry here.
const WASI = "0.2.12";
const never = () => shim.clocks.monotonicClock.subscribeDuration(24n * 86_400n * 1_000_000_000n);
const IMPORTS = [
  { name: "pooler:plugins/sqlite", version: "0.1.0", provide: (p) => sqliteFor(p) },
  { name: "pooler:plugins/log", version: "0.1.0", provide: (p) => logFor(p) },
  { name: "pooler:plugins/availability-listener", version: "0.1.0", provide: () => availabilityListener },
  // The client of a request never leaves here before its answer (the host reads it whole):
  // `subscribe-gone` is a pollable that does not become ready during a request.
  { name: "pooler:plugins/incoming-client", version: "0.1.0", provide: () => ({ gone: () => false, subscribeGone: never }) },
  { name: "pooler:plugins/availability", version: "0.1.0", provide: () => availability },
  { name: "pooler:plugins/threads", version: "0.1.0", provide: () => threads },
  // Prometheus counters and histograms. This host serves no /metrics: it counts the calls so
  // the report can show what the plugins measured, and keeps nothing else.
  { name: "pooler:plugins/metrics", version: "0.1.0", provide: (p) => metricsFor(p) },
  { name: "wasi:clocks/wall-clock", version: WASI, provide: () => wallClock },
  { name: "wasi:clocks/monotonic-clock", version: WASI, provide: () => monotonicClock },
  { name: "wasi:random/random", version: WASI, provide: () => shim.random.random },
  { name: "wasi:random/insecure-seed", version: WASI, provide: () => shim.random.insecureSeed },
  { name: "wasi:io/error", version: WASI, provide: () => shim.io.error },
  { name: "wasi:io/poll", version: WASI, provide: () => shim.io.poll },
  { name: "wasi:io/streams", version: WASI, provide: () => shim.io.streams },
  { name: "wasi:http/types", version: WASI, provide: () => shim.http.types },
  { name: "wasi:http/outgoing-handler", version: WASI, provide: () => outgoingHandler },
  { name: "wasi:cli/environment", version: WASI, provide: () => ({ getEnvironment: () => [], getArguments: () => [], initialCwd: () => undefined }) },
  { name: "wasi:cli/exit", version: WASI, provide: () => shim.cli.exit },
  { name: "wasi:cli/stdin", version: WASI, provide: () => shim.cli.stdin },
  { name: "wasi:cli/stdout", version: WASI, provide: () => ({ getStdout: () => shim.cli.stderr.getStderr() }) },
  { name: "wasi:cli/stderr", version: WASI, provide: () => shim.cli.stderr },
  { name: "wasi:cli/terminal-input", version: WASI, provide: () => shim.cli.terminalInput },
  { name: "wasi:cli/terminal-output", version: WASI, provide: () => shim.cli.terminalOutput },
  { name: "wasi:cli/terminal-stdin", version: WASI, provide: () => shim.cli.terminalStdin },
  { name: "wasi:cli/terminal-stdout", version: WASI, provide: () => shim.cli.terminalStdout },
  { name: "wasi:cli/terminal-stderr", version: WASI, provide: () => shim.cli.terminalStderr },
];
function importsFor(plugin) {
  const table = {};
  for (const { name, version, provide } of IMPORTS) {
    const impl = provide(plugin);
    table[name] = impl;
    table[`${name}@${version}`] = impl;
  }
  return table;
}

// ---- transpile and instantiate ------------------------------------------------------------
// Each plugin's id (tags its log lines, names its databases) is its role's name.
const POOL = "account-pool";
const RETRY = "provider-retry";
const plugins = {};
const transpileMs = {};
for (const [plugin, file] of [[POOL, args.pool], [RETRY, args.retry]]) {
  const started = performance.now();
  let files;
  try {
    ({ files } = await transpile(readFileSync(file), { name: plugin, instantiation: "sync", quiet: true }));
  } catch (e) {
    process.stderr.write(`error: could not transpile the ${plugin} component ${file}: ${e?.message ?? e}\n`);
    process.exit(1);
  }
  transpileMs[plugin] = Math.round(performance.now() - started);
  const out = join(buildDir, plugin);
  for (const [name, bytes] of Object.entries(files)) {
    mkdirSync(dirname(join(out, name)), { recursive: true });
    writeFileSync(join(out, name), bytes);
  }
  const generated = await import(pathToFileURL(join(out, `${plugin}.js`)).href);
  const modules = new Map();
  const core = (name) => modules.get(name) ?? modules.set(name, new WebAssembly.Module(readFileSync(join(out, name)))).get(name);
  plugins[plugin] = () => generated.instantiate(core, importsFor(plugin));
}

const json = (value) => JSON.stringify(value, (_, v) => (typeof v === "bigint" ? Number(v) : v));

// Run `f` on a fresh instance of `plugin`; once the outermost call has returned (a plugin's
// call may call another plugin through an import), deliver the changes signalled meanwhile.
let depth = 0;
function call(plugin, f) {
  depth++;
  let result;
  try {
    result = f(plugins[plugin]());
  } finally {
    rollbackLeftOpen(plugin);
    depth--;
  }
  if (depth === 0) deliverChanges();
  return result;
}
// Delivery, after the signalling call returned, one call at a time, never re-entrantly; a
// listener that fails gets the change again (here: up to three times, then it is reported).
function deliverChanges() {
  depth++;
  try {
    for (let tries = 0; pendingChanges.size > 0 && tries < 3; tries++) {
      for (const [provider, change] of [...pendingChanges]) {
        pendingChanges.delete(provider);
        try {
          call(RETRY, (i) => i.availabilityListener.availabilityChanged(change));
          delivered.push(change);
        } catch (e) {
          // A transient error or a trap: queue it again (coalesced with any newer change);
          // `invalid-input` is final.
          process.stderr.write(`availability-changed failed: ${json(e?.payload ?? String(e))}\n`);
          if (e?.payload?.tag !== "invalid-input") availabilityListener.availabilityChanged(change);
        }
      }
    }
  } finally {
    depth--;
  }
}

// ---- the scenario: one request through the pool, its outcome to Provider Retry ----------
const THREAD = "js-host-thread";
const REQUEST = "js-host-request-1";
const MODEL = "claude-sonnet-4-5";

try {
  // The pool forwards to --upstream; its outgoing calls may reach that host and its token hosts.
  call(POOL, (i) => i.settings.setSetting("claude-upstream-url", args.upstream));
  for (const s of call(POOL, (i) => i.settings.listSettings()))
    if (/-(upstream|token)-url$/.test(s.key)) allowedHosts.add(new URL(s.value).host);
  const account = call(POOL, (i) =>
    i.accounts.add({ provider: "claude", credential: { tag: "api-key", val: apiKey }, label: "js-host" }));

  // Serve the pool's incoming handler on loopback (one request at a time: exports are sync).
  const server = new HTTPServer({ handle: (req, out) => call(POOL, (i) => i.incomingHandler.handle(req, out)) });
  server.listen(0, "127.0.0.1");
  const endpoint = `http://127.0.0.1:${server.address().port}`;
  const route = call(POOL, (i) => i.routing.openRoute(THREAD, "claude", endpoint));

  // The agent's request, as Claude Code would send it with the route's environment.
  const body = { model: MODEL, max_tokens: 64, messages: [{ role: "user", content: "ping" }] };
  const response = await fetch(`${route.baseUrl}/v1/messages`, {
    method: "POST",
    headers: { "x-api-key": route.token, "anthropic-version": "2023-06-01", "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await response.text();
  server.stop();
  const failedAt = BigInt(nowMs());

  // The turn failed: describe it as the core's turn driver does, and tell Provider Retry.
  let errorBody;
  try {
    errorBody = JSON.parse(text);
  } catch {
    errorBody = undefined;
  }
  const retryAfterHeader = response.headers.get("retry-after");
  const retryAfter = /^\d+$/.test(retryAfterHeader ?? "") ? failedAt + BigInt(retryAfterHeader) * 1000n : undefined;
  const failed = !response.ok;
  turns.set(REQUEST, { attempt: 1, original: REQUEST });
  threadsById.set(THREAD, {
    id: THREAD, provider: "claude", model: MODEL, status: failed ? "error" : "idle", archived: false,
    retryOptOut: false, latestRequest: REQUEST, inputQueued: false, routedByPool: true,
  });
  const event = {
    thread: THREAD, provider: "claude", model: MODEL, failedRequest: REQUEST, originalRequest: REQUEST,
    attempt: 1, failedAt, chainStartedAt: failedAt, inputAccepted: false, routedByPool: true,
    failure: {
      category: response.status === 429 ? "rate-limit" : response.status >= 500 ? "internal" : "bad-request",
      providerCode: errorBody?.error?.type, httpStatus: response.status,
      origin: response.headers.get("x-pooler-origin") === "pool" ? "pool" : "provider",
      retryAfter, message: errorBody?.error?.message?.slice(0, 1024),
    },
  };
  if (failed) call(RETRY, (i) => i.turnEvents.turnFailed(event));
  const availability = call(POOL, (i) =>
    i.availability.query({ thread: THREAD, provider: "claude", request: REQUEST, model: MODEL }));

  const result = {
    jco: JSON.parse(readFileSync(join(here, "node_modules/@bytecodealliance/jco/package.json"))).version,
    transpileMs,
    account: { id: account.id, status: account.status },
    pool: { status: response.status, headers: Object.fromEntries(response.headers), body: errorBody ?? text },
    turnFailed: event,
    availability,
    rows: threads.listRows(THREAD),
    signals: delivered,
    undelivered: [...pendingChanges.values()],
    metrics,
  };
  process.stdout.write(`${json(result)}\n`, () => process.exit(0));
} catch (e) {
  const detail = e && typeof e === "object" && "payload" in e ? json(e.payload) : String(e?.stack ?? e);
  process.stderr.write(`error: the scenario failed: ${detail}\n`);
  process.exit(1);
}
