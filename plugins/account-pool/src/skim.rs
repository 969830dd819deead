//! A JSON scanner over a request body's chunks that checks every byte and keeps only what
//! its caller asks for, so reading a few members of a body costs a fixed amount of memory
//! whatever the body holds (the caller, [`crate::session`], says what it reads).
//!
//! An agent's request body is tens of KiB to megabytes, nearly all of it one or two long
//! strings (the conversation), and the pool needs a few small members of it. Strings the
//! caller does not read are stepped over 16 bytes at a time with wasm SIMD (8 natively
//! with a 64-bit word): serde_json checks a skipped string four bytes at a time on wasm32,
//! which made skipping the conversation most of the pool's guest time. Strings it reads are decoded into
//! its sink a run at a time, never held here.
//!
//! What is accepted is serde_json's grammar (escapes checked, control characters refused
//! in strings). In [`Mode::Grammar`], strings are not checked for UTF-8 (as serde_json
//! skips a value); in [`Mode::Text`], every string and key must decode to UTF-8 with its
//! surrogate escapes paired (as serde_json requires of a string it builds). Two limits
//! serde_json puts on values it builds are not kept (128 levels of nesting, numbers a
//! 64-bit float cannot hold), and one it does not put on values it skips is: nesting
//! deeper than [`MAX_DEPTH`] is refused, so the scanner's memory is fixed.

use bytes::Bytes;

/// What the scanner found: the bytes are not JSON (as it reads them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotJson;

/// Bytes to scan: one at a time for the structure, a run at a time inside strings.
pub trait Source {
    /// The next byte, or None at the end.
    fn peek(&mut self) -> Option<u8>;
    /// Step past the byte [`Source::peek`] gave.
    fn bump(&mut self);
    /// Hand `f` the plain bytes (none a quote, a backslash or below 0x20) from here, run by
    /// run, stepping past them; stops before the first other byte or at the end.
    fn plain_runs(
        &mut self,
        f: &mut dyn FnMut(&[u8]) -> Result<(), NotJson>,
    ) -> Result<(), NotJson> {
        while let Some(c) = self.peek() {
            if is_stop(c) {
                break;
            }
            f(&[c])?;
            self.bump();
        }
        Ok(())
    }
    /// Step past the plain bytes from here (as [`Source::plain_runs`] with nothing to do).
    fn skip_plain(&mut self) {
        let _ = self.plain_runs(&mut |_| Ok(()));
    }
    /// Step over the rest of a string (its opening quote read), checked in
    /// [`Mode::Grammar`].
    fn skip_grammar_string(&mut self) -> Result<(), NotJson>
    where
        Self: Sized,
    {
        loop {
            self.skip_plain();
            if next_unit(self, Mode::Grammar)?.is_none() {
                return Ok(());
            }
        }
    }
}

/// A body's bytes across its chunks.
#[derive(Clone)]
pub struct Cursor<'a> {
    /// The chunks after the current one.
    rest: &'a [Bytes],
    /// The current chunk, never empty but at the end.
    cur: &'a [u8],
    /// The offset in the current chunk: inside it, but at the end.
    i: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(chunks: &'a [Bytes]) -> Self {
        let mut cursor = Cursor {
            rest: chunks,
            cur: &[],
            i: 0,
        };
        cursor.next_chunk();
        cursor
    }

    /// Go on to the next chunk that is not empty (or to the end).
    #[cold]
    fn next_chunk(&mut self) {
        self.i = 0;
        self.cur = &[];
        while let Some((first, rest)) = self.rest.split_first() {
            self.rest = rest;
            if !first.is_empty() {
                self.cur = first;
                return;
            }
        }
    }
}

