//! Faults and absurd input: upstream values that would overflow time
//! arithmetic, a token endpoint that stalls past the refresh lease, a refresh whose write
//! loses to another, and storage that fails after an upstream served the answer.

use super::*;

/// A 429 whose Retry-After lies past the horizon (an absurd number of seconds, a date in
/// year 9999) is as if it had none: the account is held for the second an unknown
/// Retry-After means — never for years, nor at a time wrapped into the past — and serves
/// again after it.
#[test]
fn a_retry_after_past_the_horizon_holds_the_account_as_if_it_had_none() {
    use crate::quota::DEFAULT_RETRY_AFTER_MS;
    for far in ["1e300", "2592001", "Fri, 31 Dec 9999 23:59:59 GMT"] {
        let p = Pool::abc();
        p.up.push("a", with_headers(429, &[("retry-after", far.into())]));
        let before = p.env.now();
        assert_eq!(p.claude(Some("S")).status, 200, "{far}");
        let a = p.store().account(&p.id("a")).unwrap().unwrap();
        assert!(
            a.held_until
                .is_some_and(|t| t <= before + 2 * DEFAULT_RETRY_AFTER_MS),
            "{far}: held until {:?}",
            a.held_until
        );
        p.env.advance(2 * DEFAULT_RETRY_AFTER_MS);
        assert_eq!(
            p.status_of("a"),
            crate::model::AccountStatus::Ready,
            "{far}"
        );
    }
}

/// The fake upstream behind a token endpoint that stalls: the `n`-th token call (1 = the
/// first) takes `stalls[n]` ms of the manual clock, in 1 s steps that let other requests
/// run meanwhile; `during` runs once, while the first stalled call is under way (another
/// writer acting then).
struct Stalling<'a> {
    inner: &'a Fake,
    env: &'a Env,
    stalls: RefCell<VecDeque<u64>>,
    during: RefCell<Option<Box<dyn FnOnce() + 'a>>>,
}

impl<'a> Stalling<'a> {
    fn new(p: &'a Pool, stalls: &[u64]) -> Self {
        Stalling {
            inner: &p.up,
            env: &p.env,
            stalls: RefCell::new(stalls.iter().copied().collect()),
            during: RefCell::default(),
        }
    }
}

impl Upstream for Stalling<'_> {
    type Body = FakeBody;
    async fn send(
        &self,
        req: UpstreamRequest,
    ) -> Result<UpstreamResponse<FakeBody>, TransportError> {
        if credential_of(&req) == "token-endpoint" {
            let stall = self.stalls.borrow_mut().pop_front().unwrap_or(0);
            let mut left = stall;
            while left > 0 {
                let step = left.min(1_000);
                self.env.advance(step);
                left -= step;
                Yield(1).await;
                if left <= stall / 2
                    && let Some(f) = self.during.borrow_mut().take()
                {
                    f();
                }
            }
        }
        self.inner.send(req).await
    }
}

/// A database file of this test process, removed first.
fn file_db(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("pool-{name}-{}.sqlite3", std::process::id()));
    remove_db(&path);
    path
}

fn remove_db(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}

fn token_reply(access: &str, refresh: &str) -> Reply {
    Reply::Status(
        200,
        vec![("content-type", "application/json".into())],
        json!({"access_token": access, "refresh_token": refresh, "expires_in": 3600}).to_string(),
    )
}

fn stored_tokens(p: &Pool, label: &str) -> OAuthTokens {
    match p.store().credential(&p.id(label)).unwrap() {
        Some(Credential::OAuth(t)) => t,
        other => panic!("{other:?}"),
    }
}

/// A token endpoint that takes 40 s (within its deadlines: connect, then
/// 30 s to the head, 30 s between pieces) keeps its refresh lease to the end. A second
/// request on another instance waits for it and sends the token it got; it never takes
/// the lease over and spends the same refresh token a second time.
#[test]
fn a_refresh_slower_than_fifteen_seconds_keeps_its_lease() {
    let path = file_db("stalled-refresh");
    let p = Pool::on(NativeDb::open(&path).unwrap());
    p.add_oauth(Provider::Claude, "o", "old", Some(T0 - 1));
    p.up.push("token-endpoint", token_reply("new-1", "rt-1"));
    p.up.push("token-endpoint", token_reply("new-2", "rt-2"));
    let up = Stalling::new(&p, &[40_000]);
    let second = NativeDb::open(&path).unwrap();
    let (r1, r2) = block_on(async {
        futures::join!(
            async {
                collect(
                    Engine::new(&p.db, &up, &p.env)
                        .handle(p.claude_req(Some("S1"), "claude-sonnet"))
                        .await,
                )
                .await
            },
            async {
                collect(
                    Engine::new(&second, &up, &p.env)
                        .handle(p.claude_req(Some("S2"), "claude-sonnet"))
                        .await,
                )
                .await
            },
        )
    });
    assert!(p.env.now() >= T0 + 40_000, "the refresh took its 40 s");
    let bodies: Vec<String> =
        p.up.calls_to("token-endpoint")
            .iter()
            .map(|c| String::from_utf8_lossy(&c.body.to_vec()).into_owned())
            .collect();
    assert_eq!(bodies.len(), 1, "one refresh, not two: {bodies:?}");
    assert_eq!(
        (r1.status, r2.status),
        (200, 200),
        "{} / {}",
        r1.body,
        r2.body
    );
    assert_eq!(p.up.seen(), ["new-1", "new-1"]);
    let t = stored_tokens(&p, "o");
    assert_eq!(
        (t.access_token.as_str(), t.refresh_token.as_str()),
        ("new-1", "rt-1")
    );
    remove_db(&path);
}

