//! The store against a native SQLite: migrations, round trips, pin guards and caps, the
//! cursor, leases, signals and attempts.

use super::*;
use crate::model::{
    AccountOptions, ChangeCause, Credential, CredentialKind, OAuthTokens, Provider,
};
use pooler_plugin_kit::NativeDb;

fn store(db: &NativeDb) -> Store<'_, NativeDb> {
    let s = Store::new(db);
    s.migrate().unwrap();
    s
}

#[test]
fn migrations_are_idempotent_and_versioned() {
    let db = NativeDb::memory();
    let s = store(&db);
    s.migrate().unwrap();
    assert_eq!(s.meta_i64("schema-version").unwrap(), Some(SCHEMA_VERSION));
}

#[test]
fn accounts_round_trip_in_selection_order() {
    let db = NativeDb::memory();
    let s = store(&db);
    s.insert_account(
        "b",
        Provider::Claude,
        &Credential::ApiKey("k-b".into()),
        "B",
        0,
        &AccountOptions::default(),
        10,
    )
    .unwrap();
    s.insert_account(
        "a",
        Provider::Claude,
        &Credential::ApiKey("k-a".into()),
        "A",
        0,
        &AccountOptions::default(),
        11,
    )
    .unwrap();
    s.insert_account(
        "z",
        Provider::Claude,
        &Credential::ApiKey("k-z".into()),
        "Z",
        -1,
        &AccountOptions::default(),
        12,
    )
    .unwrap();
    s.insert_account(
        "c",
        Provider::Codex,
        &Credential::OAuth(OAuthTokens {
            access_token: "at".into(),
            refresh_token: "rt".into(),
            expires_at: Some(99),
            chatgpt_account_id: Some("x".into()),
        }),
        "C",
        0,
        &AccountOptions::default(),
        13,
    )
    .unwrap();
    let ids: Vec<String> = s
        .accounts(Some(Provider::Claude))
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(ids, ["z", "b", "a"], "priority, then order added");
    let c = s.account("c").unwrap().unwrap();
    assert_eq!(
        (c.kind, c.token_expires_at),
        (CredentialKind::OAuth, Some(99))
    );
    assert!(
        matches!(s.credential("c").unwrap(), Some(Credential::OAuth(t)) if t.refresh_token == "rt")
    );
    assert!(s.remove_account("c").unwrap());
    assert_eq!(s.credential("c").unwrap(), None);
}

/// AP-19: a bind that saw an older generation does not overwrite a newer pin.
#[test]
fn pin_binds_are_guarded_by_generation() {
    let db = NativeDb::memory();
    let s = store(&db);
    let (p, k, life, cap) = (Provider::Claude, "session:s", 1_000_000, 10);
    let seen = s
        .claim_pin(p, k, "a", Some("t1"), 0, life, cap, "first")
        .unwrap();
    assert!(seen.claimed);
    let again = s
        .claim_pin(p, k, "b", Some("t1"), 1, life, cap, "first")
        .unwrap();
    assert_eq!(
        (again.account.as_str(), again.claimed),
        ("a", false),
        "the first claim wins"
    );
    // A newer request re-pins to b.
    assert!(
        s.bind_pin(
            p,
            k,
            "b",
            None,
            Some(seen.generation),
            2,
            life,
            "rebound",
            cap
        )
        .unwrap()
    );
    // The older request, which also saw the first generation, completes later.
    assert!(
        !s.bind_pin(
            p,
            k,
            "c",
            None,
            Some(seen.generation),
            3,
            life,
            "stale",
            cap
        )
        .unwrap()
    );
    assert!(!s.touch_pin(p, k, seen.generation, 4).unwrap());
    assert_eq!(s.pin(p, k, 5, life).unwrap().unwrap().account, "b");
}