impl Source for Cursor<'_> {
    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        self.cur.get(self.i).copied()
    }

    #[inline(always)]
    fn bump(&mut self) {
        self.i += 1;
        if self.i == self.cur.len() {
            self.next_chunk();
        }
    }

    fn plain_runs(
        &mut self,
        f: &mut dyn FnMut(&[u8]) -> Result<(), NotJson>,
    ) -> Result<(), NotJson> {
        while !self.cur.is_empty() {
            let end = first_stop(self.cur, self.i);
            if end > self.i {
                f(&self.cur[self.i..end])?;
            }
            if end < self.cur.len() {
                self.i = end;
                return Ok(());
            }
            self.next_chunk();
        }
        Ok(())
    }

    fn skip_plain(&mut self) {
        while !self.cur.is_empty() {
            let end = first_stop(self.cur, self.i);
            if end < self.cur.len() {
                self.i = end;
                return;
            }
            self.next_chunk();
        }
    }

    /// The bulk of a body: each run of plain bytes stepped over a block at a time, and an
    /// escape within the chunk checked in place.
    fn skip_grammar_string(&mut self) -> Result<(), NotJson> {
        loop {
            let at = first_stop(self.cur, self.i);
            if at == self.cur.len() {
                if self.cur.is_empty() {
                    return Err(NotJson);
                }
                self.next_chunk();
                continue;
            }
            match self.cur[at] {
                b'"' => {
                    self.i = at;
                    self.bump();
                    return Ok(());
                }
                b'\\' => match escape_end(self.cur, at + 1) {
                    Some(end) if end < self.cur.len() => self.i = end,
                    // At the chunk's end, across it, or not an escape: one byte at a time.
                    _ => {
                        self.i = at;
                        self.bump();
                        escape(self, Mode::Grammar)?;
                    }
                },
                _ => return Err(NotJson),
            }
        }
    }
}

/// Past a well-formed escape whose letter is at `i` (after its backslash), when it lies
/// whole in `b`.
#[inline(always)]
fn escape_end(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(i + 1),
        b'u' => b
            .get(i + 1..i + 5)
            .filter(|hex| hex.iter().all(u8::is_ascii_hexdigit))
            .map(|_| i + 5),
        _ => None,
    }
}

/// The decoded contents of a string, read from just after its opening quote, ending at
/// its closing quote: the text a JSON document given as a string holds. The string must
/// have been read in [`Mode::Text`] before (an escape that does not decode ends it here).
pub struct Decoded<S> {
    raw: S,
    unit: [u8; 4],
    at: usize,
    len: usize,
    done: bool,
}

impl<S: Source> Decoded<S> {
    pub fn new(raw: S) -> Self {
        Decoded {
            raw,
            unit: [0; 4],
            at: 0,
            len: 0,
            done: false,
        }
    }
}

impl<S: Source> Source for Decoded<S> {
    fn peek(&mut self) -> Option<u8> {
        if self.at == self.len && !self.done {
            match next_unit(&mut self.raw, Mode::Text) {
                Ok(Some((unit, len))) => {
                    (self.unit, self.at, self.len) = (unit, 0, len);
                }
                _ => self.done = true,
            }
        }
        (self.at < self.len).then(|| self.unit[self.at])
    }

    fn bump(&mut self) {
        self.at += 1;
    }
}

/// How strictly strings are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Escapes well formed, no control characters: what skipping a value checks.
    Grammar,
    /// Also UTF-8 once decoded, surrogate escapes in pairs: what building a string checks.
    Text,
}

/// Step over whitespace.
pub fn ws(s: &mut impl Source) {
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = s.peek() {
        s.bump();
    }
}

/// Whether the source is at its end.
pub fn at_end(s: &mut impl Source) -> bool {
    s.peek().is_none()
}

fn expect(s: &mut impl Source, byte: u8) -> Result<(), NotJson> {
    if s.peek() == Some(byte) {
        s.bump();
        Ok(())
    } else {
        Err(NotJson)
    }
}

fn literal(s: &mut impl Source, text: &[u8]) -> Result<(), NotJson> {
    text.iter().try_for_each(|&b| expect(s, b))
}

fn digits(s: &mut impl Source) -> usize {
    let mut n = 0;
    while let Some(b'0'..=b'9') = s.peek() {
        s.bump();
        n += 1;
    }
    n
}

