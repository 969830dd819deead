//! Reading a few top-level members of a large JSON object without building the rest.
//!
//! An agent's request body is tens to hundreds of KiB, nearly all of it one or two long
//! strings (the conversation), and the pool needs four small members of it. serde_json
//! checks a skipped string four bytes at a time on wasm32 (its word is 32 bits there): a
//! 300 KiB body cost ~1 ms of the pool's guest per request. [`members`] accepts and rejects
//! exactly what serde_json's `from_slice` does when it skips a value (the same grammar:
//! escapes checked, control characters refused, strings not checked for UTF-8, no depth
//! limit) and hands the members it keeps to serde_json, but finds the end of a string 16
//! bytes at a time with wasm SIMD (8 with a 64-bit word natively).

use serde_json::{Map, Value};

/// The members of a JSON object body named in `keep` (the last of a repeated key, as a
/// full parse keeps), as an object. `Ok(None)` when the body is JSON but not an object;
/// `Err(())` when it is not JSON.
#[allow(clippy::result_unit_err)]
pub fn members(body: &[u8], keep: &[&str]) -> Result<Option<Map<String, Value>>, ()> {
    let mut s = Skim { b: body, i: 0 };
    s.ws();
    if s.peek() != Some(b'{') {
        return Ok(None);
    }
    s.i += 1;
    let mut kept = Map::new();
    s.ws();
    if s.peek() == Some(b'}') {
        s.i += 1;
    } else {
        loop {
            let key = s.member_name()?;
            let value_start = s.i;
            s.value()?;
            let name = key_text(key)?;
            if keep.contains(&name.as_str()) {
                let value = serde_json::from_slice(&body[value_start..s.i]).map_err(|_| ())?;
                kept.insert(name, value);
            }
            s.ws();
            match s.peek() {
                Some(b',') => {
                    s.i += 1;
                    s.ws();
                }
                Some(b'}') => {
                    s.i += 1;
                    break;
                }
                _ => return Err(()),
            }
        }
    }
    s.ws();
    if s.i != body.len() {
        return Err(());
    }
    Ok(Some(kept))
}

/// An object key (its quotes included) as text: escapes decoded and UTF-8 checked, as
/// serde_json reads a key.
fn key_text(quoted: &[u8]) -> Result<String, ()> {
    let inner = &quoted[1..quoted.len() - 1];
    if inner.contains(&b'\\') {
        serde_json::from_slice(quoted).map_err(|_| ())
    } else {
        std::str::from_utf8(inner)
            .map(str::to_owned)
            .map_err(|_| ())
    }
}

struct Skim<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Skim<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn eat(&mut self, literal: &[u8]) -> Result<(), ()> {
        if self.b[self.i..].starts_with(literal) {
            self.i += literal.len();
            Ok(())
        } else {
            Err(())
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        self.i - start
    }

    /// After an optional `-`: `0` or a non-zero digit and more, then an optional fraction
    /// and exponent, each with at least one digit.
    fn number(&mut self) -> Result<(), ()> {
        match self.peek() {
            Some(b'0') => {
                self.i += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(());
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(()),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(());
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(());
            }
        }
        Ok(())
    }

    /// The rest of a string after its opening quote, through its closing quote.
    fn string(&mut self) -> Result<(), ()> {
        self.i = string_end(self.b, self.i)?;
        Ok(())
    }

