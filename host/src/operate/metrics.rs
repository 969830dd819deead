//! The host's metrics registry: counters and histograms kept in memory for the host's life,
//! added to by the host itself and by plugins through the `metrics` import
//! ([`crate::runtime::imports::metrics`]), and written in the Prometheus text exposition format
//! (version 0.0.4) at `GET /metrics` ([`crate::operate::server`]). Gauges are not stored: the host
//! computes them at scrape time (accounts by status) and hands them to [`Registry::render`].
//!
//! The rules every series keeps (the WIT `metrics` interface states them to plugins): names
//! are `pooler_[a-z0-9_]+` (at most [`MAX_NAME_BYTES`]), counters end `_total`, histograms
//! `_seconds`, a name keeps its first kind; at most [`MAX_LABELS`] labels named
//! `[a-z_][a-z0-9_]*` (not `__…`, not `le`), values cut to [`MAX_LABEL_VALUE_BYTES`]; at
//! most [`MAX_SERIES_PER_NAME`] series per name and [`MAX_NAMES`] names. What breaks a
//! rule is refused ([`Refused`]) and changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Mutex;

/// Longest metric name.
pub const MAX_NAME_BYTES: usize = 100;
/// Most labels on one series.
pub const MAX_LABELS: usize = 8;
/// Longest label name.
pub const MAX_LABEL_NAME_BYTES: usize = 50;
/// Longest label value kept; a longer one is cut on a character boundary.
pub const MAX_LABEL_VALUE_BYTES: usize = 128;
/// Most series (label sets) of one name.
pub const MAX_SERIES_PER_NAME: usize = 500;
/// Most metric names in the registry.
pub const MAX_NAMES: usize = 200;
/// Histogram bucket upper bounds, in seconds (and +Inf). They start at half a millisecond
/// because the pool's added latency is a fraction of one on loopback.
pub const BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Why an addition was refused (said once per name in the host's log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metric `{name}` refused: {why}")]
pub struct Refused {
    /// The metric name that was refused.
    pub name: String,
    /// Why, for the log (`more than 8 labels`).
    pub why: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Histogram,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Histogram {
    /// Observations at or under each bound of [`BUCKETS`] (not cumulative here).
    buckets: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

type Labels = Vec<(String, String)>;

#[derive(Debug)]
struct Family {
    kind: Kind,
    help: String,
    counters: BTreeMap<Labels, u64>,
    histograms: BTreeMap<Labels, Histogram>,
}

impl Family {
    fn len(&self) -> usize {
        self.counters.len() + self.histograms.len()
    }
}

/// A gauge computed at scrape time: one name, its help and its series.
#[derive(Debug, Clone, PartialEq)]
pub struct Gauge {
    /// The metric name, as Prometheus shows it.
    pub name: String,
    /// The `# HELP` text.
    pub help: String,
    /// Each series: its label pairs and its value.
    pub series: Vec<(Labels, f64)>,
}

/// The registry. Cheap to share behind an `Arc`; every call takes one short lock.
#[derive(Debug, Default)]
pub struct Registry {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    families: BTreeMap<String, Family>,
    /// Names whose refusal was already logged.
    warned: BTreeSet<String>,
}

fn valid_name(name: &str) -> bool {
    name.len() <= MAX_NAME_BYTES
        && name.strip_prefix("pooler_").is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
}

fn valid_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    name.len() <= MAX_LABEL_NAME_BYTES
        && !name.starts_with("__")
        && name != "le"
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn cut(value: &str) -> String {
    if value.len() <= MAX_LABEL_VALUE_BYTES {
        return value.to_owned();
    }
    let mut end = MAX_LABEL_VALUE_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value[..end].to_owned()
}

/// `labels` checked and put in a canonical order (by name; a name given twice keeps the first).
fn canonical<K: AsRef<str>, V: AsRef<str>>(
    name: &str,
    labels: &[(K, V)],
) -> Result<Labels, Refused> {
    let refuse = |why: String| Refused {
        name: name.to_owned(),
        why,
    };
    let mut out: Labels = Vec::with_capacity(labels.len());
    for (k, v) in labels {
        let k = k.as_ref();
        if !valid_label_name(k) {
            return Err(refuse(format!(
                "label name `{}` is not [a-z_][a-z0-9_]* of at most {MAX_LABEL_NAME_BYTES} bytes (nor `le` or `__…`)",
                cut(k)
            )));
        }
        if out.iter().any(|(n, _)| n == k) {
            continue;
        }
        out.push((k.to_owned(), cut(v.as_ref())));
    }
    if out.len() > MAX_LABELS {
        return Err(refuse(format!("more than {MAX_LABELS} labels")));
    }
    out.sort();
    Ok(out)
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add `delta` to the counter `name{labels}`. `help` describes the name when this call
    /// creates it.
    pub fn counter_add<K: AsRef<str>, V: AsRef<str>>(
        &self,
        name: &str,
        help: &str,
        labels: &[(K, V)],
        delta: u64,
    ) -> Result<(), Refused> {
        let labels = canonical(name, labels)?;
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let family = inner.family(name, help, Kind::Counter)?;
        let len = family.len();
        match family.counters.get_mut(&labels) {
            Some(value) => *value = value.saturating_add(delta),
            None if len >= MAX_SERIES_PER_NAME => return Err(too_many(name)),
            None => {
                family.counters.insert(labels, delta);
            }
        }
        Ok(())
    }

    /// Observe `seconds` in the histogram `name{labels}`.
    pub fn observe<K: AsRef<str>, V: AsRef<str>>(
        &self,
        name: &str,
        help: &str,
        labels: &[(K, V)],
        seconds: f64,
    ) -> Result<(), Refused> {
        if !(seconds >= 0.0 && seconds.is_finite()) {
            return Err(Refused {
                name: name.to_owned(),
                why: "the value is negative, infinite or not a number".to_owned(),
            });
        }
        let labels = canonical(name, labels)?;
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let family = inner.family(name, help, Kind::Histogram)?;
        let len = family.len();
        let h = match family.histograms.get_mut(&labels) {
            Some(h) => h,
            None if len >= MAX_SERIES_PER_NAME => return Err(too_many(name)),
            None => family.histograms.entry(labels).or_default(),
        };
        if let Some(i) = BUCKETS.iter().position(|b| seconds <= *b) {
            h.buckets[i] += 1;
        }
        h.sum += seconds;
        h.count += 1;
        Ok(())
    }

    /// Whether a refusal of `name` should be logged: true the first time only.
    pub fn first_refusal(&self, name: &str) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded like the names themselves, so refusals cannot grow it without end.
        if inner.warned.len() >= MAX_NAMES {
            return false;
        }
        inner.warned.insert(cut(name))
    }

    /// A counter's value (tests and `status`); 0 when the series does not exist.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let Ok(labels) = canonical(name, labels) else {
            return 0;
        };
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .families
            .get(name)
            .and_then(|f| f.counters.get(&labels))
            .copied()
            .unwrap_or(0)
    }

    /// Everything, and `gauges`, in the Prometheus text format: per name a `# HELP` and a
    /// `# TYPE` line, then its series; names in order.
    pub fn render(&self, gauges: &[Gauge]) -> String {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for gauge in gauges {
            header(&mut out, &gauge.name, &gauge.help, "gauge");
            for (labels, value) in &gauge.series {
                sample(&mut out, &gauge.name, labels, None, &number(*value));
            }
        }
        for (name, family) in &inner.families {
            header(&mut out, name, &family.help, family.kind.word());
            for (labels, value) in &family.counters {
                sample(&mut out, name, labels, None, &value.to_string());
            }
            for (labels, h) in &family.histograms {
                let bucket = format!("{name}_bucket");
                let mut cumulative = 0;
                for (bound, n) in BUCKETS.iter().zip(h.buckets) {
                    cumulative += n;
                    sample(
                        &mut out,
                        &bucket,
                        labels,
                        Some(&number(*bound)),
                        &cumulative.to_string(),
                    );
                }
                sample(
                    &mut out,
                    &bucket,
                    labels,
                    Some("+Inf"),
                    &h.count.to_string(),
                );
                sample(
                    &mut out,
                    &format!("{name}_sum"),
                    labels,
                    None,
                    &number(h.sum),
                );
                sample(
                    &mut out,
                    &format!("{name}_count"),
                    labels,
                    None,
                    &h.count.to_string(),
                );
            }
        }
        out
    }
}