/// A number, its `-` included: `0` or a non-zero digit and more, then an optional
/// fraction and exponent, each with at least one digit.
fn number(s: &mut impl Source) -> Result<(), NotJson> {
    if s.peek() == Some(b'-') {
        s.bump();
    }
    match s.peek() {
        Some(b'0') => {
            s.bump();
            if let Some(b'0'..=b'9') = s.peek() {
                return Err(NotJson);
            }
        }
        Some(b'1'..=b'9') => {
            digits(s);
        }
        _ => return Err(NotJson),
    }
    if s.peek() == Some(b'.') {
        s.bump();
        if digits(s) == 0 {
            return Err(NotJson);
        }
    }
    if let Some(b'e' | b'E') = s.peek() {
        s.bump();
        if let Some(b'+' | b'-') = s.peek() {
            s.bump();
        }
        if digits(s) == 0 {
            return Err(NotJson);
        }
    }
    Ok(())
}

/// Up to four decoded bytes of a string's contents, and how many.
type Unit = ([u8; 4], usize);

/// The next piece of a string's contents: one raw byte, or what one escape (a surrogate
/// pair as one) decodes to; None past the closing quote. In [`Mode::Grammar`] an escape is
/// only checked, and decodes to nothing.
fn next_unit(s: &mut impl Source, mode: Mode) -> Result<Option<Unit>, NotJson> {
    match s.peek() {
        Some(b'"') => {
            s.bump();
            Ok(None)
        }
        Some(b'\\') => {
            s.bump();
            escape(s, mode).map(Some)
        }
        Some(c) if c >= 0x20 => {
            s.bump();
            Ok(Some(([c, 0, 0, 0], 1)))
        }
        _ => Err(NotJson),
    }
}

fn hex4(s: &mut impl Source) -> Result<u32, NotJson> {
    let mut n = 0;
    for _ in 0..4 {
        let d = s
            .peek()
            .and_then(|c| (c as char).to_digit(16))
            .ok_or(NotJson)?;
        s.bump();
        n = n * 16 + d;
    }
    Ok(n)
}

/// The escape whose letter is next (its backslash read).
fn escape(s: &mut impl Source, mode: Mode) -> Result<Unit, NotJson> {
    let c = s.peek().ok_or(NotJson)?;
    s.bump();
    let byte = match c {
        b'"' | b'\\' | b'/' => c,
        b'b' => 0x08,
        b'f' => 0x0c,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'u' => {
            let n = hex4(s)?;
            if mode == Mode::Grammar {
                return Ok(([0; 4], 0));
            }
            let scalar = match n {
                0xdc00..=0xdfff => return Err(NotJson),
                0xd800..=0xdbff => {
                    literal(s, b"\\u")?;
                    let low = hex4(s)?;
                    if !(0xdc00..=0xdfff).contains(&low) {
                        return Err(NotJson);
                    }
                    0x1_0000 + ((n - 0xd800) << 10) + (low - 0xdc00)
                }
                _ => n,
            };
            let ch = char::from_u32(scalar).ok_or(NotJson)?;
            let mut unit = [0; 4];
            let len = ch.encode_utf8(&mut unit).len();
            return Ok((unit, len));
        }
        _ => return Err(NotJson),
    };
    Ok(([byte, 0, 0, 0], 1))
}

/// Checks UTF-8 fed in pieces (a sequence may be split between them).
#[derive(Default)]
struct Utf8 {
    /// Continuation bytes still expected.
    need: u8,
    /// The range the next continuation byte must be in (narrower after some lead bytes:
    /// no overlong forms, no surrogates, nothing past U+10FFFF).
    lo: u8,
    hi: u8,
}

impl Utf8 {
    fn byte(&mut self, b: u8) -> Result<(), NotJson> {
        if self.need > 0 {
            if !(self.lo..=self.hi).contains(&b) {
                return Err(NotJson);
            }
            self.need -= 1;
            (self.lo, self.hi) = (0x80, 0xbf);
            return Ok(());
        }
        (self.need, self.lo, self.hi) = match b {
            0x00..=0x7f => return Ok(()),
            0xc2..=0xdf => (1, 0x80, 0xbf),
            0xe0 => (2, 0xa0, 0xbf),
            0xe1..=0xec | 0xee..=0xef => (2, 0x80, 0xbf),
            0xed => (2, 0x80, 0x9f),
            0xf0 => (3, 0x90, 0xbf),
            0xf1..=0xf3 => (3, 0x80, 0xbf),
            0xf4 => (3, 0x80, 0x8f),
            _ => return Err(NotJson),
        };
        Ok(())
    }