    /// One value (whitespace before it already skipped), arrays and objects iteratively.
    fn value(&mut self) -> Result<(), ()> {
        // The open arrays (`[`) and objects (`{`), innermost last.
        let mut open: Vec<u8> = Vec::new();
        loop {
            // A value starts here.
            match self.peek().ok_or(())? {
                b'n' => self.eat(b"null")?,
                b't' => self.eat(b"true")?,
                b'f' => self.eat(b"false")?,
                b'-' => {
                    self.i += 1;
                    self.number()?;
                }
                b'0'..=b'9' => self.number()?,
                b'"' => {
                    self.i += 1;
                    self.string()?;
                }
                b'[' => {
                    self.i += 1;
                    self.ws();
                    if self.peek() == Some(b']') {
                        self.i += 1;
                    } else {
                        open.push(b'[');
                        continue;
                    }
                }
                b'{' => {
                    self.i += 1;
                    self.ws();
                    if self.peek() == Some(b'}') {
                        self.i += 1;
                    } else {
                        open.push(b'{');
                        self.member_name()?;
                        continue;
                    }
                }
                _ => return Err(()),
            }
            // A value ended: close what ends here, or go on to the next element or member.
            loop {
                let Some(&frame) = open.last() else {
                    return Ok(());
                };
                self.ws();
                match (self.peek(), frame) {
                    (Some(b','), _) => {
                        self.i += 1;
                        self.ws();
                        if frame == b'{' {
                            self.member_name()?;
                        }
                        break;
                    }
                    (Some(b']'), b'[') | (Some(b'}'), b'{') => {
                        self.i += 1;
                        open.pop();
                    }
                    _ => return Err(()),
                }
            }
        }
    }

    /// A member's `"name"` and `:`, and the whitespace before its value; the name as
    /// written, quotes included.
    fn member_name(&mut self) -> Result<&'a [u8], ()> {
        if self.peek() != Some(b'"') {
            return Err(());
        }
        let start = self.i;
        self.i += 1;
        self.string()?;
        let name = &self.b[start..self.i];
        self.ws();
        if self.peek() != Some(b':') {
            return Err(());
        }
        self.i += 1;
        self.ws();
        Ok(name)
    }
}

/// Past the closing quote of the string whose contents start at `i`: escapes checked,
/// control characters refused.
fn string_end(b: &[u8], i: usize) -> Result<usize, ()> {
    #[cfg(target_arch = "wasm32")]
    {
        // SAFETY: SIMD is part of WebAssembly 2.0, which every component-model host runs;
        // a module using it fails to load, not to run, where it is missing.
        unsafe { simd_string_end(b, i) }
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let mut i = i;
        loop {
            i = word_run_end(b, i);
            match b.get(i) {
                Some(b'"') => return Ok(i + 1),
                Some(b'\\') => i = escape_end(b, i + 1)?,
                _ => return Err(()),
            }
        }
    }
}

/// Past the escape whose letter is at `i` (after its backslash).
#[inline(always)]
fn escape_end(b: &[u8], i: usize) -> Result<usize, ()> {
    match b.get(i) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 1),
        Some(b'u') => match b.get(i + 1..i + 5) {
            Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => Ok(i + 5),
            _ => Err(()),
        },
        _ => Err(()),
    }
}

/// Whether `c` ends a run of plain string bytes: a quote, a backslash or a control
/// character.
#[inline(always)]
fn is_stop(c: u8) -> bool {
    c == b'"' || c == b'\\' || c < 0x20
}

/// The algorithm of [`simd_string_end`], written once for its two users: `$b` the bytes,
/// `$i` the index (a `mut` variable), and `|$at| $mask` the stop mask of the 16 bytes at
/// `$at` (bit k set when byte `$at + k` is a quote, a backslash or below 0x20). The
/// wasm32 function computes the mask with simd128; a native test computes it lane by
/// lane, so the block stepping, the tail and the escapes run natively too (the SIMD path
/// otherwise runs only in the component). A macro, not a function taking a closure, so
/// the vector code stays inline in the `target_feature` function.
#[cfg(any(target_arch = "wasm32", test))]
macro_rules! blocked_string_end {
    ($b:ident, $i:ident, |$at:ident| $mask:expr) => {
        loop {
            // The first stop byte at or after `i`, or the end.
            loop {
                if $i + 16 <= $b.len() {
                    let $at = $i;
                    let mask: u32 = $mask;
                    if mask != 0 {
                        $i += mask.trailing_zeros() as usize;
                        break;
                    }
                    $i += 16;
                } else {
                    while $i < $b.len() && !is_stop($b[$i]) {
                        $i += 1;
                    }
                    break;
                }
            }
            match $b.get($i) {
                Some(b'"') => return Ok($i + 1),
                Some(b'\\') => $i = escape_end($b, $i + 1)?,
                _ => return Err(()),
            }
        }
    };
}

