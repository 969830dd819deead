//! What a request reads and writes (statements recorded on the database), and what the
//! screen of its head answers before its body is read.

use super::*;

/// A database that records the statements run on it.
struct Recording<'a> {
    db: &'a NativeDb,
    statements: RefCell<Vec<String>>,
}

impl Db for Recording<'_> {
    fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        self.statements.borrow_mut().push(sql.to_owned());
        self.db.execute(sql, params)
    }
    fn execute_batch(&self, sql: &str) -> Result<(), DbError> {
        self.statements.borrow_mut().push(sql.to_owned());
        self.db.execute_batch(sql)
    }
    fn query(&self, sql: &str, params: &[Value]) -> Result<Rows, DbError> {
        self.statements.borrow_mut().push(sql.to_owned());
        self.db.query(sql, params)
    }
    fn last_insert_rowid(&self) -> i64 {
        self.db.last_insert_rowid()
    }
}

/// A pinned session's request within a second of its last commits only its attempt: the
/// account's and the pin's last use are not written again (the statements would change
/// nothing), and a second later they are.
#[test]
fn a_pinned_request_within_the_granularity_writes_only_its_attempt() {
    let p = Pool::abc();
    assert_eq!(p.claude(Some("S")).status, 200);
    let writes = |p: &Pool| {
        let rec = Recording {
            db: &p.db,
            statements: RefCell::new(Vec::new()),
        };
        let req = p.claude_req(Some("S"), "claude-sonnet-4-5");
        let status = block_on(async {
            collect(Engine::new(&rec, &p.up, &p.env).handle(req).await)
                .await
                .status
        });
        assert_eq!(status, 200);
        rec.statements
            .into_inner()
            .into_iter()
            .filter(|s| {
                let s = s.trim_start().to_ascii_uppercase();
                s.starts_with("UPDATE") || s.starts_with("INSERT") || s.starts_with("DELETE")
            })
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
    };
    p.env.advance(TOUCH_GRANULARITY_MS - 1);
    assert_eq!(writes(&p), ["INSERT INTO attempts"]);
    p.env.advance(1);
    assert_eq!(
        writes(&p),
        [
            "UPDATE accounts SET",
            "UPDATE pins SET",
            "INSERT INTO attempts"
        ]
    );
    let pin = p
        .store()
        .pin(Provider::Claude, "session:S", p.env.now(), u64::MAX);
    assert_eq!(pin.unwrap().unwrap().last_used_at, p.env.now());
    assert_eq!(p.up.seen(), ["a", "a", "a"]);
}

/// The head is screened before the body is read: a wrong token, a path the pool does not
/// serve and routing off are refused from it; a routable request is admitted with the
/// body limit; and a database not yet migrated cannot tell.
#[test]
fn a_request_head_is_refused_or_admitted_before_its_body_is_read() {
    let p = Pool::abc();
    let screen = |req: &IncomingRequest| {
        Engine::new(&p.db, &p.up, &p.env).screen(&req.method, &req.path, &req.headers)
    };
    let status = |s: Screen<FakeBody>| match s {
        Screen::Refused(r) => Some(r.status),
        _ => None,
    };
    let good = p.claude_req(Some("S"), "m");
    let mut wrong = good.clone();
    wrong.headers = Headers::from([("authorization", "Bearer not-a-route")]);
    assert_eq!(status(screen(&wrong)), Some(401));
    let mut codex_token = good.clone();
    codex_token.headers = Headers::from([(
        "authorization",
        format!("Bearer {}", p.codex_token).as_str(),
    )]);
    assert_eq!(
        status(screen(&codex_token)),
        Some(401),
        "a Codex route's token on a Claude path"
    );
    let mut elsewhere = good.clone();
    elsewhere.path = "/v1/elsewhere".into();
    assert_eq!(status(screen(&elsewhere)), Some(404));
    let mut get = good.clone();
    get.method = "GET".into();
    assert_eq!(status(screen(&get)), Some(405));

    p.admin().set_setting("max-request-body", "4096").unwrap();
    match screen(&good) {
        Screen::Admitted(a) => assert_eq!(a.max_body(), 4096),
        _ => panic!("a routable head is admitted"),
    }
    p.admin().set_setting("claude-routing", "off").unwrap();
    assert_eq!(status(screen(&good)), Some(503));
    assert_eq!(p.up.seen(), Vec::<String>::new(), "nothing went upstream");

    let fresh = Pool::on(NativeDb::memory());
    fresh.db.execute_batch("DROP TABLE meta").unwrap();
    let unknown = Engine::new(&fresh.db, &fresh.up, &fresh.env).screen(
        &good.method,
        &good.path,
        &good.headers,
    );
    assert!(matches!(unknown, Screen::Unknown));
}