#[test]
fn pins_expire_and_are_capped_least_recently_used_first() {
    let db = NativeDb::memory();
    let s = store(&db);
    let p = Provider::Claude;
    // Seconds apart: a use within TOUCH_GRANULARITY_MS of the last is not written.
    const SEC: u64 = 1_000;
    let life = 100 * SEC;
    for (i, k) in ["k1", "k2", "k3", "k4"].into_iter().enumerate() {
        s.bind_pin(p, k, "a", None, None, i as u64 * SEC, life, "x", 4)
            .unwrap();
    }
    let g1 = s.pin(p, "k1", 4 * SEC, life).unwrap().unwrap().generation;
    assert!(s.touch_pin(p, "k1", g1, 10 * SEC).unwrap());
    s.bind_pin(p, "k5", "a", None, None, 11 * SEC, life, "x", 4)
        .unwrap();
    assert!(
        s.pin(p, "k1", 12 * SEC, life).unwrap().is_some(),
        "touched pin survives"
    );
    assert!(
        s.pin(p, "k2", 12 * SEC, life).unwrap().is_none(),
        "LRU evicted"
    );
    assert_eq!(s.pin_count().unwrap(), 4);
    assert!(
        s.pin(p, "k5", 111 * SEC, life).unwrap().is_none(),
        "expired after the idle lifetime"
    );
    assert_eq!(s.prune_pins(111 * SEC, life, 4).unwrap(), 4);
}

#[test]
fn a_use_within_the_granularity_writes_nothing() {
    let db = NativeDb::memory();
    let s = store(&db);
    let p = Provider::Claude;
    s.bind_pin(p, "k", "a", None, None, 5_000, 60_000, "x", 8)
        .unwrap();
    let pin = s.pin(p, "k", 5_000, 60_000).unwrap().unwrap();
    let later = 5_000 + TOUCH_GRANULARITY_MS - 1;
    assert!(!s.touch_pin(p, "k", pin.generation, later).unwrap());
    assert_eq!(
        s.pin(p, "k", later, 60_000).unwrap().unwrap().last_used_at,
        5_000
    );
    let later = 5_000 + TOUCH_GRANULARITY_MS;
    assert!(s.touch_pin(p, "k", pin.generation, later).unwrap());
    assert_eq!(
        s.pin(p, "k", later, 60_000).unwrap().unwrap().last_used_at,
        later
    );
}

#[test]
fn cursor_moves_only_from_the_expected_value() {
    let db = NativeDb::memory();
    let s = store(&db);
    assert!(s.cas_cursor(Provider::Codex, None, "a").unwrap());
    assert!(!s.cas_cursor(Provider::Codex, None, "b").unwrap());
    assert!(s.cas_cursor(Provider::Codex, Some("a"), "b").unwrap());
    assert_eq!(s.cursor(Provider::Codex).unwrap().as_deref(), Some("b"));
    assert_eq!(s.cursor(Provider::Claude).unwrap(), None);
}

#[test]
fn refresh_lease_is_single_flight_until_it_expires() {
    let db = NativeDb::memory();
    let s = store(&db);
    assert!(s.try_lease("a", "r1", 0, 100).unwrap());
    assert!(!s.try_lease("a", "r2", 50, 150).unwrap());
    assert!(
        s.try_lease("a", "r2", 100, 200).unwrap(),
        "an expired lease can be taken"
    );
    s.release_lease("a", "r2").unwrap();
    assert!(s.try_lease("a", "r3", 101, 200).unwrap());
}

#[test]
fn signals_coalesce_per_provider_in_first_seen_order() {
    let db = NativeDb::memory();
    let s = store(&db);
    s.push_signal(Provider::Claude, ChangeCause::AccountEnabled, 5)
        .unwrap();
    s.push_signal(Provider::Codex, ChangeCause::ConfigChanged, 6)
        .unwrap();
    s.push_signal(Provider::Claude, ChangeCause::ErrorCleared, 7)
        .unwrap();
    s.push_signal(Provider::Claude, ChangeCause::AccountEnabled, 8)
        .unwrap();
    let taken = s.take_signals().unwrap();
    assert_eq!(
        taken,
        vec![
            PendingSignal {
                provider: Provider::Claude,
                causes: vec![ChangeCause::AccountEnabled, ChangeCause::ErrorCleared],
                detected_at: 5
            },
            PendingSignal {
                provider: Provider::Codex,
                causes: vec![ChangeCause::ConfigChanged],
                detected_at: 6
            },
        ]
    );
    assert!(s.take_signals().unwrap().is_empty());
}

