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
