//! Crash-safety of a re-evaluation pass: a real `pooler serve` is
//! killed with SIGKILL while Provider Retry moves thousands of rows after one availability
//! change, then started again on the same data directory.
//!
//! The seed: [`THREADS`] pool-routed Claude threads, each with one failed turn (attempt 1)
//! and one live retry row (attempt 2) waiting on the reset of the only enabled account, A,
//! two hours away (a second account, B, is disabled). The first thread gets there through
//! the real path end to end: its turn goes through the pool to a fake Anthropic that answers
//! 429 with the unified rate-limit headers (A blocked, its quota window observed, the
//! thread pinned), and Provider Retry schedules its retry. The others are written with the
//! server stopped, by the real code: their pool routes with the pool's own store
//! (`Store::open_route`, one transaction), their threads, turns and failures with the core
//! (`pooler_core::Core`, the failure the first thread's turn recorded); the next start
//! delivers their `turn-failed` events to Provider Retry, which asks the pool and schedules
//! each retry itself, as it does for any failed turn. Before anything is killed the test
//! checks that the started server sees exactly what was seeded (every thread one row,
//! attempt 2, at A's reset; `pooler retry status` lists every candidate).
//!
//! The point: `pooler account enable B` makes the pool ready, and Provider Retry's pass
//! moves every row to now + reset buffer, [`PASS_CHUNK`] candidates per core commit. With
//! more threads than one chunk the core's rows move in two commits; the test polls the core
//! database (read-only, WAL) and kills the server when some rows have moved and not all,
//! then checks on the killed server's files that the kill did fall mid-pass. A kill that
//! came too late (the pass raced ahead) is retried on a fresh copy of the seed, at most
//! [`ATTEMPTS`] times; never landing mid-pass fails the test.
//!
//! After the restart (`scheduler.on-start` re-evaluates every open candidate) the checks:
//! every row is still there once per chain with the same id and attempt 2, every row is at
//! the new time, Provider Retry's chains agree with the core's rows (row id, send time, one
//! per thread, failed attempt 1), no turn ran, no upstream request beyond the first, the pins
//! and quota observations are as seeded, and every database passes `integrity_check` and
//! `foreign_key_check` (after the kill and at the end).

#![cfg(unix)]

use crate::support;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use account_pool::store::Store;
use pooler_core::clock::SystemClock;
use pooler_core::{Core, Provider, Route, TurnOutcome, TurnResult};
use pooler_plugin_kit::NativeDb;
use support::{Served, add_api_key, core_db, databases_intact, eventually, plugin_db, read_only};

/// Threads seeded: more than one pass chunk, so the core's rows move in two commits and a
/// kill between them leaves some moved and some not.
const THREADS: usize = PASS_CHUNK + 904;
/// Provider Retry's candidates per pass chunk (`engine::pass::PASS_CHUNK`).
const PASS_CHUNK: usize = 4096;
/// Kills on a fresh copy of the seed before the test gives up landing one mid-pass.
const ATTEMPTS: usize = 3;
/// How long a server may take to do what the test waits for.
const LIMIT: Duration = Duration::from_secs(120);
/// How long the restarted server may take to finish the pass.
const RESTART_LIMIT: Duration = Duration::from_secs(60);
/// Provider Retry's reset buffer in this test (no jitter): a moved row is due ten minutes
/// after its move, far beyond the test, so no retry is dispatched.
const BUFFER_MS: u64 = 600_000;
const HOUR_MS: u64 = 3_600_000;

const KEY_A: &str = "sk-ant-api03-pass-limited-secret-PSA1";
const KEY_B: &str = "sk-ant-api03-pass-spare-secret-PSB2";

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A fake Messages API on loopback (strict) answering every model request 429 with the
/// unified headers of a rejected five-hour window that resets at `reset_ms`; how many
/// model requests it answered.
fn limited_claude(reset_ms: u64) -> (String, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let url = support::strict_claude(move |_, stream| {
        seen.fetch_add(1, Ordering::SeqCst);
        let reply =
            pooler_tests::pool::reply(429, &pooler_tests::pool::five_hour_rejected(Some(reset_ms)));
        let _ = stream.write_all(&reply.to_http1());
    });
    (url, count)
}

/// A live row of the core's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    id: i64,
    attempt: u32,
    send_at: u64,
}

