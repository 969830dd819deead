//! Plain-Rust helpers shared by the Pooler plugins.
//!
//! A plugin's logic never touches WIT types. It reads and writes its state through [`Db`],
//! which the component implements over the `pooler:plugins/sqlite` import and native tests
//! implement over rusqlite ([`NativeDb`], feature `native`), so the same SQL runs in both.

pub mod db;
pub mod format;

#[cfg(feature = "native")]
pub use db::NativeDb;
pub use db::{Db, DbError, Row, Rows, Value};
