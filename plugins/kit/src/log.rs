//! The log port every plugin's logic writes through: one [`Level`] and one [`Log`] trait,
//! plain Rust. The component implements it over the WIT `log` import
//! (`component::WitLog`, feature `component`); native tests implement it with a
//! capture.

/// Log severity (the WIT `log.level`s a plugin uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
}

/// Structured log lines (WIT `log`). Callers never pass a secret.
pub trait Log {
    fn log(&self, level: Level, message: &str, fields: &[(&str, String)]);
}
