//! Strategies the property tests share: JSON values and bodies an
//! agent might send, bodies damaged on the way, and header values of every shape an
//! upstream or a hostile client might put in a header. Each property test runs a bounded
//! number of cases ([`CASES`]); what proptest finds is kept in `proptest-regressions/`.

use proptest::prelude::*;
use serde_json::{Map, Value};

/// Cases per property: enough to find the shapes these parsers mishandle, quick in the
/// suite.
pub const CASES: u32 = 512;

pub fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        ..ProptestConfig::default()
    }
}

/// Text of any characters (control characters, quotes, backslashes, non-ASCII included).
pub fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-zA-Z0-9_ -]{0,12}",
        1 => prop::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter),
        1 => prop::sample::select(vec![
            "", " ", "\"", "\\", "\u{0}", "\n", "{", "{\"session_id\":\"x\"}", "session_id",
            "user_a_session_b", "_session_",
        ])
        .prop_map(str::to_owned),
    ]
}

/// Object keys: the names the pool reads, their near misses, and anything.
pub fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::sample::select(vec![
            "metadata", "model", "client_metadata", "prompt_cache_key", "user_id",
            "session_id", "thread_id", "parent_session_id", "x-codex-turn-metadata",
            "messages", "Metadata", "model ", "",
        ])
        .prop_map(str::to_owned),
        1 => text(),
    ]
}

/// Any JSON value, a few levels deep.
pub fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A JSON object, written compactly or pretty.
pub fn object_text() -> impl Strategy<Value = String> {
    (prop::collection::vec((key(), json()), 0..6), any::<bool>()).prop_map(|(kv, pretty)| {
        let v = Value::Object(kv.into_iter().collect());
        if pretty {
            serde_json::to_string_pretty(&v).expect("serialisable")
        } else {
            v.to_string()
        }
    })
}

/// What can happen to a body on the way: nothing, cut short, a byte replaced, a byte
/// inserted.
#[derive(Debug, Clone)]
pub enum Damage {
    None,
    Cut(usize),
    Replace(usize, u8),
    Insert(usize, u8),
}

pub fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        2 => Just(Damage::None),
        1 => any::<usize>().prop_map(Damage::Cut),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Damage::Replace(i, b)),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Damage::Insert(i, b)),
    ]
}

pub fn damaged(text: &str, d: &Damage) -> Vec<u8> {
    let mut b = text.as_bytes().to_vec();
    let at = |i: usize, len: usize| if len == 0 { 0 } else { i % (len + 1) };
    match *d {
        Damage::None => {}
        Damage::Cut(i) => b.truncate(at(i, b.len())),
        Damage::Replace(i, byte) if !b.is_empty() => {
            let i = i % b.len();
            b[i] = byte;
        }
        Damage::Replace(..) => {}
        Damage::Insert(i, byte) => {
            let i = at(i, b.len());
            b.insert(i, byte);
        }
    }
    b
}

/// A body: a JSON object, perhaps damaged, or any bytes.
pub fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => (object_text(), damage()).prop_map(|(t, d)| damaged(&t, &d)),
        1 => json().prop_map(|v| v.to_string().into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..48),
    ]
}

/// A header value as an upstream may send one: numbers of every size and sign, floats
/// with exponents, NaN and infinities, HTTP dates and RFC 3339 times, words, garbage.
pub fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| f.to_string()),
        (0u32..100_000).prop_map(|n| format!("{}.{}", n / 100, n % 100)),
        (-400i32..400).prop_map(|e| format!("1e{e}")),
        prop::sample::select(vec![
            "NaN",
            "nan",
            "inf",
            "-inf",
            "infinity",
            "-0",
            "+5",
            " 7 ",
            "",
            "true",
            "TRUE",
            "rejected",
            "allowed",
            "allowed_warning",
            "1e309",
            "-1e309",
            "0x10",
            "18446744073709551616",
            "9223372036854775808",
            "1e12",
            "999999999999",
        ])
        .prop_map(str::to_owned),
        (0u64..4_000_000_000_000).prop_map(|ms| httpdate::fmt_http_date(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)
        )),
        "[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{0,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})?",
        "[ -~]{0,24}",
    ]
}

/// What the current thread allocates, for tests that bound it: the test binary's global
/// allocator counts every allocation against the thread that made it.
pub mod alloc {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    struct Counting;

    thread_local! {
        static LIVE: Cell<usize> = const { Cell::new(0) };
        static PEAK: Cell<usize> = const { Cell::new(0) };
    }

    fn add(n: usize) {
        let _ = LIVE.try_with(|live| {
            let now = live.get() + n;
            live.set(now);
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
        });
    }

    fn sub(n: usize) {
        let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(n)));
    }

    // SAFETY: every call is passed to the system allocator as it came; the counting
    // around it touches only thread-local cells (no allocation).
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, passed on unchanged.
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                add(layout.size());
            }
            p
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, passed on unchanged.
            let p = unsafe { System.alloc_zeroed(layout) };
            if !p.is_null() {
                add(layout.size());
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract, passed on unchanged.
            unsafe { System.dealloc(ptr, layout) };
            sub(layout.size());
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: the caller's contract, passed on unchanged.
            let p = unsafe { System.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                // Counted as both while it moves, as the heap may hold both.
                add(new_size);
                sub(layout.size());
            }
            p
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    /// Run `f`; with its result, the most bytes it held allocated at once (beyond what
    /// was allocated before it ran).
    pub fn peak<T>(f: impl FnOnce() -> T) -> (T, usize) {
        let base = LIVE.with(Cell::get);
        PEAK.with(|p| p.set(base));
        let out = f();
        (out, PEAK.with(Cell::get) - base)
    }
}