#[test]
fn attempts_keep_the_latest_twenty_per_session() {
    let db = NativeDb::memory();
    let s = store(&db);
    for i in 0..25u64 {
        s.record_attempt(
            Provider::Claude,
            "session:s",
            i,
            "a",
            Some(200),
            "served",
            4096,
        )
        .unwrap();
    }
    let recent = s.recent_attempts(Provider::Claude, "session:s").unwrap();
    assert_eq!(recent.len(), RECENT_ATTEMPTS);
    assert_eq!((recent[0].at, recent[19].at), (5, 24));
    // Another session counts its own ids and keeps its own attempts.
    s.record_attempt(
        Provider::Claude,
        "session:t",
        99,
        "b",
        None,
        "transient",
        4096,
    )
    .unwrap();
    let other = s.recent_attempts(Provider::Claude, "session:t").unwrap();
    assert_eq!(other.len(), 1);
    assert_eq!((other[0].at, other[0].account.as_str()), (99, "b"));
    // Stored rows stay bounded: trimmed back to twenty on every twentieth attempt.
    for i in 25..40u64 {
        s.record_attempt(
            Provider::Claude,
            "session:s",
            i,
            "a",
            Some(200),
            "served",
            4096,
        )
        .unwrap();
    }
    let rows = db
        .query(
            "SELECT COUNT(*) AS n FROM attempts WHERE key = 'session:s'",
            &[],
        )
        .unwrap();
    assert_eq!(
        rows.first().unwrap().u64("n").unwrap(),
        RECENT_ATTEMPTS as u64
    );
    let recent = s.recent_attempts(Provider::Claude, "session:s").unwrap();
    assert_eq!((recent[0].at, recent[19].at), (20, 39));
}

/// A flood of sessions (each one attempt, as new sessions are) keeps the attempts of at
/// most `pin-cap` sessions, plus the slack one pass lets through, the most recently active
/// kept; a session's own bound still holds, and the tick's prune applies a lowered cap.
#[test]
fn attempts_stay_bounded_overall_by_the_pin_cap() {
    use crate::store::attempt_sessions_slack;
    let db = NativeDb::memory();
    let s = store(&db);
    let count = || -> u64 {
        db.query("SELECT COUNT(*) AS n FROM attempts", &[])
            .unwrap()
            .first()
            .unwrap()
            .u64("n")
            .unwrap()
    };
    let cap = 10;
    let most = cap + attempt_sessions_slack(cap);
    for i in 0..6_000u64 {
        let key = format!("session:{i}");
        s.record_attempt(Provider::Claude, &key, i, "a", Some(200), "served", cap)
            .unwrap();
        assert!(count() <= most, "after {i}: {}", count());
    }
    let newest = s.recent_attempts(Provider::Claude, "session:5999").unwrap();
    assert_eq!(newest.len(), 1);
    assert!(
        s.recent_attempts(Provider::Claude, "session:0")
            .unwrap()
            .is_empty()
    );
    // A busy session among them keeps its latest twenty.
    for i in 0..50u64 {
        s.record_attempt(
            Provider::Claude,
            "session:busy",
            10_000 + i,
            "a",
            None,
            "transient",
            cap,
        )
        .unwrap();
    }
    assert_eq!(
        s.recent_attempts(Provider::Claude, "session:busy")
            .unwrap()
            .len(),
        RECENT_ATTEMPTS
    );
    // Newer sessions push out the least recently active first, the busy one among them.
    for i in 0..40u64 {
        let key = format!("session:late-{i}");
        s.record_attempt(Provider::Claude, &key, 20_000 + i, "a", None, "served", cap)
            .unwrap();
    }
    assert!(
        s.recent_attempts(Provider::Claude, "session:busy")
            .unwrap()
            .is_empty()
    );
    // A lowered cap applies at the tick: the two most recently active sessions are kept.
    s.prune_attempts(30_000, 86_400_000, 2).unwrap();
    let left: Vec<String> = db
        .query("SELECT DISTINCT key FROM attempts ORDER BY key", &[])
        .unwrap()
        .iter()
        .map(|r| r.text("key").unwrap())
        .collect();
    assert_eq!(left, ["session:late-38", "session:late-39"]);
}