    fn run(&mut self, mut run: &[u8]) -> Result<(), NotJson> {
        while self.need > 0 {
            let Some((&b, rest)) = run.split_first() else {
                return Ok(());
            };
            self.byte(b)?;
            run = rest;
        }
        match std::str::from_utf8(run) {
            Ok(_) => Ok(()),
            // Cut short at the end: the rest comes in the next piece.
            Err(e) if e.error_len().is_none() => run[e.valid_up_to()..]
                .iter()
                .try_for_each(|&b| self.byte(b)),
            Err(_) => Err(NotJson),
        }
    }

    fn end(&self) -> Result<(), NotJson> {
        if self.need == 0 { Ok(()) } else { Err(NotJson) }
    }
}

/// Read a string (its opening quote next) in [`Mode::Text`], handing `sink` its decoded
/// contents piece by piece.
pub fn read_string(s: &mut impl Source, sink: &mut dyn FnMut(&[u8])) -> Result<(), NotJson> {
    expect(s, b'"')?;
    let mut utf8 = Utf8::default();
    loop {
        s.plain_runs(&mut |run| {
            utf8.run(run)?;
            sink(run);
            Ok(())
        })?;
        match next_unit(s, Mode::Text)? {
            None => return utf8.end(),
            Some((unit, len)) => {
                utf8.run(&unit[..len])?;
                sink(&unit[..len]);
            }
        }
    }
}

/// Step over a string (its opening quote next), checked as `mode` says.
pub fn skip_string(s: &mut impl Source, mode: Mode) -> Result<(), NotJson> {
    if mode == Mode::Text {
        return read_string(s, &mut |_| {});
    }
    expect(s, b'"')?;
    s.skip_grammar_string()
}

/// An object key, decoded, as far as [`Key::KEPT`] bytes: enough to compare it with the
/// names a caller looks for.
pub struct Key {
    text: [u8; Key::KEPT],
    len: usize,
    /// Longer than [`Key::KEPT`] bytes.
    long: bool,
}

impl Key {
    pub const KEPT: usize = 32;

    /// Whether the key is `name`.
    pub fn is(&self, name: &str) -> bool {
        !self.long && &self.text[..self.len] == name.as_bytes()
    }

    fn read(s: &mut impl Source) -> Result<Key, NotJson> {
        let mut key = Key {
            text: [0; Key::KEPT],
            len: 0,
            long: false,
        };
        read_string(s, &mut |piece| {
            if key.long || key.len + piece.len() > Key::KEPT {
                key.long = true;
            } else {
                key.text[key.len..key.len + piece.len()].copy_from_slice(piece);
                key.len += piece.len();
            }
        })?;
        Ok(key)
    }
}

/// Walk the object that is next: `member` is handed each key (read in [`Mode::Text`], as
/// serde_json reads a key) with the source at its value, and must read or skip that value.
pub fn object<S: Source>(
    s: &mut S,
    mut member: impl FnMut(&mut S, &Key) -> Result<(), NotJson>,
) -> Result<(), NotJson> {
    expect(s, b'{')?;
    ws(s);
    if s.peek() == Some(b'}') {
        s.bump();
        return Ok(());
    }
    loop {
        let key = Key::read(s)?;
        ws(s);
        expect(s, b':')?;
        ws(s);
        member(s, &key)?;
        ws(s);
        match s.peek() {
            Some(b',') => {
                s.bump();
                ws(s);
            }
            Some(b'}') => {
                s.bump();
                return Ok(());
            }
            _ => return Err(NotJson),
        }
    }
}

/// The deepest nesting of arrays and objects read (far past any agent's body: serde_json
/// builds 128 levels).
pub const MAX_DEPTH: usize = 1024;

/// The open arrays and objects of a value being skipped, a bit each: fixed memory.
struct Open {
    /// Bit `k` set: level `k` is an object, else an array.
    objects: [u64; MAX_DEPTH / 64],
    depth: usize,
}

impl Open {
    fn push(&mut self, object: bool) -> Result<(), NotJson> {
        if self.depth == MAX_DEPTH {
            return Err(NotJson);
        }
        let (word, bit) = (self.depth / 64, self.depth % 64);
        self.objects[word] = (self.objects[word] & !(1 << bit)) | (u64::from(object) << bit);
        self.depth += 1;
        Ok(())
    }

