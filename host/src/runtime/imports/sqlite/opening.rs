//! Opening a plugin's database: which names are allowed, the private directory, the core's
//! recipe ([`pooler_core::sqlite_file`]) with the host's settings, and the authorizer that
//! keeps statements inside the plugin's own file.

use std::path::Path;

use pooler_core::sqlite_file::{self, Busy, ExistingFile, OpenError, Settings};
use rusqlite::OpenFlags;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};

use super::error::map_error;
use super::lock_wait::{AUTOCHECKPOINT_PAGES, wait_for_lock};
use crate::runtime::bindings::pool::pooler::plugins::sqlite::Error;

/// Longest database name.
pub const MAX_NAME_CHARS: usize = 64;

thread_local! {
    /// Set by the authorizer when a statement being prepared on this thread changes its
    /// connection's own state (see [`changes_connection_state`]).
    pub(super) static STATE_CHANGED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

thread_local! {
    /// Set while the host itself runs a statement on a plugin connection (a checkpoint):
    /// the authorizer lets it through.
    static HOST_STATEMENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

thread_local! {
    /// What the authorizer last refused on this thread, for the error's text (SQLite's own
    /// says only `not authorized`).
    static REFUSED: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Take what the authorizer refused since the last call, if anything.
pub(super) fn take_refusal() -> Option<String> {
    REFUSED.take()
}

fn refuse(why: String) -> Authorization {
    REFUSED.set(Some(why));
    Authorization::Deny
}

/// Run `f`, the host's own statements on a plugin connection (never a guest's), past the
/// authorizer's refusals.
pub(super) fn as_host<R>(f: impl FnOnce() -> R) -> R {
    let previous = HOST_STATEMENT.replace(true);
    let result = f();
    HOST_STATEMENT.set(previous);
    result
}

/// Why `name` cannot be a database name, if it cannot.
pub fn check_name(name: &str) -> Result<(), Error> {
    let refused = name.is_empty()
        || name.chars().count() > MAX_NAME_CHARS
        || name.contains(['/', '\\'])
        || name.contains("..")
        || name.chars().any(char::is_control)
        || Path::new(name).is_absolute();
    if refused {
        Err(Error::InvalidName(name.to_string()))
    } else {
        Ok(())
    }
}

/// Open `name` in `dir` with the host's settings.
pub fn open(dir: &Path, name: &str) -> Result<rusqlite::Connection, Error> {
    check_name(name)?;
    pooler_core::private_file::create_private_dir(dir)
        .map_err(|e| Error::Io(format!("cannot use the plugin's directory: {e}")))?;
    let path = dir.join(format!("{name}.sqlite3"));
    let settings = Settings {
        flags: OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        busy: Busy::Handler(wait_for_lock),
        existing: ExistingFile::SetMode,
        wal_autocheckpoint: Some(AUTOCHECKPOINT_PAGES),
    };
    let mut conn = sqlite_file::open(&path, &settings).map_err(|e| match e {
        OpenError::File(e) => Error::Io(format!("cannot create database `{name}`: {e}")),
        OpenError::Sqlite(e) => map_error(e),
    })?;
    conn.authorizer(Some(authorize)).map_err(map_error)?;
    super::bounds::bound(&mut conn).map_err(map_error)?;
    Ok(conn)
}

/// How a plugin may use an allowed pragma.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PragmaUse {
    /// Read only (`PRAGMA foreign_keys`); setting it is refused.
    Read,
    /// Read and set: it lives in the database file's header, not in the connection.
    ReadWrite,
    /// Run, with or without an argument (a table or index name, a count of errors): it only
    /// reads.
    Query,
}

/// The pragmas a plugin may run; every other one is refused (`not authorized`). Some change
/// the whole process (`hard_heap_limit`, `soft_heap_limit`), the files (`journal_mode`,
/// `mmap_size`, `temp_store_directory`), what the host relies on (`foreign_keys = OFF`,
/// `synchronous`, `locking_mode`, `busy_timeout`, `wal_autocheckpoint`) or the connection a
/// later instance borrows (`cache_size`, `recursive_triggers`, …).
pub const PRAGMAS: &[(&str, PragmaUse, &str)] = &[
    (
        "user_version",
        PragmaUse::ReadWrite,
        "Provider Retry's schema version (store::migrate); a number in the file's header",
    ),
    (
        "application_id",
        PragmaUse::ReadWrite,
        "a number in the file's header, like user_version",
    ),
    (
        "foreign_keys",
        PragmaUse::Read,
        "a plugin may check they are on; not turn them off",
    ),
    (
        "schema_version",
        PragmaUse::Read,
        "read-only schema counter",
    ),
    ("data_version", PragmaUse::Read, "read-only change counter"),
    ("page_count", PragmaUse::Read, "read-only file size"),
    ("page_size", PragmaUse::Read, "read-only file size"),
    ("freelist_count", PragmaUse::Read, "read-only file size"),
    (
        "table_info",
        PragmaUse::Query,
        "schema introspection for migrations",
    ),
    ("table_xinfo", PragmaUse::Query, "schema introspection"),
    ("table_list", PragmaUse::Query, "schema introspection"),
    ("index_list", PragmaUse::Query, "schema introspection"),
    ("index_info", PragmaUse::Query, "schema introspection"),
    ("index_xinfo", PragmaUse::Query, "schema introspection"),
    ("foreign_key_list", PragmaUse::Query, "schema introspection"),
    (
        "foreign_key_check",
        PragmaUse::Query,
        "reads the plugin's own rows",
    ),
    (
        "integrity_check",
        PragmaUse::Query,
        "reads the plugin's own file (bounded by the deadline)",
    ),
    (
        "quick_check",
        PragmaUse::Query,
        "reads the plugin's own file (bounded by the deadline)",
    ),
];

/// Whether a plugin may run `PRAGMA name` (with `value`, if given).
pub fn pragma_allowed(name: &str, value: Option<&str>) -> bool {
    PRAGMAS
        .iter()
        .find(|(allowed, _, _)| allowed.eq_ignore_ascii_case(name))
        .is_some_and(|&(_, use_, _)| match use_ {
            PragmaUse::Read => value.is_none(),
            PragmaUse::ReadWrite | PragmaUse::Query => true,
        })
}

/// Refuse what would reach files outside the plugin's own database or change more than it:
/// attaching any database (`ATTACH`, `VACUUM INTO` which attaches its target, and plain
/// `VACUUM`, whose private temporary database the attached limit of 0 refuses too) and
/// every pragma not in [`PRAGMAS`].
fn authorize(ctx: AuthContext<'_>) -> Authorization {
    if HOST_STATEMENT.get() {
        return Authorization::Allow;
    }
    if changes_connection_state(&ctx.action) {
        STATE_CHANGED.set(true);
    }
    match ctx.action {
        AuthAction::Attach { .. } | AuthAction::Detach { .. } => {
            refuse("a plugin may not attach databases (nor VACUUM)".into())
        }
        AuthAction::Unknown { code, .. } if code == rusqlite::ffi::SQLITE_ATTACH => {
            refuse("a plugin may not attach databases (nor VACUUM)".into())
        }
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } if !pragma_allowed(pragma_name, pragma_value) => refuse(match pragma_value {
            Some(_)
                if PRAGMAS
                    .iter()
                    .any(|(n, _, _)| n.eq_ignore_ascii_case(pragma_name)) =>
            {
                format!("PRAGMA {pragma_name} may be read, not set, by a plugin")
            }
            _ => format!(
                "PRAGMA {pragma_name} is not one a plugin may run (docs/04-sqlite-settings.md)"
            ),
        }),
        _ => Authorization::Allow,
    }
}

/// Whether an action changes state that belongs to the connection rather than the database
/// file (a temporary object): a guest connection that did so keeps its host connection, so
/// its later statements see that state, and that host connection is closed, not handed to
/// another instance, when the guest connection is dropped. No allowed pragma changes the
/// connection ([`PRAGMAS`]), and attaching is refused.
fn changes_connection_state(action: &AuthAction<'_>) -> bool {
    matches!(
        action,
        AuthAction::CreateTempIndex { .. }
            | AuthAction::CreateTempTable { .. }
            | AuthAction::CreateTempTrigger { .. }
            | AuthAction::CreateTempView { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::super::Connection;
    use super::*;
    use crate::runtime::bindings::pool::pooler::plugins::sqlite::Value;

    #[test]
    fn names_that_could_leave_the_directory_are_refused() {
        for name in [
            "",
            "..",
            "../x",
            "a/b",
            "a\\b",
            "/abs",
            "x\u{0}",
            "tab\t",
            &"n".repeat(65),
        ] {
            assert!(
                matches!(check_name(name), Err(Error::InvalidName(n)) if n == name),
                "{name:?}"
            );
        }
        for name in ["pool", "retry-state", "a.b", &"n".repeat(64)] {
            assert!(check_name(name).is_ok(), "{name:?}");
        }
    }

    #[test]
    fn files_are_private_and_typed_values_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("plugins").join("p");
        let conn = Connection::open_uncached(&dir, "db").unwrap();
        conn.execute_batch("CREATE TABLE t (a, b, c, d, e)")
            .unwrap();
        let values = vec![
            Value::Null,
            Value::Integer(i64::MIN),
            Value::Real(-0.25),
            Value::Text("ü".into()),
            Value::Blob(vec![0, 1, 255]),
        ];
        assert_eq!(
            conn.execute("INSERT INTO t VALUES (?, ?, ?, ?, ?)", values.clone())
                .unwrap(),
            1
        );
        let rows = conn.query("SELECT * FROM t", vec![]).unwrap();
        assert_eq!(rows.columns, ["a", "b", "c", "d", "e"]);
        assert_eq!(rows.rows.len(), 1);
        for (got, want) in rows.rows[0].iter().zip(&values) {
            assert_eq!(format!("{got:?}"), format!("{want:?}"));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&dir), 0o700);
            assert_eq!(mode(&dir.join("db.sqlite3")), 0o600);
        }
        let mode: String = conn.with_raw(|c| {
            c.query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .unwrap()
        });
        assert_eq!(mode, "wal");
    }

    #[test]
    fn other_files_cannot_be_attached_or_written() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside.sqlite3");
        rusqlite::Connection::open(&outside)
            .unwrap()
            .execute_batch("CREATE TABLE secret (x); INSERT INTO secret VALUES (42);")
            .unwrap();
        let dir = tmp.path().join("plugins").join("p");
        let conn = Connection::open_uncached(&dir, "db").unwrap();
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
        let file = outside.display().to_string();
        for sql in [
            "ATTACH '' AS scratch".to_string(),
            "VACUUM".to_string(),
            format!("ATTACH '{file}' AS o"),
            format!("ATTACH 'file:{file}?mode=ro' AS o"),
            format!("ATTACH '{file}' || '' AS o"),
            format!(
                "VACUUM INTO '{}'",
                tmp.path().join("copy.sqlite3").display()
            ),
            format!("PRAGMA temp_store_directory = '{}'", tmp.path().display()),
        ] {
            assert!(
                matches!(conn.execute_batch(&sql), Err(Error::InvalidStatement(_))),
                "{sql} was allowed"
            );
        }
        assert!(!tmp.path().join("copy.sqlite3").exists());
        let rows = conn.query("SELECT count(*) FROM t", vec![]).unwrap();
        assert!(matches!(rows.rows[0][0], Value::Integer(1)));
    }

    #[test]
    fn only_the_allowed_pragmas_run() {
        let tmp = tempfile::tempdir().unwrap();
        let conn = Connection::open_uncached(tmp.path(), "db").unwrap();
        conn.execute_batch("CREATE TABLE t (x)").unwrap();
        for sql in [
            // Process-wide: every database's, the core's included.
            "PRAGMA hard_heap_limit = 1099511627776",
            "PRAGMA soft_heap_limit = 1099511627776",
            "PRAGMA soft_heap_limit",
            "PRAGMA threads = 4",
            // The files, and what the host relies on.
            "PRAGMA mmap_size = 1048576",
            "PRAGMA journal_mode = DELETE",
            "PRAGMA journal_mode",
            "PRAGMA locking_mode = EXCLUSIVE",
            "PRAGMA synchronous = OFF",
            "PRAGMA main.synchronous = OFF",
            "PRAGMA foreign_keys = OFF",
            "PRAGMA busy_timeout = 0",
            "PRAGMA wal_autocheckpoint = 1",
            "PRAGMA wal_checkpoint(TRUNCATE)",
            "PRAGMA writable_schema = ON",
            "PRAGMA cache_size = 1",
            "PRAGMA recursive_triggers = ON",
            "PRAGMA temp_store = MEMORY",
            "PRAGMA temp_store_directory = '/tmp'",
            "PRAGMA data_store_directory = '/tmp'",
            "PRAGMA secure_delete = ON",
            "PRAGMA query_only = ON",
            "PRAGMA optimize",
            "PRAGMA unknown_pragma = 1",
        ] {
            match conn.execute_batch(sql) {
                Err(Error::InvalidStatement(m)) => {
                    assert!(m.contains("not authorized"), "{sql}: {m}")
                }
                other => panic!("{sql} was allowed: {other:?}"),
            }
        }
        // The process-wide limits are untouched (SQLite's defaults: none).
        // SAFETY: a negative argument only reads the limit.
        assert_eq!(unsafe { rusqlite::ffi::sqlite3_soft_heap_limit64(-1) }, 0);
        // SAFETY: a negative argument only reads the process-wide limit.
        assert_eq!(unsafe { rusqlite::ffi::sqlite3_hard_heap_limit64(-1) }, 0);
        // What the plugins use, and harmless reads.
        conn.execute_batch("PRAGMA user_version = 3").unwrap();
        let read = |sql: &str| conn.query(sql, vec![]).unwrap().rows;
        assert!(matches!(
            read("PRAGMA user_version")[0][0],
            Value::Integer(3)
        ));
        assert!(matches!(
            read("PRAGMA foreign_keys")[0][0],
            Value::Integer(1)
        ));
        assert_eq!(read("PRAGMA table_info(t)").len(), 1);
        assert!(matches!(&read("PRAGMA integrity_check")[0][0], Value::Text(ok) if ok == "ok"));
        assert!(matches!(&read("PRAGMA quick_check(1)")[0][0], Value::Text(ok) if ok == "ok"));
        read("PRAGMA index_list(t)");
        read("PRAGMA foreign_key_check");
        read("PRAGMA page_count");
        // Settings pragmas cannot be called like queries to set them.
        for sql in ["PRAGMA foreign_keys(0)", "PRAGMA page_size = 512"] {
            assert!(conn.execute_batch(sql).is_err(), "{sql}");
        }
        // Every allowed pragma is documented.
        for (name, _, why) in PRAGMAS {
            assert!(!why.is_empty(), "{name}");
        }
    }

    #[test]
    fn a_cached_statement_is_not_planned_again_when_rebound() {
        let tmp = tempfile::tempdir().unwrap();
        let conn = Connection::open_uncached(tmp.path(), "db").unwrap();
        conn.execute_batch(
            "CREATE TABLE a (id TEXT PRIMARY KEY, p TEXT);
             CREATE TABLE s (a TEXT PRIMARY KEY, x);
             INSERT INTO a VALUES ('1', 'claude'), ('2', 'codex');",
        )
        .unwrap();
        // A parameter compared in a query with a join: without the planner stability
        // setting, SQLite re-prepares this on every reuse from the statement cache.
        let sql = "SELECT a.id, s.x FROM a LEFT JOIN s ON s.a = a.id WHERE a.p = ?1";
        for p in ["claude", "codex", "claude"] {
            let rows = conn.query(sql, vec![Value::Text(p.into())]).unwrap();
            assert_eq!(rows.rows.len(), 1);
        }
        let reprepared = conn.with_raw(|c| {
            c.prepare_cached(sql)
                .unwrap()
                .get_status(rusqlite::StatementStatus::RePrepare)
        });
        assert_eq!(reprepared, 0, "the cached statement was prepared again");
    }
}
