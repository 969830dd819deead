//! The metrics port every plugin's logic reports through: one [`Metrics`] trait, plain Rust.
//! The component implements it over the WIT `metrics` import (`component::WitMetrics`,
//! feature `component`); native tests use [`Recorded`]. The host keeps the values (a plugin
//! instance lives for one call only) and serves them at `GET /metrics`.
//!
//! Names follow the WIT `metrics` rules: `pooler_` and `[a-z0-9_]`, counters end `_total`,
//! histograms `_seconds`; label values are never secrets nor raw session keys. A call that
//! breaks a rule is dropped by the host; reporting never fails.

use std::cell::RefCell;
use std::collections::BTreeMap;

/// Counters and histograms (WIT `metrics`).
pub trait Metrics {
    /// Add `delta` to the counter `name{labels}`.
    fn counter_add(&self, name: &str, labels: &[(&str, &str)], delta: u64);
    /// Observe `seconds` in the histogram `name{labels}`.
    fn observe(&self, name: &str, labels: &[(&str, &str)], seconds: f64);
}

/// Reports nothing (a caller with no host to report to).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMetrics;

impl Metrics for NoMetrics {
    fn counter_add(&self, _: &str, _: &[(&str, &str)], _: u64) {}
    fn observe(&self, _: &str, _: &[(&str, &str)], _: f64) {}
}

/// A series: a name and its labels, sorted by label name.
pub type Series = (String, Vec<(String, String)>);

fn series(name: &str, labels: &[(&str, &str)]) -> Series {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    (name.to_owned(), labels)
}

/// What was reported, kept in memory (native tests).
#[derive(Debug, Default)]
pub struct Recorded {
    counters: RefCell<BTreeMap<Series, u64>>,
    observations: RefCell<Vec<(Series, f64)>>,
}

impl Recorded {
    /// The counter `name{labels}` (labels in any order); 0 when never reported.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.counters
            .borrow()
            .get(&series(name, labels))
            .copied()
            .unwrap_or(0)
    }

    /// The sum of every series of the counter `name`.
    pub fn counter_sum(&self, name: &str) -> u64 {
        self.counters
            .borrow()
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|(_, v)| v)
            .sum()
    }

    /// Every value observed in the histogram `name`, with its labels, in order.
    pub fn observed(&self, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
        self.observations
            .borrow()
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|((_, labels), v)| (labels.clone(), *v))
            .collect()
    }

    /// Every counter series reported, with its value.
    pub fn counters(&self) -> Vec<(Series, u64)> {
        self.counters
            .borrow()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }
}

impl Metrics for Recorded {
    fn counter_add(&self, name: &str, labels: &[(&str, &str)], delta: u64) {
        *self
            .counters
            .borrow_mut()
            .entry(series(name, labels))
            .or_default() += delta;
    }
    fn observe(&self, name: &str, labels: &[(&str, &str)], seconds: f64) {
        self.observations
            .borrow_mut()
            .push((series(name, labels), seconds));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_counters_add_up_per_series_whatever_the_label_order() {
        let m = Recorded::default();
        m.counter_add("pooler_a_total", &[("x", "1"), ("y", "2")], 2);
        m.counter_add("pooler_a_total", &[("y", "2"), ("x", "1")], 3);
        m.counter_add("pooler_a_total", &[("x", "other")], 1);
        m.observe("pooler_b_seconds", &[], 0.5);
        assert_eq!(m.counter("pooler_a_total", &[("x", "1"), ("y", "2")]), 5);
        assert_eq!(m.counter_sum("pooler_a_total"), 6);
        assert_eq!(m.counter("pooler_none_total", &[]), 0);
        assert_eq!(m.observed("pooler_b_seconds"), vec![(vec![], 0.5)]);
    }
}