/// The core's live rows by thread; a thread with more than one row fails the test.
fn rows(data: &Path) -> HashMap<String, Row> {
    let conn = core_db(data);
    let mut stmt = conn
        .prepare("SELECT thread_id, id, attempt, send_at, wait_state FROM queued_rows")
        .unwrap();
    let mut out = HashMap::new();
    let all = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                Row {
                    id: r.get(1)?,
                    attempt: r.get(2)?,
                    send_at: r.get(3)?,
                },
                r.get::<_, String>(4)?,
            ))
        })
        .unwrap();
    for row in all {
        let (thread, row, state) = row.unwrap();
        assert_eq!(state, "time", "{thread}: {row:?}");
        assert!(
            out.insert(thread.clone(), row).is_none(),
            "two live rows for {thread}"
        );
    }
    out
}

/// The core's turn requests: (thread, attempt, outcome), every one.
fn turns(data: &Path) -> Vec<(String, u32, Option<String>)> {
    let conn = core_db(data);
    let mut stmt = conn
        .prepare("SELECT thread_id, attempt, outcome FROM turn_requests ORDER BY rowid")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Provider Retry's chain of a thread: (failed attempt, state, row id, send at).
type ChainRow = (u32, String, Option<i64>, Option<u64>);

/// Provider Retry's chains by thread; a thread with two chains fails the test.
fn chains(data: &Path) -> HashMap<String, ChainRow> {
    let conn = read_only(&plugin_db(data, "provider-retry"));
    let mut stmt = conn
        .prepare("SELECT thread, failed_attempt, state, row_id, send_at FROM chains")
        .unwrap();
    let mut out = HashMap::new();
    let all = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?),
            ))
        })
        .unwrap();
    for chain in all {
        let (thread, chain) = chain.unwrap();
        assert!(
            out.insert(thread.clone(), chain).is_none(),
            "two chains for {thread}"
        );
    }
    out
}