/// The token write is conditional on the token it replaces. While this
/// refresh stalls, another writer (another instance's refresh, a person replacing the
/// sign-in) stores other tokens; the stalled refresh's write then loses, and the request
/// re-reads and sends the winner's token instead of overwriting it.
#[test]
fn a_refresh_whose_write_loses_uses_the_winners_token() {
    let path = file_db("lost-refresh");
    let p = Pool::on(NativeDb::open(&path).unwrap());
    let id = p.add_oauth(Provider::Claude, "o", "old", Some(T0 - 1));
    p.up.push("token-endpoint", token_reply("mine", "rt-mine"));
    let second = NativeDb::open(&path).unwrap();
    let up = Stalling::new(&p, &[20_000]);
    let winner = OAuthTokens {
        access_token: "winner".into(),
        refresh_token: "rt-winner".into(),
        expires_at: Some(T0 + 3_600_000),
        chatgpt_account_id: None,
    };
    {
        let (second, id, winner) = (&second, id.clone(), winner.clone());
        *up.during.borrow_mut() = Some(Box::new(move || {
            Store::new(second)
                .put_credential(&id, &Credential::OAuth(winner))
                .unwrap();
        }));
    }
    let r = block_on(async {
        collect(
            Engine::new(&p.db, &up, &p.env)
                .handle(p.claude_req(Some("S"), "claude-sonnet"))
                .await,
        )
        .await
    });
    assert!(up.during.borrow().is_none(), "the other writer ran");
    assert_eq!(p.up.count("token-endpoint"), 1);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(p.up.seen(), ["winner"], "the winner's token is sent");
    assert_eq!(stored_tokens(&p, "o"), winner, "the winner's write stands");
    remove_db(&path);
}

/// A token that is still valid but due for a refresh, while another instance holds the
/// refresh lease: the request does not wait for that refresh (up to the lease, now 120 s)
/// but sends the token it has at once.
#[test]
fn a_proactive_refresh_does_not_wait_for_another_refresh() {
    let p = Pool::new();
    let id = p.add_oauth(Provider::Claude, "o", "still-valid", Some(T0 + 120_000));
    assert!(
        p.store()
            .try_lease(&id, "another-instance", T0, T0 + crate::oauth::LEASE_MS)
            .unwrap()
    );
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 200);
    assert_eq!(p.up.seen(), ["still-valid"]);
    assert_eq!(
        p.up.count("token-endpoint"),
        0,
        "the other refresh is not repeated"
    );
    assert!(
        p.env.sleeps.borrow().is_empty(),
        "no wait: {:?}",
        p.env.sleeps.borrow()
    );
}

/// A refresh lease left by a host that died mid-refresh (SIGKILL) would hold the account's
/// refreshes for the rest of the lease (two minutes). The next host's `maintenance.on-start`
/// drops it: a request with an expired token then refreshes at once, without waiting.
#[test]
fn the_start_drops_a_lease_a_stopped_host_left_and_the_next_refresh_does_not_wait() {
    let p = Pool::new();
    let id = p.add_oauth(Provider::Claude, "o", "old", Some(T0 - 1));
    p.up.push("token-endpoint", token_reply("new", "rt-new"));
    assert!(
        p.store()
            .try_lease(&id, "killed-host", T0, T0 + crate::oauth::LEASE_MS)
            .unwrap()
    );
    p.admin().start(T0).unwrap();
    let r = p.claude(Some("S"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(p.up.seen(), ["new"]);
    assert_eq!(p.up.count("token-endpoint"), 1);
    assert!(
        p.env.sleeps.borrow().is_empty(),
        "no wait for the dead lease: {:?}",
        p.env.sleeps.borrow()
    );
}

/// The fake upstream with a token endpoint whose answer trickles in: each piece of its
/// body arrives `piece_ms` of the manual clock after the one before.
struct Trickling<'a> {
    inner: &'a Fake,
    env: &'a Env,
    piece_ms: u64,
}

struct TrickleBody<'a> {
    inner: FakeBody,
    env: &'a Env,
    piece_ms: u64,
}