    /// The innermost open level: `b'{'` or `b'['`.
    fn last(&self) -> Option<u8> {
        let k = self.depth.checked_sub(1)?;
        Some(if self.objects[k / 64] >> (k % 64) & 1 == 1 {
            b'{'
        } else {
            b'['
        })
    }

    fn pop(&mut self) {
        self.depth -= 1;
    }
}

/// Step over one value (whitespace before it already skipped), checked as `mode` says;
/// arrays and objects iteratively, in fixed memory (at most [`MAX_DEPTH`] levels).
pub fn skip_value<S: Source>(s: &mut S, mode: Mode) -> Result<(), NotJson> {
    let mut open = Open {
        objects: [0; MAX_DEPTH / 64],
        depth: 0,
    };
    // A key is checked as the strings around it are (serde_json builds the keys of a map
    // it builds, and skips those of one it skips).
    let member_name = |s: &mut S| -> Result<(), NotJson> {
        skip_string(s, mode)?;
        ws(s);
        expect(s, b':')?;
        ws(s);
        Ok(())
    };
    loop {
        // A value starts here.
        match s.peek().ok_or(NotJson)? {
            b'n' => literal(s, b"null")?,
            b't' => literal(s, b"true")?,
            b'f' => literal(s, b"false")?,
            b'-' | b'0'..=b'9' => number(s)?,
            b'"' => skip_string(s, mode)?,
            b'[' => {
                s.bump();
                ws(s);
                if s.peek() == Some(b']') {
                    s.bump();
                } else {
                    open.push(false)?;
                    continue;
                }
            }
            b'{' => {
                s.bump();
                ws(s);
                if s.peek() == Some(b'}') {
                    s.bump();
                } else {
                    open.push(true)?;
                    member_name(s)?;
                    continue;
                }
            }
            _ => return Err(NotJson),
        }
        // A value ended: close what ends here, or go on to the next element or member.
        loop {
            let Some(frame) = open.last() else {
                return Ok(());
            };
            ws(s);
            match (s.peek(), frame) {
                (Some(b','), _) => {
                    s.bump();
                    ws(s);
                    if frame == b'{' {
                        member_name(s)?;
                    }
                    break;
                }
                (Some(b']'), b'[') | (Some(b'}'), b'{') => {
                    s.bump();
                    open.pop();
                }
                _ => return Err(NotJson),
            }
        }
    }
}

/// Whether `c` ends a run of plain string bytes: a quote, a backslash or a control
/// character.
#[inline(always)]
fn is_stop(c: u8) -> bool {
    c == b'"' || c == b'\\' || c < 0x20
}

/// The first stop byte ([`is_stop`]) at or after `i` in `b`, or `b.len()`.
#[inline]
fn first_stop(b: &[u8], i: usize) -> usize {
    #[cfg(target_arch = "wasm32")]
    {
        // SAFETY: SIMD is part of WebAssembly 2.0, which every component-model host runs;
        // a module using it fails to load, not to run, where it is missing.
        unsafe { simd_first_stop(b, i) }
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        word_first_stop(b, i)
    }
}

/// The algorithm of [`simd_first_stop`], written once for its two users: `$b` the bytes,
/// `$i` the index (a `mut` variable), and `|$at| $mask` the stop mask of the 16 bytes at
/// `$at` (bit k set when byte `$at + k` is a quote, a backslash or below 0x20). The
/// wasm32 function computes the mask with simd128; a native test computes it lane by
/// lane, so the block stepping and the tail run natively too (the SIMD path otherwise
/// runs only in the component). A macro, not a function taking a closure, so the vector
/// code stays inline in the `target_feature` function.
#[cfg(any(target_arch = "wasm32", test))]
macro_rules! blocked_first_stop {
    ($b:ident, $i:ident, |$at:ident| $mask:expr) => {{
        loop {
            if $i + 16 <= $b.len() {
                let $at = $i;
                let mask: u32 = $mask;
                if mask != 0 {
                    break $i + mask.trailing_zeros() as usize;
                }
                $i += 16;
            } else {
                while $i < $b.len() && !is_stop($b[$i]) {
                    $i += 1;
                }
                break $i;
            }
        }
    }};
}