/// The pool's pins, every one: (key, account, thread, generation).
fn pins(data: &Path) -> Vec<(String, String, Option<String>, i64)> {
    let conn = read_only(&plugin_db(data, "account-pool"));
    let mut stmt = conn
        .prepare("SELECT key, account_id, thread, generation FROM pins ORDER BY key")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The pool's quota windows, every one: (account, name, utilization, resets at).
fn windows(data: &Path) -> Vec<(String, String, Option<f64>, Option<i64>)> {
    let conn = read_only(&plugin_db(data, "account-pool"));
    let mut stmt = conn
        .prepare(
            "SELECT account_id, name, utilization, resets_at FROM windows ORDER BY account_id, name",
        )
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// What the seed is: the server's configuration, a stopped copy of its data directory, and
/// what it holds.
struct Seed {
    config: String,
    /// The seeded data directory (the server that checked it was stopped with SIGTERM).
    data: PathBuf,
    _dir: tempfile::TempDir,
    spare: String,
    /// A's reset: every seeded row waits until after it.
    reset_ms: u64,
    rows: HashMap<String, Row>,
    pins: Vec<(String, String, Option<String>, i64)>,
    windows: Vec<(String, String, Option<f64>, Option<i64>)>,
    upstream_requests: Arc<AtomicUsize>,
}

/// Seed [`THREADS`] threads each with a live retry row waiting on A's reset (see the
/// module's comment), and check that a server started on them sees them as seeded.
fn seed() -> Seed {
    let reset_ms = (now_ms() + 2 * HOUR_MS) / 1000 * 1000;
    let (url, upstream_requests) = limited_claude(reset_ms);
    let config =
        "[plugins.account-pool]\ncomponent = \"embedded\"\n\n[maintenance]\ninterval-s = 0\n";
    let served = Served::start_in(tempfile::tempdir().unwrap(), config)
        .never_prints(KEY_A)
        .never_prints(KEY_B);
    served.ok(&["config", "set", "pool.claude-upstream-url", &url]);
    served.ok(&["config", "set", "retry.reset-buffer", "600s"]);
    served.ok(&["config", "set", "retry.reset-jitter", "0s"]);
    let limited = add_api_key(&served, KEY_A, "limited");
    let spare = add_api_key(&served, KEY_B, "spare");
    served.ok(&["account", "disable", &spare]);

    // The first thread, through the real path: the pool sends its turn to A, which answers
    // 429; Provider Retry schedules the retry at A's reset.
    let first = served
        .ok(&["thread", "new", "--provider", "claude", "hello"])
        .trim()
        .to_owned();
    let data = served.data.clone();
    eventually("the first retry to be scheduled", LIMIT, || {
        rows(&data)
            .get(&first)
            .filter(|r| r.send_at >= reset_ms)
            .copied()
    });
    assert_eq!(upstream_requests.load(Ordering::SeqCst), 1);
    let stopped = served.terminate();

    // The others, with the server stopped: routes through the pool's store, threads and
    // failed turns through the core.
    let started = Instant::now();
    let core = Core::open(&data, Arc::new(SystemClock::new())).unwrap();
    let shown = core.show(&first).unwrap();
    let failure = shown.turns[0]
        .failure
        .clone()
        .expect("the first turn failed");
    let model = shown.thread.info.model.clone();
    let base_url = core.route(&first).unwrap().expect("routed").base_url;
    let ids: Vec<String> = (1..THREADS).map(|_| Core::new_thread_id()).collect();
    let tokens: Vec<String> = ids
        .iter()
        .enumerate()
        .map(|(i, _)| {
            let mut bytes = [0u8; 32];
            bytes[..8].copy_from_slice(&(i as u64).to_le_bytes());
            bytes[8..16].copy_from_slice(&now_ms().to_le_bytes());
            account_pool::token::encode(&bytes)
        })
        .collect();
    {
        let db = NativeDb::open(&plugin_db(&data, "account-pool")).unwrap();
        let store = Store::new(&db);
        assert!(store.schema_current().unwrap());
        let now = now_ms();
        store
            .tx(|st| {
                for (id, token) in ids.iter().zip(&tokens) {
                    st.open_route(
                        id,
                        account_pool::model::Provider::Claude,
                        &account_pool::token::hash(token),
                        now,
                    )?;
                }
                Ok(())
            })
            .unwrap();
    }
    // One turn per thread at once (the limit is put back after), as the host starts them.
    let limit = core.concurrency_limit().unwrap();
    core.set_concurrency_limit(THREADS as u32).unwrap();
    for (id, token) in ids.iter().zip(&tokens) {
        let route = Route {
            base_url: base_url.clone(),
            token: token.clone(),
        };
        core.new_thread_with_id(id, Provider::Claude, model.as_deref(), Some(route))
            .unwrap();
        core.send(id, "hello").unwrap();
    }
    let plans = core.start_turns().unwrap();
    assert_eq!(plans.len(), THREADS - 1);
    let outcome = TurnOutcome {
        result: TurnResult::Failed {
            failure,
            partial_reply: String::new(),
        },
        input_accepted: false,
        rate_limits: None,
        agent_session: None,
        input_in_session: false,
    };
    for plan in &plans {
        core.record_outcome(&plan.request, &outcome).unwrap();
    }
    core.set_concurrency_limit(limit).unwrap();
    drop(core);
    eprintln!(
        "12c: wrote {} threads in {} ms",
        THREADS - 1,
        started.elapsed().as_millis()
    );

    // Started on the seed, the server delivers the failed turns to Provider Retry, which
    // schedules each retry at A's reset; it must see exactly what was seeded.
    let started = Instant::now();
    let served = stopped.restart();
    let seeded = eventually("every retry to be scheduled", LIMIT, || {
        let rows = rows(&data);
        let done = rows.len() == THREADS && undelivered_events(&data) == 0;
        (done && agree(&chains(&data), &rows)).then_some(rows)
    });
    eprintln!(
        "12c: Provider Retry scheduled the seeded retries in {} ms",
        started.elapsed().as_millis()
    );
    let mut threads: Vec<&String> = seeded.keys().collect();
    threads.sort();
    let mut expected: Vec<&String> = ids.iter().chain([&first]).collect();
    expected.sort();
    assert_eq!(threads, expected, "one row per seeded thread");
    for (thread, row) in &seeded {
        assert_eq!(row.attempt, 2, "{thread}");
        assert!(
            (reset_ms..reset_ms + BUFFER_MS + 1_000).contains(&row.send_at),
            "{thread} waits on A's reset: {row:?}"
        );
    }
    let status = served.json(&["retry", "status"]);
    let candidates = status["candidates"].as_array().unwrap();
    assert_eq!(
        candidates.len(),
        THREADS,
        "pooler retry status lists them all"
    );
    let sample = candidates
        .iter()
        .find(|c| c["thread"] == ids[THREADS / 2].as_str())
        .expect("a seeded thread in pooler retry status");
    let row = seeded[&ids[THREADS / 2]];
    assert_eq!(
        (
            sample["state"].as_str(),
            sample["next_attempt"].as_u64(),
            sample["row"].as_i64(),
            sample["send_at"].as_u64()
        ),
        (Some("scheduled"), Some(2), Some(row.id), Some(row.send_at)),
        "the status names the core's row: {sample}"
    );
    let stopped = served.terminate();
    assert_eq!(rows(&data), seeded, "nothing moved before the point");
    assert!(agree(&chains(&data), &seeded));
    assert_eq!(turns(&data).len(), THREADS, "one turn per thread");
    // A refused request pins no session; whatever pins there are must survive as they are.
    let pins = pins(&data);
    let windows = windows(&data);
    assert!(
        windows
            .iter()
            .any(|(account, _, u, reset)| *account == limited
                && *u == Some(1.0)
                && *reset == Some(reset_ms as i64)),
        "A's rejected window: {windows:?}"
    );
    databases_intact(&data);
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("data");
    copy_dir(&data, &copy);
    drop(stopped);
    Seed {
        config: config.to_owned(),
        data: copy,
        _dir: dir,
        spare,
        reset_ms,
        rows: seeded,
        pins,
        windows,
        upstream_requests,
    }
}

/// Copy a stopped server's data directory (every file, modes kept).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    std::fs::set_permissions(to, std::fs::metadata(from).unwrap().permissions()).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Outbox events Provider Retry has not acknowledged.
fn undelivered_events(data: &Path) -> usize {
    core_db(data)
        .query_row(
            "SELECT COUNT(*) FROM outbox o
             WHERE o.id >= (SELECT first_event FROM outbox_subscribers WHERE name = 'provider-retry')
               AND NOT EXISTS (SELECT 1 FROM outbox_deliveries d
                               WHERE d.event_id = o.id AND d.subscriber = 'provider-retry'
                                 AND d.done_at IS NOT NULL)",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

/// Whether Provider Retry's chains are the core's rows: one per thread, scheduled, for the
/// failed attempt 1, naming the row and its send time.
fn agree(chains: &HashMap<String, ChainRow>, rows: &HashMap<String, Row>) -> bool {
    chains.len() == rows.len()
        && chains.iter().all(|(thread, chain)| {
            rows.get(thread).is_some_and(|row| {
                *chain == (1, "scheduled".to_owned(), Some(row.id), Some(row.send_at))
            })
        })
}

/// How many of the core's rows have moved off A's reset (read-only, as the WAL stands).
fn moved(conn: &rusqlite::Connection, reset_ms: u64) -> usize {
    conn.query_row(
        "SELECT COUNT(*) FROM queued_rows WHERE send_at < ?1",
        [reset_ms as i64],
        |r| r.get(0),
    )
    .unwrap()
}

/// `pooler ARGS` against the data directory, started and left running.
fn spawn_pooler(data: &Path, args: &[&str]) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(args)
        .env("POOLER_DATA_DIR", data)
        .env_remove("POOLER_API_KEY")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// 12c. Killed while Provider Retry moves thousands of rows; see the module's comment.
#[test]
fn c_a_kill_mid_pass_loses_no_row_and_the_next_start_finishes_the_pass() {
    let started = Instant::now();
    let seed = seed();
    eprintln!("12c: seeded in {} ms", started.elapsed().as_millis());

    let mut landed = None;
    for attempt in 1..=ATTEMPTS {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(&seed.data, &dir.path().join("data"));
        let served = Served::start_in(dir, &seed.config);
        let data = served.data.clone();
        assert_eq!(rows(&data), seed.rows, "the copy starts as seeded");
        let conn = core_db(&data);
        let enabled_at = now_ms();
        let enable = spawn_pooler(&data, &["account", "enable", &seed.spare]);
        // The point: the first chunk's moves are committed in the core. Poll every 2 ms (a
        // read of the core's rows; the server keeps the other core).
        let polled = Instant::now();
        let seen = loop {
            let n = moved(&conn, seed.reset_ms);
            if n > 0 {
                break n;
            }
            assert!(
                polled.elapsed() < LIMIT,
                "no row moved after the account was enabled"
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        let stopped = served.kill();
        let out = enable.wait_with_output().unwrap();
        let at_kill = moved(&conn, seed.reset_ms);
        drop(conn);
        eprintln!(
            "12c: attempt {attempt}: {seen} rows moved when seen, {at_kill} of {THREADS} at the kill"
        );
        if at_kill == THREADS {
            // The pass raced ahead of the kill: try again on a fresh copy.
            continue;
        }
        assert!(at_kill > 0, "the moves seen were committed");
        assert_eq!(
            out.status.code(),
            Some(0),
            "pooler account enable: {}",
            support::text(&out.stderr)
        );
        landed = Some((stopped, enabled_at, at_kill));
        break;
    }
    let (stopped, enabled_at, at_kill) =
        landed.unwrap_or_else(|| panic!("no kill in {ATTEMPTS} attempts fell mid-pass"));
    let data = stopped.data.clone();

    // What the kill left: consistent databases, every row once, none dispatched.
    databases_intact(&data);
    let left = rows(&data);
    assert_eq!(left.len(), THREADS, "no row lost at the kill");
    for (thread, row) in &left {
        let seeded = seed.rows[thread];
        assert_eq!((row.id, row.attempt), (seeded.id, 2), "{thread}");
    }
    assert!(
        at_kill < THREADS,
        "the kill fell mid-pass: {at_kill} of {THREADS} moved"
    );
    let chains_left = chains(&data);
    assert_eq!(chains_left.len(), THREADS, "no chain lost at the kill");
    assert!(
        chains_left.values().all(|c| c.0 == 1 && c.1 == "scheduled"),
        "every chain still waits on its row"
    );

    // Run 2: `scheduler.on-start` re-evaluates every open candidate and finishes the pass.
    let restarted = now_ms();
    let served = stopped.restart();
    // Finished: every core row off A's reset, and Provider Retry's chains say the same
    // (its commit follows the core's).
    let finished = eventually("the pass to be finished", RESTART_LIMIT, || {
        let rows = rows(&data);
        let moved = rows.len() == THREADS && rows.values().all(|r| r.send_at < seed.reset_ms);
        (moved && agree(&chains(&data), &rows)).then_some(rows)
    });
    eprintln!(
        "12c: the restart moved the other {} rows in {} ms",
        THREADS - at_kill,
        now_ms() - restarted
    );
    let stopped = served.terminate();
    let done_at = now_ms();

    for (thread, row) in &finished {
        let seeded = seed.rows[thread];
        assert_eq!(
            (row.id, row.attempt),
            (seeded.id, 2),
            "{thread}: the same row, no attempt spent"
        );
        assert!(
            (enabled_at + BUFFER_MS..=done_at + BUFFER_MS).contains(&row.send_at),
            "{thread} moved to the new time: {row:?}"
        );
    }
    assert_eq!(rows(&data), finished, "nothing changed after");
    let chains = chains(&data);
    assert_eq!(chains.len(), THREADS, "one chain per thread, none lost");
    for (thread, chain) in &chains {
        let row = finished[thread];
        assert_eq!(
            chain,
            &(1, "scheduled".to_owned(), Some(row.id), Some(row.send_at)),
            "{thread}: Provider Retry agrees with the core"
        );
    }
    let turns = turns(&data);
    assert_eq!(turns.len(), THREADS, "no turn ran");
    assert!(
        turns
            .iter()
            .all(|(_, attempt, outcome)| *attempt == 1 && outcome.as_deref() == Some("failed")),
        "each thread's one failed turn"
    );
    assert_eq!(
        seed.upstream_requests.load(Ordering::SeqCst),
        1,
        "no model request beyond the first"
    );
    assert_eq!(pins(&data), seed.pins, "the pins held across the crash");
    assert_eq!(windows(&data), seed.windows, "the quota observations held");
    databases_intact(&data);
    drop(stopped);
    eprintln!("12c: whole test {} ms", started.elapsed().as_millis());
}