impl Inner {
    fn family(&mut self, name: &str, help: &str, kind: Kind) -> Result<&mut Family, Refused> {
        let refuse = |why: String| Refused {
            name: cut(name),
            why,
        };
        if !valid_name(name) {
            return Err(refuse(format!(
                "a name is `pooler_` and [a-z0-9_], at most {MAX_NAME_BYTES} bytes"
            )));
        }
        let suffix = match kind {
            Kind::Counter => "_total",
            Kind::Histogram => "_seconds",
        };
        if !name.ends_with(suffix) {
            return Err(refuse(format!("a {}'s name ends `{suffix}`", kind.word())));
        }
        if !self.families.contains_key(name) && self.families.len() >= MAX_NAMES {
            return Err(refuse(format!(
                "the registry holds {MAX_NAMES} names already"
            )));
        }
        let family = self
            .families
            .entry(name.to_owned())
            .or_insert_with(|| Family {
                kind,
                help: help.to_owned(),
                counters: BTreeMap::new(),
                histograms: BTreeMap::new(),
            });
        if family.kind != kind {
            return Err(refuse(format!("it is a {}", family.kind.word())));
        }
        Ok(family)
    }
}

fn too_many(name: &str) -> Refused {
    Refused {
        name: name.to_owned(),
        why: format!("it has {MAX_SERIES_PER_NAME} series already"),
    }
}