/// [`first_stop`] stepping 16 bytes at a time.
#[cfg(target_arch = "wasm32")]
#[target_feature(enable = "simd128")]
unsafe fn simd_first_stop(b: &[u8], mut i: usize) -> usize {
    use core::arch::wasm32::*;
    let quote = u8x16_splat(b'"');
    let backslash = u8x16_splat(b'\\');
    let space = u8x16_splat(0x20);
    blocked_first_stop!(b, i, |at| {
        // SAFETY: `at + 16 <= b.len()`; v128.load needs no alignment.
        let v = unsafe { v128_load(b.as_ptr().add(at).cast::<v128>()) };
        let stop = v128_or(
            v128_or(u8x16_eq(v, quote), u8x16_eq(v, backslash)),
            u8x16_lt(v, space),
        );
        u32::from(u8x16_bitmask(stop))
    })
}

/// [`simd_first_stop`]'s algorithm natively, its 16-lane mask computed lane by lane as
/// simd128 does (`u8x16_eq` with a quote, with a backslash, unsigned `u8x16_lt` 0x20).
#[cfg(all(test, not(target_arch = "wasm32")))]
fn emulated_simd_first_stop(b: &[u8], mut i: usize) -> usize {
    blocked_first_stop!(b, i, |at| {
        b[at..at + 16]
            .iter()
            .enumerate()
            .filter(|&(_, &c)| c == b'"' || c == b'\\' || c < 0x20)
            .fold(0u32, |m, (k, _)| m | (1 << k))
    })
}

