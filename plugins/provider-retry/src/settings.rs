//! The plugin's settings: every duration and the attempt cap, their defaults, validation and
//! storage (table `settings` of the plugin database), in the shape of the WIT `settings`
//! interface (key, value, default, description).
//!
//! Values are stored in their canonical text, so a person reading the database or
//! `pooler config get` sees the same words. A stored value that no longer parses (hand-edited
//! database) falls back to the default rather than stopping the plugin.

use pooler_plugin_kit::Db;
use pooler_plugin_kit::format::{format_duration_ms, parse_duration_ms};

use crate::store;

/// The settings in force for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Dispatches allowed per chain; a failure of attempt ≥ cap is final.
    pub attempt_cap: u32,
    /// Longest automatic wait counted from the chain's first failure (T0); None = no limit.
    pub maximum_wait_ms: Option<u64>,
    /// Added to every reset time, so the retry lands after the window really reopened.
    pub reset_buffer_ms: u64,
    /// Upper bound (exclusive) of the random spread added to reset-based send times.
    pub reset_jitter_ms: u64,
    /// Backoff of the first retry of a temporary failure; doubles per attempt.
    pub backoff_base_ms: u64,
    /// How often open candidates are re-evaluated without a signal.
    pub reevaluation_interval_ms: u64,
    /// Longest wait for the pool's availability answer.
    pub availability_timeout_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            attempt_cap: 5,
            maximum_wait_ms: Some(6 * HOUR),
            reset_buffer_ms: 15 * SECOND,
            reset_jitter_ms: 30 * SECOND,
            backoff_base_ms: 5 * SECOND,
            reevaluation_interval_ms: 5 * MINUTE,
            availability_timeout_ms: 5 * SECOND,
        }
    }
}

const SECOND: u64 = 1_000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;

/// One setting as a person sees it: the kit's, which every plugin and the admin API share.
pub use pooler_plugin_kit::settings::Setting;

/// Why a setting was refused (WIT `settings-error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingsError {
    UnknownKey(String),
    InvalidValue {
        key: String,
        value: String,
        accepted: String,
    },
    Storage(String),
}

impl From<pooler_plugin_kit::DbError> for SettingsError {
    fn from(e: pooler_plugin_kit::DbError) -> Self {
        SettingsError::Storage(e.to_string())
    }
}

/// How one key is written, read and checked.
struct Spec {
    key: &'static str,
    description: &'static str,
    accepted: &'static str,
    parse: fn(&str) -> Option<Value>,
    get: fn(&Settings) -> Value,
    set: fn(&mut Settings, Value),
}

/// A parsed setting value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    Count(u32),
    Duration(u64),
    /// A duration that may be "none" (no limit).
    Limit(Option<u64>),
}

impl Value {
    fn text(self) -> String {
        match self {
            Value::Count(n) => n.to_string(),
            Value::Duration(ms) | Value::Limit(Some(ms)) => format_duration_ms(ms),
            Value::Limit(None) => "none".to_owned(),
        }
    }
}

fn duration_in(s: &str, min: u64, max: u64) -> Option<Value> {
    parse_duration_ms(s)
        .filter(|ms| (min..=max).contains(ms))
        .map(Value::Duration)
}

