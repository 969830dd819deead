//! rusqlite's errors as the WIT's `error` values: SQL errors reach the guest as values,
//! never traps. The lowest module of the import: every other one maps its errors here.

use rusqlite::ErrorCode;

use crate::runtime::bindings::pool::pooler::plugins::sqlite::Error;

/// rusqlite's error as the WIT variant.
pub fn map_error(e: rusqlite::Error) -> Error {
    match &e {
        rusqlite::Error::SqliteFailure(failure, message) => {
            let text = message.clone().unwrap_or_else(|| failure.to_string());
            match failure.code {
                ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => Error::Busy,
                ErrorCode::ConstraintViolation => Error::Constraint(text),
                ErrorCode::CannotOpen
                | ErrorCode::ReadOnly
                | ErrorCode::DiskFull
                | ErrorCode::SystemIoFailure
                | ErrorCode::PermissionDenied
                | ErrorCode::DatabaseCorrupt
                | ErrorCode::NotADatabase
                | ErrorCode::OutOfMemory => Error::Io(text),
                _ => Error::InvalidStatement(text),
            }
        }
        _ => Error::InvalidStatement(e.to_string()),
    }
}
