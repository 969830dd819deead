//! The database seam: typed values, rows, errors and the [`Db`] trait.

use std::fmt;

/// A typed cell or parameter; one to one with SQLite's storage classes and the WIT
/// `sqlite.value` variant.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Integer(v)
    }
}
impl From<u64> for Value {
    /// Timestamps and counters are stored as SQLite integers; values above `i64::MAX`
    /// saturate (they do not occur for epoch milliseconds).
    fn from(v: u64) -> Self {
        Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::Integer(v.into())
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Integer(v.into())
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Integer(v.into())
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Real(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::Text(v.clone())
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Blob(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

impl Value {
    /// The integer, if this is one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Integer(v) => Some(*v),
            _ => None,
        }
    }
    /// The integer as a non-negative `u64` (timestamps), if this is one.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i64().and_then(|v| u64::try_from(v).ok())
    }
    /// The number as `f64` (integers convert), if this is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Real(v) => Some(*v),
            Value::Integer(v) => Some(*v as f64),
            _ => None,
        }
    }
    /// The text, if this is text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(v) => Some(v),
            _ => None,
        }
    }
    /// The bytes, if this is a blob.
    pub fn as_blob(&self) -> Option<&[u8]> {
        match self {
            Value::Blob(v) => Some(v),
            _ => None,
        }
    }
    /// Whether this is NULL.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
}

/// Why a database call failed; mirrors the WIT `sqlite.error` variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbError {
    InvalidName(String),
    TooManyConnections,
    Busy,
    Constraint(String),
    InvalidStatement(String),
    Io(String),
    /// A row did not have the shape the caller expected (wrong type, missing column).
    Decode(String),
}

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DbError::InvalidName(n) => write!(f, "invalid database name {n:?}"),
            DbError::TooManyConnections => write!(f, "too many open databases"),
            DbError::Busy => write!(f, "database busy"),
            DbError::Constraint(m) => write!(f, "constraint failed: {m}"),
            DbError::InvalidStatement(m) => write!(f, "invalid statement: {m}"),
            DbError::Io(m) => write!(f, "database i/o error: {m}"),
            DbError::Decode(m) => write!(f, "unexpected row shape: {m}"),
        }
    }
}

impl std::error::Error for DbError {}

/// One result row, with column lookup by name.
#[derive(Debug, Clone, PartialEq)]
pub struct Row<'a> {
    columns: &'a [String],
    values: &'a [Value],
}

impl<'a> Row<'a> {
    /// The value of column `name`.
    pub fn get(&self, name: &str) -> Result<&'a Value, DbError> {
        self.columns
            .iter()
            .position(|c| c == name)
            .and_then(|i| self.values.get(i))
            .ok_or_else(|| DbError::Decode(format!("no column {name}")))
    }
    /// Column `name` as an integer (NULL is an error).
    pub fn i64(&self, name: &str) -> Result<i64, DbError> {
        self.get(name)?
            .as_i64()
            .ok_or_else(|| DbError::Decode(format!("column {name} is not an integer")))
    }
    /// Column `name` as a non-negative integer.
    pub fn u64(&self, name: &str) -> Result<u64, DbError> {
        self.get(name)?
            .as_u64()
            .ok_or_else(|| DbError::Decode(format!("column {name} is not a u64")))
    }
    /// Column `name` as an optional non-negative integer (NULL is None).
    pub fn opt_u64(&self, name: &str) -> Result<Option<u64>, DbError> {
        let v = self.get(name)?;
        if v.is_null() {
            return Ok(None);
        }
        v.as_u64()
            .map(Some)
            .ok_or_else(|| DbError::Decode(format!("column {name} is not a u64")))
    }
    /// Column `name` as a number.
    pub fn f64(&self, name: &str) -> Result<f64, DbError> {
        self.get(name)?
            .as_f64()
            .ok_or_else(|| DbError::Decode(format!("column {name} is not a number")))
    }
    /// Column `name` as an optional number.
    pub fn opt_f64(&self, name: &str) -> Result<Option<f64>, DbError> {
        let v = self.get(name)?;
        if v.is_null() {
            return Ok(None);
        }
        v.as_f64()
            .map(Some)
            .ok_or_else(|| DbError::Decode(format!("column {name} is not a number")))
    }
    /// Column `name` as text.
    pub fn text(&self, name: &str) -> Result<String, DbError> {
        self.get(name)?
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| DbError::Decode(format!("column {name} is not text")))
    }
    /// Column `name` as optional text.
    pub fn opt_text(&self, name: &str) -> Result<Option<String>, DbError> {
        let v = self.get(name)?;
        if v.is_null() {
            return Ok(None);
        }
        v.as_str()
            .map(|s| Some(s.to_owned()))
            .ok_or_else(|| DbError::Decode(format!("column {name} is not text")))
    }
    /// Column `name` as a boolean stored as 0/1.
    pub fn bool(&self, name: &str) -> Result<bool, DbError> {
        Ok(self.i64(name)? != 0)
    }
}