const SPECS: [Spec; 7] = [
    Spec {
        key: "attempt-cap",
        description: "Dispatches per failed turn, the original included; a failure of the last \
                      one is final (attempts-exhausted).",
        accepted: "a whole number from 1 to 20",
        parse: |s| {
            s.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=20).contains(n))
                .map(Value::Count)
        },
        get: |s| Value::Count(s.attempt_cap),
        set: |s, v| {
            if let Value::Count(n) = v {
                s.attempt_cap = n;
            }
        },
    },
    Spec {
        key: "availability-timeout",
        description: "Longest wait for the pool's availability answer; a slower or failed \
                      answer counts as source-unavailable. The host also bounds it at 5s.",
        accepted: "a duration from 100ms to 60s",
        parse: |s| duration_in(s, 100, MINUTE),
        get: |s| Value::Duration(s.availability_timeout_ms),
        set: |s, v| {
            if let Value::Duration(ms) = v {
                s.availability_timeout_ms = ms;
            }
        },
    },
    Spec {
        key: "backoff-base",
        description: "Delay before the first retry of a temporary failure (overload, 5xx, \
                      dropped connection); attempt n waits base × 2^(n−1) plus a random part \
                      of the same size.",
        accepted: "a duration from 1ms to 1h",
        parse: |s| duration_in(s, 1, HOUR),
        get: |s| Value::Duration(s.backoff_base_ms),
        set: |s, v| {
            if let Value::Duration(ms) = v {
                s.backoff_base_ms = ms;
            }
        },
    },
    Spec {
        key: "maximum-wait",
        description: "Longest automatic wait, counted from the chain's first failure; a \
                      retry that would wait longer is not scheduled. `6h`, `24h` or `none` \
                      (no limit).",
        accepted: "`none` or a duration of at least 1m",
        parse: |s| {
            if s.trim().eq_ignore_ascii_case("none") {
                return Some(Value::Limit(None));
            }
            parse_duration_ms(s)
                .filter(|ms| *ms >= MINUTE)
                .map(|ms| Value::Limit(Some(ms)))
        },
        get: |s| Value::Limit(s.maximum_wait_ms),
        set: |s, v| {
            if let Value::Limit(l) = v {
                s.maximum_wait_ms = l;
            }
        },
    },
    Spec {
        key: "reevaluation-interval",
        description: "How often open retries are re-checked against the pool when no \
                      availability signal arrives; a missed signal delays recovery by at most \
                      this long.",
        accepted: "a duration from 1s to 1d",
        parse: |s| duration_in(s, SECOND, 24 * HOUR),
        get: |s| Value::Duration(s.reevaluation_interval_ms),
        set: |s, v| {
            if let Value::Duration(ms) = v {
                s.reevaluation_interval_ms = ms;
            }
        },
    },
    Spec {
        key: "reset-buffer",
        description: "Added to a reset time before a rate-limited retry is sent.",
        accepted: "a duration from 0s to 1h",
        parse: |s| duration_in(s, 0, HOUR),
        get: |s| Value::Duration(s.reset_buffer_ms),
        set: |s, v| {
            if let Value::Duration(ms) = v {
                s.reset_buffer_ms = ms;
            }
        },
    },
    Spec {
        key: "reset-jitter",
        description: "Upper bound of the random spread added to a rate-limited retry's send \
                      time, so retries released together do not arrive at once (0 = none).",
        accepted: "a duration from 0s to 1h",
        parse: |s| duration_in(s, 0, HOUR),
        get: |s| Value::Duration(s.reset_jitter_ms),
        set: |s, v| {
            if let Value::Duration(ms) = v {
                s.reset_jitter_ms = ms;
            }
        },
    },
];

fn spec(key: &str) -> Result<&'static Spec, SettingsError> {
    SPECS
        .iter()
        .find(|s| s.key == key)
        .ok_or_else(|| SettingsError::UnknownKey(key.to_owned()))
}

fn view(spec: &Spec, current: &Settings) -> Setting {
    Setting {
        key: spec.key.to_owned(),
        value: (spec.get)(current).text(),
        default_value: (spec.get)(&Settings::default()).text(),
        description: spec.description.to_owned(),
    }
}

impl Settings {
    /// The settings stored in `db`, defaults for keys never set.
    pub fn load(db: &impl Db) -> Result<Settings, pooler_plugin_kit::DbError> {
        let mut settings = Settings::default();
        for (key, text) in store::load_settings(db)? {
            if let Ok(spec) = spec(&key)
                && let Some(v) = (spec.parse)(&text)
            {
                (spec.set)(&mut settings, v);
            }
        }
        Ok(settings)
    }

    /// All settings, sorted by key.
    pub fn list(db: &impl Db) -> Result<Vec<Setting>, SettingsError> {
        let current = Settings::load(db)?;
        Ok(SPECS.iter().map(|s| view(s, &current)).collect())
    }

    /// One setting.
    pub fn get(db: &impl Db, key: &str) -> Result<Setting, SettingsError> {
        let spec = spec(key)?;
        Ok(view(spec, &Settings::load(db)?))
    }

    /// Validate and store one setting; returns it as stored (canonical text).
    pub fn set(db: &impl Db, key: &str, value: &str) -> Result<Setting, SettingsError> {
        let spec = spec(key)?;
        let parsed = (spec.parse)(value).ok_or_else(|| SettingsError::InvalidValue {
            key: key.to_owned(),
            value: value.to_owned(),
            accepted: spec.accepted.to_owned(),
        })?;
        store::save_setting(db, key, &parsed.text())?;
        Self::get(db, key)
    }