#[test]
fn a_schema_1_database_migrates_keeping_its_attempts() {
    let db = NativeDb::memory();
    db.execute_batch(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value);
             INSERT INTO meta VALUES ('schema-version', 1);
             CREATE TABLE attempts (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 provider TEXT NOT NULL, key TEXT NOT NULL, at INTEGER NOT NULL,
                 account_id TEXT NOT NULL, status INTEGER, outcome TEXT NOT NULL);
             CREATE INDEX attempts_by_key ON attempts(provider, key, id);
             INSERT INTO attempts (provider, key, at, account_id, status, outcome) VALUES
                 ('claude', 'session:s', 1, 'a', 200, 'served'),
                 ('claude', 'session:u', 2, 'b', 529, 'transient'),
                 ('claude', 'session:s', 3, 'c', NULL, 'hold');",
    )
    .unwrap();
    let s = Store::new(&db);
    assert!(!s.schema_current().unwrap());
    s.ensure_schema().unwrap();
    assert!(s.schema_current().unwrap());
    let at = |key: &str| -> Vec<(u64, String)> {
        s.recent_attempts(Provider::Claude, key)
            .unwrap()
            .into_iter()
            .map(|a| (a.at, a.outcome))
            .collect()
    };
    assert_eq!(at("session:s"), [(1, "served".into()), (3, "hold".into())]);
    assert_eq!(at("session:u"), [(2, "transient".into())]);
    // New attempts continue after the migrated ones.
    s.record_attempt(
        Provider::Claude,
        "session:s",
        4,
        "a",
        Some(200),
        "served",
        4096,
    )
    .unwrap();
    assert_eq!(at("session:s").last(), Some(&(4, "served".into())));
    // The old table and its index are gone.
    let rows = db
        .query(
            "SELECT COUNT(*) AS n FROM sqlite_master WHERE name IN ('attempts_v1', 'attempts_by_key')",
            &[],
        )
        .unwrap();
    assert_eq!(rows.first().unwrap().u64("n").unwrap(), 0);
}

#[test]
fn routes_are_found_by_hash_and_close_at_once() {
    let db = NativeDb::memory();
    let s = store(&db);
    let h1 = crate::token::hash("tok-1");
    s.open_route("t1", Provider::Claude, &h1, 1).unwrap();
    assert_eq!(
        s.route_by_hash(&h1).unwrap(),
        Some(("t1".into(), Provider::Claude))
    );
    let h2 = crate::token::hash("tok-2");
    s.open_route("t1", Provider::Claude, &h2, 2).unwrap();
    assert_eq!(
        s.route_by_hash(&h1).unwrap(),
        None,
        "re-opening replaces the token"
    );
    assert!(s.close_route("t1", Provider::Claude).unwrap());
    assert_eq!(s.route_by_hash(&h2).unwrap(), None);
    assert!(!s.has_route("t1", Provider::Claude).unwrap());
}

/// A schema 2 database gains the accounts' options with the defaults that change nothing,
/// and keeps its accounts.
#[test]
fn a_schema_2_database_migrates_its_accounts_to_default_options() {
    let db = NativeDb::memory();
    db.execute_batch(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value);
         INSERT INTO meta VALUES ('schema-version', 2);
         CREATE TABLE accounts (
             id TEXT PRIMARY KEY, seq INTEGER NOT NULL, provider TEXT NOT NULL,
             kind TEXT NOT NULL, label TEXT NOT NULL, priority INTEGER NOT NULL,
             enabled INTEGER NOT NULL, created_at INTEGER NOT NULL, last_used_at INTEGER,
             error TEXT, held_until INTEGER, hold_kind TEXT,
             needs_sign_in INTEGER NOT NULL DEFAULT 0);
         INSERT INTO accounts (id, seq, provider, kind, label, priority, enabled, created_at)
             VALUES ('a', 1, 'claude', 'api-key', 'A', 0, 1, 5);",
    )
    .unwrap();
    let s = Store::new(&db);
    assert!(!s.schema_current().unwrap());
    s.ensure_schema().unwrap();
    assert!(s.schema_current().unwrap());
    let a = s.account("a").unwrap().unwrap();
    assert_eq!(a.options, AccountOptions::default());
    assert!(!a.quota.extra_usage_allowed);
    s.migrate().unwrap();
}

