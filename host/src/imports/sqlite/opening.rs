//! Opening a plugin's database: which names are allowed, the private directory, the core's
//! recipe ([`pooler_core::sqlite_file`]) with the host's settings, and the authorizer that
//! keeps statements inside the plugin's own file.

use std::fs;
use std::path::Path;

use pooler_core::sqlite_file::{self, Busy, ExistingFile, OpenError, Settings};
use rusqlite::OpenFlags;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};

use super::connection::map_error;
use super::lock_wait::wait_for_lock;
use crate::bindings::pool::pooler::plugins::sqlite::Error;

/// Longest database name.
pub const MAX_NAME_CHARS: usize = 64;
/// WAL pages after which a committing connection checkpoints by itself: only reached when
/// the background checkpoints fall behind (SQLite's default, 1,000, put that on the request
/// path; `docs/04-sqlite-settings.md`).
pub(super) const AUTOCHECKPOINT_PAGES: i64 = 16_384;

thread_local! {
    /// Set by the authorizer when a statement being prepared on this thread changes its
    /// connection's own state (see [`changes_connection_state`]).
    pub(super) static STATE_CHANGED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
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

/// Create `dir` (and parents) and make it private to the owner.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    set_mode(dir, 0o700)
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: u32) -> std::io::Result<()> {
    Ok(())
}

/// Open `name` in `dir` with the host's settings.
pub fn open(dir: &Path, name: &str) -> Result<rusqlite::Connection, Error> {
    check_name(name)?;
    private_dir(dir)
        .map_err(|e| Error::Io(format!("cannot create the plugin's directory: {e}")))?;
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
    Ok(conn)
}

/// Refuse what would reach files outside the plugin's own database: attaching another
/// file (`ATTACH`, and `VACUUM INTO` which attaches its target) and the pragmas that move
/// SQLite's temporary or data files. `ATTACH ''` (a private temporary database, which
/// plain `VACUUM` uses) stays allowed; a file name given as an expression rather than a
/// literal cannot be checked, so it is refused.
fn authorize(ctx: AuthContext<'_>) -> Authorization {
    if changes_connection_state(&ctx.action) {
        STATE_CHANGED.set(true);
    }
    match ctx.action {
        AuthAction::Attach { filename: "" } => Authorization::Allow,
        AuthAction::Attach { .. } => Authorization::Deny,
        AuthAction::Unknown { code, .. } if code == rusqlite::ffi::SQLITE_ATTACH => {
            Authorization::Deny
        }
        AuthAction::Pragma { pragma_name, .. }
            if pragma_name.eq_ignore_ascii_case("temp_store_directory")
                || pragma_name.eq_ignore_ascii_case("data_store_directory") =>
        {
            Authorization::Deny
        }
        _ => Authorization::Allow,
    }
}

/// Whether an action changes state that belongs to the connection rather than the database
/// file (a pragma given a value, a temporary object, an attached private database): a
/// guest connection that did so keeps its host connection, so its later statements see
/// that state. Errs on the side of keeping (`PRAGMA table_info(t)` counts, too).
fn changes_connection_state(action: &AuthAction<'_>) -> bool {
    matches!(
        action,
        AuthAction::Pragma {
            pragma_value: Some(_),
            ..
        } | AuthAction::CreateTempIndex { .. }
            | AuthAction::CreateTempTable { .. }
            | AuthAction::CreateTempTrigger { .. }
            | AuthAction::CreateTempView { .. }
            | AuthAction::Attach { .. }
            | AuthAction::Detach { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::super::connection::Connection;
    use super::*;
    use crate::bindings::pool::pooler::plugins::sqlite::Value;

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
            let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
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
        // A private temporary database and plain VACUUM still work.
        conn.execute_batch("ATTACH '' AS scratch; DETACH scratch; VACUUM;")
            .unwrap();
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