impl BodyStream for TrickleBody<'_> {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, String>> {
        self.env.advance(self.piece_ms);
        self.inner.next_chunk().await
    }
}

impl<'a> Upstream for Trickling<'a> {
    type Body = TrickleBody<'a>;
    async fn send(
        &self,
        req: UpstreamRequest,
    ) -> Result<UpstreamResponse<TrickleBody<'a>>, TransportError> {
        let token = credential_of(&req) == "token-endpoint";
        let r = self.inner.send(req).await?;
        Ok(UpstreamResponse {
            status: r.status,
            headers: r.headers,
            body: TrickleBody {
                inner: r.body,
                env: self.env,
                piece_ms: if token { self.piece_ms } else { 0 },
            },
        })
    }
}

/// A token endpoint whose answer trickles in (each piece within the
/// 30 s between pieces, 75 s in all) is abandoned once 60 s have passed since the refresh
/// was sent, so a refresh ends within its lease: it fails as transient, the expired
/// token's request gets the pool's 503, the lease is released and the late token is never
/// stored or sent.
#[test]
fn a_token_answer_still_arriving_after_sixty_seconds_is_abandoned() {
    let p = Pool::new();
    let id = p.add_oauth(Provider::Claude, "o", "old", Some(T0 - 1));
    let body =
        json!({"access_token": "late", "refresh_token": "rt-late", "expires_in": 3600}).to_string();
    let (first, second) = body.split_at(body.len() / 2);
    let pieces: Vec<&'static str> = [first, second, " "]
        .into_iter()
        .map(|s| &*Box::leak(s.to_owned().into_boxed_str()))
        .collect();
    p.up.push("token-endpoint", Reply::Sse(pieces, false));
    let up = Trickling {
        inner: &p.up,
        env: &p.env,
        piece_ms: 25_000,
    };
    let status = block_on(async {
        Engine::new(&p.db, &up, &p.env)
            .handle(p.claude_req(Some("S"), "claude-sonnet"))
            .await
            .status
    });
    assert_eq!(status, 503);
    assert_eq!(p.up.count("token-endpoint"), 1);
    assert!(p.up.seen().is_empty(), "the late token is never sent");
    assert_eq!(stored_tokens(&p, "o").access_token, "old");
    let rs = p.store().refresh_state(&id).unwrap();
    assert_eq!(rs.lease_owner, None, "the lease is released");
    assert_eq!(rs.failure.as_deref(), Some("transient"));
}

/// A database whose writes fail once `broken` is raised (disk full, or a busy wait that
/// ran out): every INSERT, UPDATE, DELETE and COMMIT fails while `failures` lasts (each
/// failed statement spends one), reads keep working.
struct Failing<'a> {
    db: &'a NativeDb,
    broken: std::rc::Rc<Cell<bool>>,
    failures: Cell<u32>,
    error: DbError,
    failed: RefCell<Vec<String>>,
}

impl<'a> Failing<'a> {
    fn new(db: &'a NativeDb, failures: u32, error: DbError) -> Self {
        Failing {
            db,
            broken: std::rc::Rc::default(),
            failures: Cell::new(failures),
            error,
            failed: RefCell::default(),
        }
    }
    fn fails(&self, sql: &str) -> bool {
        let head = sql.trim_start().to_ascii_uppercase();
        let write = ["INSERT", "UPDATE", "DELETE", "COMMIT"]
            .iter()
            .any(|w| head.starts_with(w));
        if !write || !self.broken.get() || self.failures.get() == 0 {
            return false;
        }
        self.failures.set(self.failures.get() - 1);
        self.failed.borrow_mut().push(
            head.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        );
        true
    }
}

impl Db for Failing<'_> {
    fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        if self.fails(sql) {
            return Err(self.error.clone());
        }
        self.db.execute(sql, params)
    }
    fn execute_batch(&self, sql: &str) -> Result<(), DbError> {
        if self.fails(sql) {
            return Err(self.error.clone());
        }
        self.db.execute_batch(sql)
    }
    fn query(&self, sql: &str, params: &[Value]) -> Result<Rows, DbError> {
        self.db.query(sql, params)
    }
    fn last_insert_rowid(&self) -> i64 {
        self.db.last_insert_rowid()
    }
}