/// A screened request is served with what the screen read: its route and settings are not
/// read again, and it is routed as an unscreened one is (the 413 still applies).
#[test]
fn a_screened_request_reads_neither_its_route_nor_its_settings_again() {
    let p = Pool::abc();
    let serve = |req: IncomingRequest| {
        let rec = Recording {
            db: &p.db,
            statements: RefCell::new(Vec::new()),
        };
        let engine = Engine::new(&rec, &p.up, &p.env);
        let engine = match engine.screen(&req.method, &req.path, &req.headers) {
            Screen::Admitted(a) => engine.with_admitted(a),
            _ => panic!("admitted"),
        };
        rec.statements.borrow_mut().clear();
        let status = block_on(async { collect(engine.handle(req).await).await.status });
        let read: Vec<String> = rec
            .statements
            .into_inner()
            .into_iter()
            .filter(|s| {
                let s = s.to_ascii_lowercase();
                s.contains("from routes") || s.contains("from settings") || s.contains("from meta")
            })
            .collect();
        (status, read)
    };
    // Pinned first, so that serving it reads no pin generation from `meta` either.
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(
        serve(p.claude_req(Some("S"), "m")),
        (200, Vec::<String>::new())
    );
    assert_eq!(p.up.seen(), ["a", "a"]);
    p.admin().set_setting("max-request-body", "1024").unwrap();
    let mut big = p.claude_req(Some("S"), "m");
    big.body = vec![b' '; 1025].into();
    assert_eq!(serve(big).0, 413);
    assert_eq!(p.up.seen(), Vec::<String>::new(), "the 413 went nowhere");
}

/// The statements of one request served as the component serves it (its head screened,
/// then handled, its answer relayed and its tokens recorded), grouped by transaction: a
/// `BEGIN` … `COMMIT` is one, a statement outside any is one of its own (autocommit).
fn served_transactions(p: &Pool, req: IncomingRequest) -> (u16, Vec<Vec<String>>) {
    let rec = Recording {
        db: &p.db,
        statements: RefCell::new(Vec::new()),
    };
    let status = serve_on(p, &rec, req);
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut open = false;
    for s in rec.statements.into_inner() {
        let head = s.trim_start().to_ascii_uppercase();
        let short = s.split_whitespace().take(4).collect::<Vec<_>>().join(" ");
        if head.starts_with("BEGIN") {
            groups.push(Vec::new());
            open = true;
        } else if head.starts_with("COMMIT") || head.starts_with("ROLLBACK") {
            open = false;
        } else if open {
            groups.last_mut().expect("begun").push(short);
        } else {
            groups.push(vec![short]);
        }
    }
    (status, groups)
}

/// Serve `req` as the component does (screen, handle, the answer streamed and its tokens
/// recorded, the flight ended) on `db`; the answer's status.
fn serve_on<D: Db>(p: &Pool, db: &D, req: IncomingRequest) -> u16 {
    p.env.gone.set(false);
    let engine = Engine::new(db, &p.up, &p.env);
    let engine = match engine.screen(&req.method, &req.path, &req.headers) {
        Screen::Admitted(a) => engine.with_admitted(a),
        _ => panic!("admitted"),
    };
    let resp = block_on(async {
        collect_then(engine.handle(req).await, |relay| {
            crate::engine::record_tokens(db, &p.env, relay)
        })
        .await
    });
    if let Some(lease) = &resp.lease {
        end_flight(db, lease).unwrap();
    }
    resp.status
}

/// A database that asks SQLite how it would run each query before running it.
struct Planning<'a> {
    db: &'a NativeDb,
    /// Each query's first words and the steps of its plan.
    plans: RefCell<Vec<(String, Vec<String>)>>,
}