/// The rows of a query.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rows {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
}

impl Rows {
    /// Iterate the rows with column lookup.
    pub fn iter(&self) -> impl Iterator<Item = Row<'_>> {
        self.rows.iter().map(|values| Row {
            columns: &self.columns,
            values,
        })
    }
    /// The first row, if any.
    pub fn first(&self) -> Option<Row<'_>> {
        self.iter().next()
    }
    /// The number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// A connection to one of the plugin's databases.
pub trait Db {
    /// Run one statement; the number of rows changed.
    fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, DbError>;
    /// Run several `;`-separated statements without parameters.
    fn execute_batch(&self, sql: &str) -> Result<(), DbError>;
    /// Run one statement and return its rows.
    fn query(&self, sql: &str, params: &[Value]) -> Result<Rows, DbError>;
    /// The rowid of the last successful INSERT.
    fn last_insert_rowid(&self) -> i64;

    /// Run `f` inside `BEGIN IMMEDIATE` … `COMMIT`; roll back if it returns an error.
    fn transaction<T, E: From<DbError>>(
        &self,
        f: impl FnOnce(&Self) -> Result<T, E>,
    ) -> Result<T, E>
    where
        Self: Sized,
    {
        self.execute_batch("BEGIN IMMEDIATE")?;
        match f(self) {
            Ok(v) => match self.execute_batch("COMMIT") {
                Ok(()) => Ok(v),
                Err(e) => {
                    // A failed COMMIT (e.g. busy) leaves the transaction open; close it so the
                    // connection is usable and nothing half-done is kept.
                    let _ = self.execute_batch("ROLLBACK");
                    Err(e.into())
                }
            },
            Err(e) => {
                let _ = self.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }
}

#[cfg(feature = "native")]
mod native {
    use super::{Db, DbError, Rows, Value};
    use rusqlite::types::{Value as SqlValue, ValueRef};

    /// A [`Db`] over an in-process rusqlite connection (native tests).
    pub struct NativeDb {
        conn: rusqlite::Connection,
    }

    impl NativeDb {
        /// A fresh in-memory database.
        pub fn memory() -> Self {
            let conn = rusqlite::Connection::open_in_memory().expect("in-memory sqlite");
            NativeDb { conn }
        }
        /// A database file at `path` (created if absent), in WAL mode.
        pub fn open(path: &std::path::Path) -> Result<Self, DbError> {
            let conn = rusqlite::Connection::open(path).map_err(map_err)?;
            conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA busy_timeout=5000;")
                .map_err(map_err)?;
            Ok(NativeDb { conn })
        }
    }

    fn to_sql(v: &Value) -> SqlValue {
        match v {
            Value::Null => SqlValue::Null,
            Value::Integer(i) => SqlValue::Integer(*i),
            Value::Real(f) => SqlValue::Real(*f),
            Value::Text(s) => SqlValue::Text(s.clone()),
            Value::Blob(b) => SqlValue::Blob(b.clone()),
        }
    }

    fn from_sql(v: ValueRef<'_>) -> Value {
        match v {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(i) => Value::Integer(i),
            ValueRef::Real(f) => Value::Real(f),
            ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
            ValueRef::Blob(b) => Value::Blob(b.to_vec()),
        }
    }

    fn map_err(e: rusqlite::Error) -> DbError {
        use rusqlite::ErrorCode;
        match &e {
            rusqlite::Error::SqliteFailure(f, msg) => {
                let text = msg.clone().unwrap_or_else(|| e.to_string());
                match f.code {
                    ErrorCode::ConstraintViolation => DbError::Constraint(text),
                    ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => DbError::Busy,
                    ErrorCode::CannotOpen
                    | ErrorCode::DiskFull
                    | ErrorCode::ReadOnly
                    | ErrorCode::PermissionDenied
                    | ErrorCode::SystemIoFailure => DbError::Io(text),
                    _ => DbError::InvalidStatement(text),
                }
            }
            _ => DbError::InvalidStatement(e.to_string()),
        }
    }

    impl Db for NativeDb {
        fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
            let params: Vec<SqlValue> = params.iter().map(to_sql).collect();
            let n = self
                .conn
                .execute(sql, rusqlite::params_from_iter(params))
                .map_err(map_err)?;
            Ok(n as u64)
        }
        fn execute_batch(&self, sql: &str) -> Result<(), DbError> {
            self.conn.execute_batch(sql).map_err(map_err)
        }
        fn query(&self, sql: &str, params: &[Value]) -> Result<Rows, DbError> {
            let mut stmt = self.conn.prepare(sql).map_err(map_err)?;
            let columns: Vec<String> = stmt.column_names().map(|c| c.to_string()).collect();
            let params: Vec<SqlValue> = params.iter().map(to_sql).collect();
            let mut rows = stmt
                .query(rusqlite::params_from_iter(params))
                .map_err(map_err)?;
            let mut out = Vec::new();
            while let Some(row) = rows.next().map_err(map_err)? {
                let mut values = Vec::with_capacity(columns.len());
                for i in 0..columns.len() {
                    values.push(from_sql(row.get_ref(i).map_err(map_err)?));
                }
                out.push(values);
            }
            Ok(Rows { columns, rows: out })
        }
        fn last_insert_rowid(&self) -> i64 {
            self.conn.last_insert_rowid()
        }
    }
}

#[cfg(feature = "native")]
pub use native::NativeDb;

#[cfg(all(test, feature = "native"))]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_value_type_and_rolls_back() {
        let db = NativeDb::memory();
        db.execute_batch("CREATE TABLE t (i INTEGER, r REAL, s TEXT, b BLOB, n)")
            .unwrap();
        db.execute(
            "INSERT INTO t VALUES (?1, ?2, ?3, ?4, ?5)",
            &[
                7i64.into(),
                1.5f64.into(),
                "x".into(),
                vec![1u8, 2].into(),
                Value::Null,
            ],
        )
        .unwrap();
        let rows = db.query("SELECT * FROM t", &[]).unwrap();
        let row = rows.first().unwrap();
        assert_eq!(row.i64("i").unwrap(), 7);
        assert_eq!(row.f64("r").unwrap(), 1.5);
        assert_eq!(row.text("s").unwrap(), "x");
        assert_eq!(row.get("b").unwrap().as_blob().unwrap(), &[1, 2]);
        assert!(row.get("n").unwrap().is_null());

        let r: Result<(), DbError> = db.transaction(|db| {
            db.execute("INSERT INTO t (i) VALUES (8)", &[])?;
            Err(DbError::Busy)
        });
        assert_eq!(r, Err(DbError::Busy));
        assert_eq!(db.query("SELECT i FROM t", &[]).unwrap().len(), 1);
    }

    #[test]
    fn constraint_errors_are_values() {
        let db = NativeDb::memory();
        db.execute_batch("CREATE TABLE u (k TEXT PRIMARY KEY)")
            .unwrap();
        db.execute("INSERT INTO u VALUES ('a')", &[]).unwrap();
        let e = db.execute("INSERT INTO u VALUES ('a')", &[]).unwrap_err();
        assert!(matches!(e, DbError::Constraint(_)), "{e:?}");
        let e = db.query("SELECT nope FROM u", &[]).unwrap_err();
        assert!(matches!(e, DbError::InvalidStatement(_)), "{e:?}");
    }
}