/// [`first_stop`] stepping over whole 8-byte words with no stop byte (the classic "has a
/// zero byte" and "has a byte below n" word tricks).
#[cfg(not(target_arch = "wasm32"))]
fn word_first_stop(b: &[u8], mut i: usize) -> usize {
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

/// A body's bytes cut into chunks at the given places (for tests of every split).
#[cfg(test)]
pub fn chunked(body: &[u8], cuts: &[usize]) -> Vec<Bytes> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    at.sort_unstable();
    let mut chunks = Vec::new();
    let mut from = 0;
    for cut in at.into_iter().chain([body.len()]) {
        chunks.push(Bytes::copy_from_slice(&body[from..cut]));
        from = cut;
    }
    chunks
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every way of reading `body` whole as one value, checked as `mode` says, over a
    /// cursor of the given chunks.
    fn skim_document(chunks: &[Bytes], mode: Mode) -> Result<(), NotJson> {
        let mut s = Cursor::new(chunks);
        ws(&mut s);
        skip_value(&mut s, mode)?;
        ws(&mut s);
        if at_end(&mut s) { Ok(()) } else { Err(NotJson) }
    }

    /// serde_json's verdict on `body` as one value: skipped ([`Mode::Grammar`]) or built
    /// ([`Mode::Text`]); None when it refuses it for a limit this scanner does not keep.
    fn serde_verdict(body: &[u8], mode: Mode) -> Option<Result<(), NotJson>> {
        let result = match mode {
            Mode::Grammar => serde_json::from_slice::<serde::de::IgnoredAny>(body).map(|_| ()),
            Mode::Text => serde_json::from_slice::<serde_json::Value>(body).map(|_| ()),
        };
        match result {
            Err(e) if is_unkept_limit(&e) => None,
            r => Some(r.map_err(|_| NotJson)),
        }
    }

    /// serde_json's refusals for limits this scanner does not keep (see the module's doc).
    pub(crate) fn is_unkept_limit(e: &serde_json::Error) -> bool {
        let text = e.to_string();
        text.contains("recursion limit exceeded") || text.contains("number out of range")
    }

    fn agree(body: &[u8]) {
        for mode in [Mode::Grammar, Mode::Text] {
            let Some(want) = serde_verdict(body, mode) else {
                continue;
            };
            let whole = [Bytes::copy_from_slice(body)];
            assert_eq!(
                skim_document(&whole, mode),
                want,
                "{mode:?}: {:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    /// Every way a document can fail, agreeing with serde_json skipping it and building
    /// it; and what serde_json accepts too.
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
            r#"{"a":"\uD800\n"}"#,
            r#"{"a":"\uD800\u0041"}"#,
            r#"{"a":"\uDC00"}"#,
            r#"{"a":"\ud83d\ude00"}"#,
            r#"{"\ud83d\ude00":1}"#,
            r#"{"\uDC00":1}"#,
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
            r#"[1,2]"#,
            r#""x""#,
            "12",
            "null",
            "",
            "  ",
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
        ])
        .collect();
        for case in &cases {
            agree(case.as_bytes());
        }
        // Bytes that are not UTF-8: fine in a skipped string, not in one that is built.
        agree(b"{\"a\":\"\xff\xfe\",\"model\":\"m\"}");
        agree(b"{\"\xff\":1}");
        agree(b"{\"a\":\"\xc3\\n\xa9\"}");
        agree(b"{\"a\":\"\xed\xa0\x80\"}");
        agree(b"{\"a\":\"\xf4\x90\x80\x80\"}");
        agree(b"{\"a\":\"\xe2\x82\"}");
        assert!(skim_document(&[Bytes::from_static(b"{\"a\":\"\xff\"}")], Mode::Grammar).is_ok());
        // Deeper than serde_json builds, still read (skipped, it agrees); deeper than
        // [`MAX_DEPTH`], refused.
        let deep = format!(r#"{{"deep":{}{}}}"#, "[".repeat(300), "]".repeat(300));
        assert!(skim_document(&[Bytes::from(deep.clone())], Mode::Text).is_ok());
        agree(deep.as_bytes());
        let nested = |n: usize, open: &str, close: &str| {
            Bytes::from(format!("{}1{}", open.repeat(n), close.repeat(n)))
        };
        for mode in [Mode::Grammar, Mode::Text] {
            assert_eq!(skim_document(&[nested(MAX_DEPTH, "[", "]")], mode), Ok(()));
            assert_eq!(
                skim_document(&[nested(MAX_DEPTH + 1, "[", "]")], mode),
                Err(NotJson)
            );
            assert_eq!(
                skim_document(&[nested(MAX_DEPTH, "{\"a\":", "}")], mode),
                Ok(())
            );
            assert_eq!(
                skim_document(&[nested(MAX_DEPTH + 1, "{\"a\":", "}")], mode),
                Err(NotJson)
            );
            let mixed = format!("{}1{}", "[{\"a\":".repeat(300), "}]".repeat(300));
            assert_eq!(skim_document(&[Bytes::from(mixed)], mode), Ok(()));
        }
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

    /// A document split into chunks anywhere (inside escapes, surrogate pairs, UTF-8
    /// sequences, numbers and literals) reads as it does whole.
    #[test]
    fn a_split_anywhere_reads_as_whole() {
        let body = "{\"a\":\"x\\u00e9\\ud83d\\ude00é😀\\n\",\"n\":-12.5e+3,\"t\":true,\"z\":null,\"k\":[{}],\"é\":\"\\\"\"}";
        let body = body.as_bytes();
        for mode in [Mode::Grammar, Mode::Text] {
            assert_eq!(skim_document(&chunked(body, &[]), mode), Ok(()));
            for i in 0..=body.len() {
                for j in i..=body.len() {
                    assert_eq!(
                        skim_document(&chunked(body, &[i, j]), mode),
                        Ok(()),
                        "{i} {j}"
                    );
                }
            }
        }
        let mut decoded = Vec::new();
        for i in 0..=body.len() {
            let chunks = chunked(body, &[i, i + 1, i + 3]);
            let mut s = Cursor::new(&chunks);
            decoded.clear();
            object(&mut s, |s, key| {
                if key.is("a") {
                    read_string(s, &mut |p| decoded.extend_from_slice(p))
                } else {
                    skip_value(s, Mode::Text)
                }
            })
            .unwrap();
            assert_eq!(decoded, "xé😀é😀\n".as_bytes(), "{i}");
        }
    }

    /// A string read as text decodes to what serde_json builds, and a document held in a
    /// string reads the same through [`Decoded`] as it does whole.
    #[test]
    fn strings_decode_as_serde_json_builds_them() {
        for text in [
            "plain",
            "",
            "a\"b\\c/d\u{8}\u{c}\n\r\t",
            "é ü 😀 \u{10ffff} \u{7f}",
            r#"{"session_id":"s\"1","n":[1,{"x":"é"}]}"#,
        ] {
            let quoted = serde_json::to_string(text).unwrap();
            let ascii = quoted
                .chars()
                .map(|c| {
                    if c.is_ascii() {
                        c.to_string()
                    } else {
                        c.encode_utf16(&mut [0; 2])
                            .iter()
                            .map(|u| format!("\\u{u:04x}"))
                            .collect()
                    }
                })
                .collect::<String>();
            for form in [&quoted, &ascii] {
                let chunks = chunked(form.as_bytes(), &[3, 7]);
                let mut out = Vec::new();
                read_string(&mut Cursor::new(&chunks), &mut |p| out.extend_from_slice(p)).unwrap();
                assert_eq!(out, text.as_bytes(), "{form}");
                let mut raw = Cursor::new(&chunks);
                raw.bump();
                let mut inner = Decoded::new(raw);
                let mut again = Vec::new();
                while let Some(b) = inner.peek() {
                    again.push(b);
                    inner.bump();
                }
                assert_eq!(again, text.as_bytes(), "{form}");
            }
        }
    }

    /// The first stop byte by definition, one byte at a time.
    fn scalar_first_stop(b: &[u8], i: usize) -> usize {
        b[i..]
            .iter()
            .position(|&c| is_stop(c))
            .map_or(b.len(), |n| i + n)
    }

    /// String contents: runs of plain bytes (long enough to fill 8- and 16-byte blocks,
    /// ASCII and not) each ended by a byte the scanners must stop at or step over (quotes,
    /// backslashes, escape letters and hex digits, control bytes, high bytes).
    pub(crate) fn string_bytes() -> impl Strategy<Value = Vec<u8>> {
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
        /// by byte definition find the same stop, from any start.
        #[test]
        fn every_stop_scan_agrees(b in string_bytes(), start in 0usize..256) {
            let start = start % (b.len() + 1);
            let want = scalar_first_stop(&b, start);
            prop_assert_eq!(first_stop(&b, start), want);
            prop_assert_eq!(emulated_simd_first_stop(&b, start), want);
        }

        /// On bodies an agent sends, damaged ones and any bytes, cut into chunks anywhere,
        /// the scanner accepts and refuses exactly what serde_json does, skipping and
        /// building.
        #[test]
        fn documents_agree_with_serde_json(
            body in crate::props::body(),
            cuts in prop::collection::vec(any::<usize>(), 0..4),
        ) {
            let chunks = chunked(&body, &cuts);
            for mode in [Mode::Grammar, Mode::Text] {
                if let Some(want) = serde_verdict(&body, mode) {
                    prop_assert_eq!(skim_document(&chunks, mode), want, "{:?}", mode);
                }
            }
        }

        /// A string of any bytes reads (or is refused) as serde_json reads it into a
        /// `String`, its decoded contents the same.
        #[test]
        fn strings_agree_on_any_contents(
            b in string_bytes(),
            cuts in prop::collection::vec(any::<usize>(), 0..3),
        ) {
            let quoted = [b"\"".as_slice(), &b, b"\""].concat();
            let want = serde_json::from_slice::<String>(&quoted).map_err(|_| NotJson);
            let chunks = chunked(&quoted, &cuts);
            let mut out = Vec::new();
            let mut s = Cursor::new(&chunks);
            let got = read_string(&mut s, &mut |p| out.extend_from_slice(p))
                .and_then(|()| if at_end(&mut s) { Ok(()) } else { Err(NotJson) });
            match want {
                Ok(text) => {
                    prop_assert_eq!(got, Ok(()));
                    prop_assert_eq!(out, text.into_bytes());
                }
                Err(NotJson) => prop_assert_eq!(got, Err(NotJson)),
            }
            let skipped = serde_json::from_slice::<serde::de::IgnoredAny>(&quoted).map(|_| ()).map_err(|_| NotJson);
            let mut s = Cursor::new(&chunks);
            let got = skip_string(&mut s, Mode::Grammar)
                .and_then(|()| if at_end(&mut s) { Ok(()) } else { Err(NotJson) });
            prop_assert_eq!(got, skipped);
        }
    }
}