impl Db for Planning<'_> {
    fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        self.db.execute(sql, params)
    }
    fn execute_batch(&self, sql: &str) -> Result<(), DbError> {
        self.db.execute_batch(sql)
    }
    fn query(&self, sql: &str, params: &[Value]) -> Result<Rows, DbError> {
        let plan = self
            .db
            .query(&format!("EXPLAIN QUERY PLAN {sql}"), params)?;
        let steps = plan
            .iter()
            .map(|r| r.text("detail"))
            .collect::<Result<Vec<_>, _>>()?;
        let short = sql.split_whitespace().take(6).collect::<Vec<_>>().join(" ");
        self.plans.borrow_mut().push((short, steps));
        self.db.query(sql, params)
    }
    fn last_insert_rowid(&self) -> i64 {
        self.db.last_insert_rowid()
    }
}

/// A streamed answer with Claude's quota headers and token usage, as the real API sends.
fn streamed_with_quota() -> Reply {
    let reset = ((T0 / 1000) + 3600).to_string();
    Reply::Chunks(
        vec![
            ("content-type", "text/event-stream".into()),
            ("anthropic-ratelimit-unified-status", "allowed".into()),
            ("anthropic-ratelimit-unified-5h-status", "allowed".into()),
            ("anthropic-ratelimit-unified-5h-utilization", "0.25".into()),
            ("anthropic-ratelimit-unified-5h-reset", reset.clone()),
            ("anthropic-ratelimit-unified-7d-status", "allowed".into()),
            ("anthropic-ratelimit-unified-7d-utilization", "0.5".into()),
            ("anthropic-ratelimit-unified-7d-reset", reset),
        ],
        vec![
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-sonnet-4-5\",\"usage\":{\"input_tokens\":11,\"output_tokens\":1}}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":44}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ],
        false,
    )
}

/// A Claude Code request of session `body`, its head naming session `head`.
fn claude_code_req(p: &Pool, head: &str, body: &str) -> IncomingRequest {
    let mut req = p.claude_req(Some(body), "claude-sonnet-4-5");
    req.headers.push("x-claude-code-session-id", head);
    req
}

/// The statements of the three transactions a pinned conversation's request is served
/// in: one read (the route and settings, the pin, the cursor, the pinned account's secret
/// and refresh state in one statement, the accounts and their windows), one write (the
/// answer's quota, the account's and the pin's last use, the attempt), and once the answer
/// has streamed, its token usage.
const PINNED_REQUEST: [&[&str]; 3] = [
    &[
        "SELECT value FROM meta",
        "SELECT thread, provider, token_hash",
        "SELECT key, value FROM",
        "SELECT account_id, thread, last_used_at,",
        "SELECT account_id FROM cursors",
        "SELECT a.kind, s.api_key, s.access_token,",
        "SELECT a.id, a.seq, a.provider,",
        "SELECT account_id, name, family,",
    ],
    &[
        "SELECT a.id, a.seq, a.provider,",
        "SELECT account_id, name, family,",
        "DELETE FROM windows WHERE",
        "INSERT INTO windows (account_id,",
        "INSERT INTO windows (account_id,",
        "INSERT INTO quota (account_id,",
        "UPDATE accounts SET last_used_at",
        "UPDATE pins SET last_used_at",
        "INSERT INTO attempts (provider,",
    ],
    &["INSERT INTO tokens (at,"],
];

/// A pinned conversation's request, served as the component serves it, runs in one read
/// and one write transaction, and one more for its token usage once the answer has
/// streamed: the screen's read of the head takes along everything the decision needs,
/// and the answer's quota is written in the attempt's commit. The same for a
/// subscription account, whose secret and refresh state are one statement.
#[test]
fn a_pinned_request_is_one_read_and_one_write_and_its_tokens() {
    let keys = Pool::abc();
    let subscription = Pool::new();
    subscription.add_oauth(Provider::Claude, "o", "at-o", None);
    for (p, credential) in [(&keys, "a"), (&subscription, "at-o")] {
        // Pinned on its first answer; the next is the steady state.
        p.up.push(credential, streamed_with_quota());
        assert_eq!(served_transactions(p, claude_code_req(p, "S", "S")).0, 200);
        p.env.advance(TOUCH_GRANULARITY_MS);
        p.up.push(credential, streamed_with_quota());
        let (status, groups) = served_transactions(p, claude_code_req(p, "S", "S"));
        assert_eq!(status, 200);
        assert_eq!(groups, PINNED_REQUEST, "served with {credential}");
        assert_eq!(p.up.seen(), [credential, credential]);
    }
}