/// A sample value: integers without a fraction, `+Inf`, `NaN`.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v}")
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value escaped for the text format: `\`, `"` and newline.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn sample(out: &mut String, name: &str, labels: &Labels, le: Option<&str>, value: &str) {
    out.push_str(name);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        let mut first = true;
        for (k, v) in labels {
            if !first {
                out.push(',');
            }
            first = false;
            let _ = write!(out, "{k}=\"{}\"", escape(v));
        }
        if let Some(le) = le {
            if !first {
                out.push(',');
            }
            let _ = write!(out, "le=\"{le}\"");
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(value);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_with_help_type_and_sorted_labels() {
        let r = Registry::new();
        r.counter_add(
            "pooler_pool_requests_total",
            "Requests.",
            &[("provider", "claude"), ("account", "a1")],
            2,
        )
        .unwrap();
        r.counter_add(
            "pooler_pool_requests_total",
            "ignored once created",
            &[("account", "a1"), ("provider", "claude")],
            3,
        )
        .unwrap();
        r.counter_add::<&str, &str>("pooler_core_dispatches_total", "Dispatches.", &[], 0)
            .unwrap();
        let text = r.render(&[]);
        assert_eq!(
            text,
            "# HELP pooler_core_dispatches_total Dispatches.\n\
             # TYPE pooler_core_dispatches_total counter\n\
             pooler_core_dispatches_total 0\n\
             # HELP pooler_pool_requests_total Requests.\n\
             # TYPE pooler_pool_requests_total counter\n\
             pooler_pool_requests_total{account=\"a1\",provider=\"claude\"} 5\n"
        );
        assert_eq!(
            r.counter(
                "pooler_pool_requests_total",
                &[("provider", "claude"), ("account", "a1")]
            ),
            5
        );
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let r = Registry::new();
        r.counter_add(
            "pooler_x_total",
            "a \\ help\nline",
            &[("v", "q\"b\\s\nn")],
            1,
        )
        .unwrap();
        let text = r.render(&[]);
        assert!(
            text.contains("# HELP pooler_x_total a \\\\ help\\nline\n"),
            "{text}"
        );
        assert!(
            text.contains("pooler_x_total{v=\"q\\\"b\\\\s\\nn\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn histograms_have_cumulative_buckets_sum_and_count() {
        let r = Registry::new();
        for v in [0.003, 0.2, 0.2, 100.0] {
            r.observe(
                "pooler_added_seconds",
                "Added.",
                &[("provider", "codex")],
                v,
            )
            .unwrap();
        }
        let text = r.render(&[]);
        assert!(
            text.contains("# TYPE pooler_added_seconds histogram\n"),
            "{text}"
        );
        let l = "provider=\"codex\"";
        for (le, n) in [
            ("0.0025", 0),
            ("0.005", 1),
            ("0.1", 1),
            ("0.25", 3),
            ("60", 3),
            ("+Inf", 4),
        ] {
            let line = format!("pooler_added_seconds_bucket{{{l},le=\"{le}\"}} {n}\n");
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(
            text.contains(&format!("pooler_added_seconds_sum{{{l}}} 100.403\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("pooler_added_seconds_count{{{l}}} 4\n")),
            "{text}"
        );
        assert!(
            r.observe::<&str, &str>("pooler_added_seconds", "", &[], -1.0)
                .is_err()
        );
        assert!(
            r.observe::<&str, &str>("pooler_added_seconds", "", &[], f64::NAN)
                .is_err()
        );
    }

    #[test]
    fn gauges_come_first_with_their_own_type() {
        let r = Registry::new();
        let text = r.render(&[Gauge {
            name: "pooler_accounts".into(),
            help: "Accounts by status.".into(),
            series: vec![(vec![("status".into(), "ready".into())], 2.0)],
        }]);
        assert_eq!(
            text,
            "# HELP pooler_accounts Accounts by status.\n# TYPE pooler_accounts gauge\n\
             pooler_accounts{status=\"ready\"} 2\n"
        );
    }

    #[test]
    fn names_labels_and_kinds_are_checked() {
        let r = Registry::new();
        let none: &[(&str, &str)] = &[];
        for bad in [
            "requests_total",
            "pooler_",
            "pooler_A_total",
            "pooler_x-y_total",
        ] {
            assert!(r.counter_add(bad, "", none, 1).is_err(), "{bad}");
        }
        assert!(r.counter_add("pooler_x_seconds", "", none, 1).is_err());
        assert!(r.observe("pooler_x_total", "", none, 1.0).is_err());
        r.counter_add("pooler_x_total", "", none, 1).unwrap();
        for bad in ["le", "__x", "Upper", "9a", "a-b"] {
            assert!(
                r.counter_add("pooler_x_total", "", &[(bad, "v")], 1)
                    .is_err(),
                "{bad}"
            );
        }
        let nine: Vec<(String, String)> = (0..9).map(|i| (format!("l{i}"), "v".into())).collect();
        assert!(r.counter_add("pooler_x_total", "", &nine, 1).is_err());
        // Long values are cut, not refused.
        let long = "é".repeat(100);
        r.counter_add("pooler_x_total", "", &[("v", long.as_str())], 1)
            .unwrap();
        let kept = r.render(&[]);
        let line = kept.lines().find(|l| l.contains("v=\"")).unwrap();
        assert_eq!(
            line,
            format!("pooler_x_total{{v=\"{}\"}} 1", "é".repeat(64))
        );
    }

    #[test]
    fn series_past_the_cap_are_dropped_and_existing_ones_still_count() {
        let r = Registry::new();
        for i in 0..MAX_SERIES_PER_NAME {
            r.counter_add("pooler_c_total", "", &[("i", i.to_string())], 1)
                .unwrap();
        }
        let err = r
            .counter_add("pooler_c_total", "", &[("i", "new")], 1)
            .unwrap_err();
        assert!(err.to_string().contains("500 series"), "{err}");
        r.counter_add("pooler_c_total", "", &[("i", "0")], 1)
            .unwrap();
        assert_eq!(r.counter("pooler_c_total", &[("i", "0")]), 2);
        assert_eq!(r.counter("pooler_c_total", &[("i", "new")]), 0);
        assert!(r.first_refusal("pooler_c_total"));
        assert!(!r.first_refusal("pooler_c_total"));
    }
}