/// [`string_end`] with each run of plain bytes stepped over 16 at a time; one function, so
/// the vector code stays inline around every stop.
#[cfg(target_arch = "wasm32")]
#[target_feature(enable = "simd128")]
unsafe fn simd_string_end(b: &[u8], mut i: usize) -> Result<usize, ()> {
    use core::arch::wasm32::*;
    let quote = u8x16_splat(b'"');
    let backslash = u8x16_splat(b'\\');
    let space = u8x16_splat(0x20);
    blocked_string_end!(b, i, |at| {
        // SAFETY: `at + 16 <= b.len()`; v128.load needs no alignment.
        let v = unsafe { v128_load(b.as_ptr().add(at).cast::<v128>()) };
        let stop = v128_or(
            v128_or(u8x16_eq(v, quote), u8x16_eq(v, backslash)),
            u8x16_lt(v, space),
        );
        u32::from(u8x16_bitmask(stop))
    })
}

/// [`simd_string_end`]'s algorithm natively, its 16-lane mask computed lane by lane as
/// simd128 does (`u8x16_eq` with a quote, with a backslash, unsigned `u8x16_lt` 0x20).
#[cfg(all(test, not(target_arch = "wasm32")))]
fn emulated_simd_string_end(b: &[u8], mut i: usize) -> Result<usize, ()> {
    blocked_string_end!(b, i, |at| {
        b[at..at + 16]
            .iter()
            .enumerate()
            .filter(|&(_, &c)| c == b'"' || c == b'\\' || c < 0x20)
            .fold(0u32, |m, (k, _)| m | (1 << k))
    })
}