    /// T0 + maximum wait: the instant after which nothing is sent automatically.
    pub fn expiry(&self, chain_started_at: u64) -> Option<u64> {
        self.maximum_wait_ms
            .map(|w| pooler_plugin_kit::time::after(chain_started_at, w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pooler_plugin_kit::NativeDb;

    fn db() -> NativeDb {
        let db = NativeDb::memory();
        store::migrate(&db).unwrap();
        db
    }

    #[test]
    fn defaults_match_the_spec() {
        let s = Settings::default();
        assert_eq!(s.attempt_cap, 5);
        assert_eq!(s.maximum_wait_ms, Some(21_600_000));
        assert_eq!(s.reset_buffer_ms, 15_000);
        assert_eq!(s.reset_jitter_ms, 30_000);
        assert_eq!(s.backoff_base_ms, 5_000);
        assert_eq!(s.reevaluation_interval_ms, 300_000);
        assert_eq!(s.availability_timeout_ms, 5_000);
    }

    #[test]
    fn list_is_sorted_by_key_and_shows_defaults_in_canonical_form() {
        let db = db();
        let all = Settings::list(&db).unwrap();
        let keys: Vec<_> = all.iter().map(|s| s.key.as_str()).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        let wait = all.iter().find(|s| s.key == "maximum-wait").unwrap();
        assert_eq!(
            (wait.value.as_str(), wait.default_value.as_str()),
            ("6h", "6h")
        );
        assert!(all.iter().all(|s| !s.description.is_empty()));
    }

    #[test]
    fn set_stores_canonical_text_and_load_reads_it_back() {
        let db = db();
        // The canonical form is the largest whole unit.
        assert_eq!(
            Settings::set(&db, "maximum-wait", "24h").unwrap().value,
            "1d"
        );
        assert_eq!(
            Settings::set(&db, "maximum-wait", "NONE").unwrap().value,
            "none"
        );
        assert_eq!(Settings::set(&db, "reset-jitter", "0").unwrap().value, "0s");
        assert_eq!(
            Settings::set(&db, "reevaluation-interval", "90000")
                .unwrap()
                .value,
            "90s"
        );
        assert_eq!(Settings::set(&db, "attempt-cap", "3").unwrap().value, "3");
        let s = Settings::load(&db).unwrap();
        assert_eq!(s.maximum_wait_ms, None);
        assert_eq!(s.reset_jitter_ms, 0);
        assert_eq!(s.reevaluation_interval_ms, 90_000);
        assert_eq!(s.attempt_cap, 3);
    }

    #[test]
    fn invalid_values_are_refused_naming_key_and_range() {
        let db = db();
        for (key, bad) in [
            ("attempt-cap", "0"),
            ("attempt-cap", "21"),
            ("attempt-cap", "many"),
            ("maximum-wait", "30s"),
            ("maximum-wait", "forever"),
            ("reevaluation-interval", "500ms"),
            ("reset-buffer", "2h"),
            ("backoff-base", "0"),
            ("availability-timeout", "10ms"),
        ] {
            match Settings::set(&db, key, bad) {
                Err(SettingsError::InvalidValue {
                    key: k,
                    value,
                    accepted,
                }) => {
                    assert_eq!((k.as_str(), value.as_str()), (key, bad));
                    assert!(!accepted.is_empty());
                }
                other => panic!("{key}={bad}: {other:?}"),
            }
        }
        assert_eq!(Settings::load(&db).unwrap(), Settings::default());
    }

    #[test]
    fn unknown_keys_are_refused() {
        let db = db();
        assert_eq!(
            Settings::set(&db, "max-wait", "6h"),
            Err(SettingsError::UnknownKey("max-wait".into()))
        );
        assert_eq!(
            Settings::get(&db, "nope"),
            Err(SettingsError::UnknownKey("nope".into()))
        );
    }

    #[test]
    fn a_hand_edited_unparsable_value_falls_back_to_the_default() {
        let db = db();
        store::save_setting(&db, "reset-buffer", "soon").unwrap();
        assert_eq!(Settings::load(&db).unwrap().reset_buffer_ms, 15_000);
    }
}