#[test]
fn account_options_round_trip_and_extra_usage_reaches_the_quota() {
    let db = NativeDb::memory();
    let s = store(&db);
    let options = AccountOptions {
        last_resort: true,
        extra_usage: true,
        max_in_flight: 3,
        preserve: 0.8,
    };
    s.insert_account(
        "a",
        Provider::Claude,
        &Credential::ApiKey("k".into()),
        "A",
        0,
        &options,
        1,
    )
    .unwrap();
    let a = s.account("a").unwrap().unwrap();
    assert_eq!(a.options, options);
    assert!(a.quota.extra_usage_allowed);
    assert!(s.set_options("a", &AccountOptions::default()).unwrap());
    assert_eq!(
        s.accounts(Some(Provider::Claude)).unwrap()[0].options,
        AccountOptions::default()
    );
    assert!(!s.set_options("nobody", &options).unwrap());
}

/// What a ranking strategy counts: fresh pins per account, and the placements of the last
/// minute (older ones forgotten), per provider.
#[test]
fn loads_count_live_pins_and_the_last_minutes_placements() {
    let db = NativeDb::memory();
    let s = store(&db);
    let t = 1_000_000;
    for (key, account, at) in [("s1", "a", t), ("s2", "a", t - 10), ("s3", "b", t - 40_000)] {
        s.claim_pin(Provider::Claude, key, account, None, at, 30_000, 100, "x")
            .unwrap();
    }
    s.claim_pin(Provider::Codex, "s4", "c", None, t, 30_000, 100, "x")
        .unwrap();
    s.record_placement(Provider::Claude, "a", t - 70_000)
        .unwrap();
    s.record_placement(Provider::Claude, "b", t - 30_000)
        .unwrap();
    s.record_placement(Provider::Claude, "b", t).unwrap();
    s.record_placement(Provider::Codex, "c", t).unwrap();
    let loads = s.loads(Provider::Claude, t, 30_000).unwrap();
    assert_eq!(loads["a"], Load { live: 2, recent: 0 });
    assert_eq!(loads["b"], Load { live: 0, recent: 2 });
    assert!(!loads.contains_key("c"));
    let rows = db
        .query(
            "SELECT COUNT(*) AS n FROM placements WHERE provider = 'claude'",
            &[],
        )
        .unwrap();
    assert_eq!(
        rows.first().unwrap().u64("n").unwrap(),
        2,
        "the old one went"
    );
}

/// In-flight leases: never more than the limit across stores (instances) on one database;
/// an ended lease frees its place; one nobody ended frees it at its expiry; a start ends
/// them all.
#[test]
fn leases_cap_requests_in_flight_across_instances_and_expire() {
    let db = NativeDb::memory();
    let one = store(&db);
    let two = Store::new(&db);
    let t = 5_000_000;
    assert!(one.take_flight_lease("a", 2, "l1", t).unwrap());
    assert!(two.take_flight_lease("a", 2, "l2", t).unwrap());
    assert!(!one.take_flight_lease("a", 2, "l3", t).unwrap(), "full");
    assert!(
        two.take_flight_lease("b", 2, "l4", t).unwrap(),
        "per account"
    );
    assert_eq!(one.flight_leases("a", t).unwrap(), 2);
    two.end_flight_lease("l1").unwrap();
    assert!(one.take_flight_lease("a", 2, "l5", t + 1).unwrap());
    assert!(
        !one.take_flight_lease("a", 2, "l6", t + FLIGHT_LEASE_MS - 1)
            .unwrap()
    );
    assert!(
        one.take_flight_lease("a", 2, "l7", t + FLIGHT_LEASE_MS)
            .unwrap(),
        "the lease nobody ended expired"
    );
    one.end_flight_leases().unwrap();
    assert_eq!(one.flight_leases("a", t + FLIGHT_LEASE_MS).unwrap(), 0);
    assert_eq!(one.flight_leases("b", t).unwrap(), 0);
}