/// The first stop byte at or after `i` (or `b.len()`), stepping over whole 8-byte words
/// with none (the classic "has a zero byte" and "has a byte below n" word tricks).
#[cfg(not(target_arch = "wasm32"))]
fn word_run_end(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    while let Some(word) = b.get(i..i + 8) {
        let v = u64::from_ne_bytes(word.try_into().expect("8 bytes"));
        let stop = has_zero(v ^ (ONES * u64::from(b'"')))
            | has_zero(v ^ (ONES * u64::from(b'\\')))
            | (v.wrapping_sub(ONES * 0x20) & !v & HIGHS);
        if stop != 0 {
            break;
        }
        i += 8;
    }
    b[i..]
        .iter()
        .position(|&c| is_stop(c))
        .map_or(b.len(), |n| i + n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEEP: [&str; 2] = ["metadata", "model"];

    /// serde_json skipping every member but [`KEEP`] with `IgnoredAny`, as the pool did:
    /// the reference [`members`] must agree with.
    fn skipping_reference(body: &[u8]) -> Result<Option<Map<String, Value>>, ()> {
        use serde::de::{Deserializer as _, IgnoredAny, MapAccess, Visitor};
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = Option<Map<String, Value>>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut kept = Map::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if KEEP.contains(&key.as_ref()) {
                        kept.insert(key.into_owned(), map.next_value::<Value>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Some(kept))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(None)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
        }
        let mut de = serde_json::Deserializer::from_slice(body);
        let value = (&mut de).deserialize_any(Fields).map_err(|_| ())?;
        de.end().map_err(|_| ())?;
        Ok(value)
    }

    fn agree(body: &[u8]) {
        let ours = members(body, &KEEP);
        let theirs = skipping_reference(body);
        // Top-level non-objects are the caller's to parse; only objects must agree.
        if ours.as_ref().is_ok_and(Option::is_none) {
            return;
        }
        assert_eq!(ours, theirs, "body: {:?}", String::from_utf8_lossy(body));
    }

    #[test]
    fn keeps_the_named_members_and_skips_the_rest() {
        let body =
            br#" { "messages": [{"role":"user","content":"a \"quoted\" \\ line\nand \u00e9"}],
            "model" : "claude-sonnet-4-5", "metadata": {"user_id": "{\"session_id\":\"s1\"}"},
            "n": -0.5e+3, "t": true, "f": false, "z": null, "e": {}, "a": [] } "#;
        let kept = members(body, &KEEP).unwrap().unwrap();
        assert_eq!(kept.len(), 2);
        assert_eq!(kept["model"], "claude-sonnet-4-5");
        assert_eq!(kept["metadata"]["user_id"], r#"{"session_id":"s1"}"#);
        assert_eq!(Ok(Some(kept)), skipping_reference(body));
    }

    #[test]
    fn the_last_of_a_repeated_key_wins_and_escaped_keys_are_read_as_text() {
        let body = br#"{"model":"a","m\u006fdel":"b"}"#;
        assert_eq!(members(body, &KEEP).unwrap().unwrap()["model"], "b");
        agree(body);
    }

    #[test]
    fn a_non_object_body_is_left_to_the_caller() {
        for body in [&b"[1,2]"[..], b"\"x\"", b"12", b"null", b"", b"  "] {
            assert_eq!(members(body, &KEEP), Ok(None), "{body:?}");
        }
    }

    /// Every way a body can fail, each at a place only the skipping would see, agreeing
    /// with serde_json; and what serde_json accepts there too.
    #[test]
    fn accepts_and_refuses_exactly_what_serde_json_does() {
        let long = "x".repeat(100);
        let cases: Vec<String> = [
            r#"{"a":"ok"}"#,
            r#"{"a":"ctl	tab"}"#,
            "{\"a\":\"ctl\u{1}\"}",
            r#"{"a":"bad \q escape"}"#,
            r#"{"a":"\u12"}"#,
            r#"{"a":"\u12g4"}"#,
            r#"{"a":"\uD800"}"#,
            r#"{"a":"unterminated}"#,
            r#"{"a":01}"#,
            r#"{"a":-}"#,
            r#"{"a":1.}"#,
            r#"{"a":1.5e}"#,
            r#"{"a":1e+}"#,
            r#"{"a":-0}"#,
            r#"{"a":2E-7}"#,
            r#"{"a":nul}"#,
            r#"{"a":truex}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":[1 2]}"#,
            r#"{"a":{"b":1,}}"#,
            r#"{"a":{"b" 1}}"#,
            r#"{"a":{1:2}}"#,
            r#"{"a":[}"#,
            r#"{"a":{]}"#,
            r#"{"a":1,}"#,
            r#"{"a":1 "b":2}"#,
            r#"{"a" 1}"#,
            r#"{a:1}"#,
            r#"{"a":1}}"#,
            r#"{"a":1} x"#,
            r#"{"a":1}  "#,
            r#"{"a":[[[[[[[[[[]]]]]]]]]]}"#,
            r#"{"model":"\ud83d\ude00"}"#,
            r#"{"model":01}"#,
            r#"{"model":[1,]}"#,
            r#"{"#,
            r#"{"a""#,
            r#"{"a":"#,
            r#"{"a":1"#,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([
            format!(r#"{{"a":"{long}\"{long}","model":"m"}}"#),
            format!("{{\"a\":\"{long}\u{7}{long}\"}}"),
            format!(r#"{{"a":"{long}\\"}}"#),
            format!(r#"{{"a":"{long}é{long}","model":"m"}}"#),
            format!(r#"{{"deep":{}{}}}"#, "[".repeat(300), "]".repeat(300)),
        ])
        .collect();
        for case in &cases {
            agree(case.as_bytes());
        }
        // Bytes that are not UTF-8: fine inside a skipped string, not in a key.
        agree(b"{\"a\":\"\xff\xfe\",\"model\":\"m\"}");
        agree(b"{\"\xff\":1}");
        assert!(members(b"{\"a\":\"\xff\"}", &KEEP).is_ok());
    }

    /// Every byte value at every position of a word, and every cut of a body, agree with
    /// serde_json: the wide scan may not step over a stop byte wherever it falls.
    #[test]
    fn a_stop_byte_anywhere_in_a_word_is_seen() {
        for stop in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
            for at in 0..24 {
                let mut text = vec![b'y'; 24];
                text[at] = stop;
                let mut body = br#"{"a":""#.to_vec();
                body.extend_from_slice(&text);
                body.extend_from_slice(br#"","model":"m"}"#);
                agree(&body);
            }
        }
        for byte in 0..=255u8 {
            let body = [
                br#"{"a":"0123456789abcde"#.as_slice(),
                &[byte],
                br#"","model":1}"#,
            ]
            .concat();
            agree(&body);
        }
        let full = br#"{"messages":[{"content":"a\"b\\c\u0041"}],"model":"m","x":[1,{"y":null}]}"#;
        for cut in 0..full.len() {
            agree(&full[..cut]);
        }
    }

    /// The end of a string by definition, one byte at a time: the reference every scan
    /// (8-byte words natively, 16-byte SIMD blocks in the component) must agree with.
    fn scalar_string_end(b: &[u8], mut i: usize) -> Result<usize, ()> {
        loop {
            while i < b.len() && !is_stop(b[i]) {
                i += 1;
            }
            match b.get(i) {
                Some(b'"') => return Ok(i + 1),
                Some(b'\\') => i = escape_end(b, i + 1)?,
                _ => return Err(()),
            }
        }
    }

    /// String contents: runs of plain bytes (long enough to fill 8- and 16-byte blocks,
    /// ASCII and not) each ended by a byte the scanners must stop at or step over (quotes,
    /// backslashes, escape letters and hex digits, control bytes, high bytes).
    fn string_bytes() -> impl Strategy<Value = Vec<u8>> {
        let plain = prop::collection::vec(
            prop_oneof![4 => b' '..=b'~', 1 => 0x80u8..=0xff]
                .prop_filter("plain", |c| !is_stop(*c)),
            0..40,
        );
        let special = prop_oneof![
            Just(b'"'),
            Just(b'\\'),
            prop::sample::select(b"u0123456789abcdefABCDEFnrtbf/\"\\".to_vec()),
            0u8..0x20,
            Just(0x7f),
            0x80u8..=0xff,
        ];
        prop::collection::vec((plain, special), 0..6).prop_map(|parts| {
            parts
                .into_iter()
                .flat_map(|(mut p, s)| {
                    p.push(s);
                    p
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(crate::props::config())]

        /// The native word scan, the SIMD algorithm (its mask lane by lane) and the byte
        /// by byte definition find the same end, or the same error, from any start.
        #[test]
        fn every_string_scan_agrees(b in string_bytes(), start in 0usize..256) {
            let start = start % (b.len() + 1);
            let want = scalar_string_end(&b, start);
            prop_assert_eq!(string_end(&b, start), want);
            prop_assert_eq!(emulated_simd_string_end(&b, start), want);
        }

        /// On bodies an agent sends, damaged ones and any bytes, the skim keeps and
        /// refuses exactly what serde_json does.
        #[test]
        fn members_agree_with_serde_json(body in crate::props::body()) {
            agree(&body);
        }

        /// A kept member whose value is a string of any bytes (within an object with
        /// other members around it) reads as serde_json reads it.
        #[test]
        fn members_agree_on_any_string_contents(b in string_bytes()) {
            let body = [br#"{"a":1,"model":""#.as_slice(), &b, br#"","z":[]}"#].concat();
            agree(&body);
        }
    }
}