/// The fake upstream, which raises `broken` once an upstream answered 2xx: the storage
/// fails from the moment the answer is in hand.
struct BreaksOnSuccess<'a> {
    inner: &'a Fake,
    broken: std::rc::Rc<Cell<bool>>,
}

impl Upstream for BreaksOnSuccess<'_> {
    type Body = FakeBody;
    async fn send(
        &self,
        req: UpstreamRequest,
    ) -> Result<UpstreamResponse<FakeBody>, TransportError> {
        let r = self.inner.send(req).await;
        if r.as_ref().is_ok_and(|r| (200..300).contains(&r.status)) {
            self.broken.set(true);
        }
        r
    }
}

fn served_with_quota() -> Reply {
    Reply::Status(
        200,
        vec![
            ("content-type", "application/json".into()),
            ("anthropic-ratelimit-unified-5h-utilization", "0.5".into()),
            (
                "anthropic-ratelimit-unified-5h-reset",
                (T0 / 1000 + 3600).to_string(),
            ),
        ],
        r#"{"ok":"served"}"#.into(),
    )
}

fn send_through(p: &Pool, db: &Failing<'_>, session: &str) -> Resp {
    let up = BreaksOnSuccess {
        inner: &p.up,
        broken: db.broken.clone(),
    };
    p.env.gone.set(false);
    block_on(async {
        collect(
            Engine::new(db, &up, &p.env)
                .handle(p.claude_req(Some(session), "claude-sonnet-4-5"))
                .await,
        )
        .await
    })
}

/// The disk is full after the upstream served: the quota observation,
/// the attempt, the pin and the cursor cannot be written. The client still gets the
/// served answer (not the pool's 503, which would make the agent pay for the request
/// again), and one warning names what was lost.
#[test]
fn a_served_answer_reaches_the_client_when_its_bookkeeping_cannot_be_written() {
    let p = Pool::abc();
    p.up.push("a", served_with_quota());
    let db = Failing::new(
        &p.db,
        u32::MAX,
        DbError::Io("database or disk is full".into()),
    );
    let r = send_through(&p, &db, "S");
    assert_eq!((r.status, r.body.as_str()), (200, r#"{"ok":"served"}"#));
    assert!(
        r.headers.get("x-pooler-origin").is_none(),
        "the upstream's answer"
    );
    assert_eq!(p.up.seen(), ["a"], "served once, not retried elsewhere");
    assert!(!db.failed.borrow().is_empty(), "the writes did fail");
    let lines = p.env.lines.borrow();
    let lost: Vec<_> = lines
        .iter()
        .filter(|(m, _)| m == BOOKKEEPING_LOST_MESSAGE)
        .collect();
    assert!(!lost.is_empty(), "{:?}", p.env.logs.borrow());
    let fields: std::collections::BTreeMap<_, _> =
        lost.iter().flat_map(|(_, f)| f.iter().cloned()).collect();
    assert!(fields["lost"].contains("attempt"), "{fields:?}");
    assert!(fields["error"].contains("disk is full"), "{fields:?}");
    assert_eq!(fields["account"], p.id("a"));
    assert!(
        !lines
            .iter()
            .any(|(m, _)| m == "Account Pooler storage failed"),
        "no request failed on storage"
    );
    drop(lines);
    assert_eq!(p.env.request_lines().last().unwrap()["status"], "200");
    // Nothing half-written: the attempt's transaction was rolled back whole.
    assert!(
        p.store()
            .recent_attempts(Provider::Claude, "session:S")
            .unwrap()
            .is_empty()
    );
}

/// A write that fails once after the upstream served (a busy wait that
/// ran out) is retried: the attempt and the pin are written by the second try and
/// nothing is reported lost.
#[test]
fn bookkeeping_that_fails_once_after_a_served_answer_is_written_on_retry() {
    let p = Pool::abc();
    p.up.push("a", served_with_quota());
    let db = Failing::new(&p.db, 1, DbError::Busy);
    let r = send_through(&p, &db, "S");
    assert_eq!((r.status, r.body.as_str()), (200, r#"{"ok":"served"}"#));
    assert_eq!(db.failed.borrow().len(), 1, "one write failed");
    let attempts = p
        .store()
        .recent_attempts(Provider::Claude, "session:S")
        .unwrap();
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a.account.clone(), a.outcome.clone()))
            .collect::<Vec<_>>(),
        [(p.id("a"), "served".to_owned())]
    );
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    let a = p.store().account(&p.id("a")).unwrap().unwrap();
    assert_eq!(
        a.quota.windows.len(),
        1,
        "the quota observation was written too"
    );
    assert!(
        !p.env
            .lines
            .borrow()
            .iter()
            .any(|(m, _)| m == BOOKKEEPING_LOST_MESSAGE)
    );
}