/// The quota timeline: window changes, holds and errors come back oldest first, filtered by
/// provider and time; removing an account removes its history; the tick's prune drops what
/// is past the retention and keeps each account's newest entries up to the cap.
#[test]
fn quota_history_round_trips_and_is_pruned_by_age_and_per_account_cap() {
    use crate::history::{HISTORY_CAP_PER_ACCOUNT, HISTORY_RETENTION_MS, HistoryEvent};
    use crate::model::HoldKind;
    use crate::quota::Window;
    let db = NativeDb::memory();
    let s = store(&db);
    for (id, provider) in [("a", Provider::Claude), ("c", Provider::Codex)] {
        let credential = Credential::ApiKey(format!("k-{id}"));
        s.insert_account(
            id,
            provider,
            &credential,
            id,
            0,
            &AccountOptions::default(),
            10,
        )
        .unwrap();
    }
    let five_h = Window {
        name: "5h".into(),
        family: None,
        utilization: Some(0.42),
        resets_at: Some(9_000_000),
        status: Some("allowed".into()),
        observed_at: 1_000,
    };
    s.record_history("a", 1_000, &HistoryEvent::Window(five_h.clone()))
        .unwrap();
    s.set_hold("a", 5_000, HoldKind::RateLimit, 2_000).unwrap();
    // A shorter hold changes nothing, so it is not history.
    s.set_hold("a", 4_000, HoldKind::RateLimit, 2_500).unwrap();
    assert!(s.set_error("a", "refused", 3_000).unwrap());
    assert!(!s.set_error("a", "refused again", 3_500).unwrap());
    s.record_history("c", 1_500, &HistoryEvent::Error).unwrap();

    let all = s.quota_history(None, 0).unwrap();
    let seen: Vec<(&str, u64)> = all.iter().map(|e| (e.account.as_str(), e.at)).collect();
    assert_eq!(
        seen,
        [("a", 1_000), ("c", 1_500), ("a", 2_000), ("a", 3_000)]
    );
    assert_eq!(all[0].event, HistoryEvent::Window(five_h));
    assert_eq!(all[2].event, HistoryEvent::Hold { until: 5_000 });
    assert_eq!(all[3].event, HistoryEvent::Error);
    let claude = s.quota_history(Some(Provider::Claude), 1_500).unwrap();
    assert_eq!(claude.len(), 2, "{claude:?}");

    // Retention: at the tick a day past a week, the first three are gone.
    s.prune_history(2_500 + HISTORY_RETENTION_MS).unwrap();
    let left: Vec<u64> = s
        .quota_history(None, 0)
        .unwrap()
        .iter()
        .map(|e| e.at)
        .collect();
    assert_eq!(left, [3_000]);

    // The cap keeps an account's newest entries.
    let base = 10_000_000;
    s.tx(|s| {
        for i in 0..HISTORY_CAP_PER_ACCOUNT + 5 {
            s.record_history("c", base + i, &HistoryEvent::Error)?;
        }
        Ok(())
    })
    .unwrap();
    s.prune_history(base).unwrap();
    let c = s.quota_history(Some(Provider::Codex), 0).unwrap();
    assert_eq!(c.len() as u64, HISTORY_CAP_PER_ACCOUNT);
    assert_eq!(c[0].at, base + 5);
    // Removing an account removes its history.
    s.remove_account("a").unwrap();
    assert!(
        s.quota_history(Some(Provider::Claude), 0)
            .unwrap()
            .is_empty()
    );
}