/// No query of a conversation's requests, its first (placed) or a pinned one, sorts its
/// rows or builds a temporary table: each runs on an index. A temporary B-tree costs the
/// request a b-tree opened and freed inside SQLite, on every request.
#[test]
fn a_requests_queries_sort_nothing_and_build_no_temporary_table() {
    let keys = Pool::abc();
    let subscription = Pool::new();
    subscription.add_oauth(Provider::Claude, "o", "at-o", None);
    for (p, credential) in [(&keys, "a"), (&subscription, "at-o")] {
        let planning = Planning {
            db: &p.db,
            plans: RefCell::new(Vec::new()),
        };
        for _ in 0..2 {
            p.up.push(credential, streamed_with_quota());
            assert_eq!(serve_on(p, &planning, claude_code_req(p, "S", "S")), 200);
            p.env.advance(TOUCH_GRANULARITY_MS);
        }
        let plans = planning.plans.into_inner();
        assert!(plans.len() >= 10, "{plans:?}");
        for (query, steps) in &plans {
            assert!(
                steps
                    .iter()
                    .all(|s| !s.contains("TEMP B-TREE") && !s.contains("LIST SUBQUERY")),
                "{query}: {steps:?}"
            );
        }
    }
}

/// What the screen read is not used when the body names another session than the head,
/// or when the body took longer than [`HEAD_READ_FRESH_MS`] to arrive: the decision
/// reads again, and the request follows the body's session.
#[test]
fn a_body_naming_another_session_or_arriving_late_is_decided_on_a_fresh_read() {
    let p = Pool::abc();
    assert_eq!(p.claude(Some("B")).status, 200);
    let reads = |groups: &[Vec<String>]| {
        groups
            .iter()
            .filter(|g| g.iter().all(|s| s.starts_with("SELECT")))
            .count()
    };
    let (status, groups) = served_transactions(&p, claude_code_req(&p, "H", "B"));
    assert_eq!(status, 200);
    assert_eq!(reads(&groups), 2, "{groups:?}");
    assert_eq!(
        p.pinned(Provider::Claude, "H"),
        None,
        "the head's session is not served"
    );

    let late = |p: &Pool| {
        let rec = Recording {
            db: &p.db,
            statements: RefCell::new(Vec::new()),
        };
        let req = claude_code_req(p, "B", "B");
        let engine = Engine::new(&rec, &p.up, &p.env);
        let Screen::Admitted(a) = engine.screen(&req.method, &req.path, &req.headers) else {
            panic!("admitted");
        };
        p.env.advance(HEAD_READ_FRESH_MS + 1);
        rec.statements.borrow_mut().clear();
        let engine = engine.with_admitted(a);
        let status = block_on(async { collect(engine.handle(req).await).await.status });
        let pins_read = rec
            .statements
            .into_inner()
            .iter()
            .filter(|s| s.contains("FROM pins"))
            .count();
        (status, pins_read)
    };
    assert_eq!(late(&p), (200, 1), "the pin is read again");
    assert_eq!(p.up.seen(), ["a", "a", "a"]);
}

/// The secret the read took along is used only while it is fresh: a request that first
/// waits out its account's short hold reads the secret again before it sends.
#[test]
fn a_secret_read_before_an_inline_wait_is_read_again() {
    let p = Pool::abc();
    assert_eq!(
        served_transactions(&p, claude_code_req(&p, "S", "S")).0,
        200
    );
    let now = p.env.now();
    p.store()
        .set_hold(
            &p.id("a"),
            now + 2 * HEAD_READ_FRESH_MS,
            crate::model::HoldKind::RateLimit,
            now,
        )
        .unwrap();
    let (status, groups) = served_transactions(&p, claude_code_req(&p, "S", "S"));
    assert_eq!(status, 200);
    assert_eq!(
        *p.env.sleeps.borrow(),
        [2 * HEAD_READ_FRESH_MS],
        "waited inline"
    );
    let secret_reads = groups
        .iter()
        .flatten()
        .filter(|s| s.starts_with("SELECT a.kind, s.api_key"))
        .count();
    assert_eq!(secret_reads, 2, "{groups:?}");
    assert_eq!(p.up.seen(), ["a", "a"]);
}
