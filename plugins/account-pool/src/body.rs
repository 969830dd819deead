//! A request body held whole, within a memory budget.
//!
//! The pool keeps a request's body until the request ends: the session is read from it
//! (its metadata often comes after the conversation), and a failover or a transient retry
//! sends it again. It is held as a list of chunks of at most [`CHUNK`] bytes, filled as
//! the body arrives, so holding it costs its length and a few bytes a chunk: a growing
//! contiguous buffer cost up to four times that (each doubling copies, and the freed
//! halves cannot hold the next one), so a body well within `max-request-body` trapped the
//! instance at its memory cap.
//!
//! Every allocation for a body is fallible. [`HEADROOM`] for the rest of the request (its
//! reads, the upstream's answer) is set aside before the first chunk and given back when
//! the body is whole, and room for the next frame must stay free after each chunk (a frame
//! is allocated by the canonical ABI, which cannot fail softly). A body that does not fit
//! is refused (the pool answers 413) instead of trapping the instance, whatever memory cap
//! the host set. [`largest_held`] finds, the same way, the largest body this instance's
//! memory holds, so a `max-request-body` that could never be held is refused when it is
//! set.

use bytes::Bytes;

/// The most bytes one chunk holds (the size of a wasi:http frame as wstd reads it).
pub const CHUNK: usize = 64 << 10;

/// What is set aside for the rest of the request beside its body (its reads, the
/// upstream's answer, a retry): measured without it, a request with a 16 MiB body ran in
/// 18 MiB of memory, static data and stack included, so this is about twice the need.
pub const HEADROOM: usize = 2 << 20;

/// What must stay free after each chunk for the next frames of the body (the canonical ABI
/// allocates each, up to [`CHUNK`]).
const FRAME_ROOM: usize = 2 * CHUNK;

/// What a request holds before its body (its head, its route, the runtime), with room:
/// counted beside [`HEADROOM`] when [`largest_held`] is asked from a call that is not a
/// request.
const BEFORE_BODY: usize = 1 << 20;

/// A request body, in the chunks it was read in. Cloning shares the chunks.
#[derive(Clone, Default)]
pub struct RequestBody {
    /// No chunk is empty.
    chunks: Vec<Bytes>,
    len: usize,
}

impl RequestBody {
    pub fn new() -> Self {
        Self::default()
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunks, in order, none empty.
    pub fn chunks(&self) -> &[Bytes] {
        &self.chunks
    }

    /// The bytes in one piece (a copy; for tests and small bodies).
    pub fn to_vec(&self) -> Vec<u8> {
        self.chunks.concat()
    }
}

impl From<Bytes> for RequestBody {
    fn from(b: Bytes) -> Self {
        let len = b.len();
        RequestBody {
            chunks: if b.is_empty() { Vec::new() } else { vec![b] },
            len,
        }
    }
}

impl From<Vec<u8>> for RequestBody {
    fn from(v: Vec<u8>) -> Self {
        Bytes::from(v).into()
    }
}

impl From<&'static [u8]> for RequestBody {
    fn from(s: &'static [u8]) -> Self {
        Bytes::from_static(s).into()
    }
}

impl From<&'static str> for RequestBody {
    fn from(s: &'static str) -> Self {
        s.as_bytes().into()
    }
}

impl From<String> for RequestBody {
    fn from(s: String) -> Self {
        s.into_bytes().into()
    }
}

/// Two bodies are equal when their bytes are, however they are chunked.
impl PartialEq for RequestBody {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len
            && self
                .chunks
                .iter()
                .flat_map(|c| c.iter())
                .eq(other.chunks.iter().flat_map(|c| c.iter()))
    }
}

impl PartialEq<[u8]> for RequestBody {
    fn eq(&self, other: &[u8]) -> bool {
        self.len == other.len() && self.chunks.iter().flat_map(|c| c.iter()).eq(other.iter())
    }
}

impl PartialEq<&[u8]> for RequestBody {
    fn eq(&self, other: &&[u8]) -> bool {
        *self == **other
    }
}

/// Its length and its first bytes: a body may be megabytes.
impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let head: Vec<u8> = self
            .chunks
            .iter()
            .flat_map(|c| c.iter().copied())
            .take(200)
            .collect();
        let more = if self.len > head.len() { "…" } else { "" };
        write!(
            f,
            "RequestBody({} bytes: {:?}{more})",
            self.len,
            String::from_utf8_lossy(&head)
        )
    }
}

/// Why a body was not taken whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// It is longer than the limit (`max-request-body`).
    OverLimit,
    /// The instance's memory cannot hold it and what the request needs beside it; `held`
    /// bytes of it had been taken.
    OutOfMemory { held: u64 },
}

/// Takes a body as it arrives, within a length limit and the instance's memory.
pub struct Collector {
    body: RequestBody,
    /// The chunk being filled (its capacity is reserved).
    open: Vec<u8>,
    /// [`HEADROOM`], set aside from the first piece until the body is whole.
    set_aside: Vec<u8>,
    limit: u64,
    /// The length the request declared, when it did: chunks are sized to it, so a small
    /// body reserves no more than its length.
    declared: Option<u64>,
}

impl Collector {
    /// A collector for a body of at most `limit` bytes, `declared` long if the request
    /// said so (`content-length`; only a size hint: the bytes that come are what count).
    pub fn new(limit: u64, declared: Option<u64>) -> Self {
        Collector {
            body: RequestBody::new(),
            open: Vec::new(),
            set_aside: Vec::new(),
            limit,
            declared,
        }
    }

    /// How many bytes are taken so far.
    pub fn len(&self) -> usize {
        self.body.len + self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Take the next piece of the body. Refused when the body passes the limit, or when
    /// the memory cannot hold it with [`HEADROOM`] to spare; the collector is then spent
    /// (drop it to free what it held).
    pub fn push(&mut self, mut data: &[u8]) -> Result<(), Refused> {
        if (self.len() + data.len()) as u64 > self.limit {
            return Err(Refused::OverLimit);
        }
        if self.set_aside.capacity() == 0 && !data.is_empty() {
            self.set_aside
                .try_reserve_exact(HEADROOM)
                .map_err(|_| self.out_of_memory())?;
        }
        while !data.is_empty() {
            if self.open.len() == self.open.capacity() {
                self.seal().map_err(|()| self.out_of_memory())?;
                let taken = self.len() as u64;
                let want = match self.declared {
                    Some(d) if d > taken => (d - taken).min(CHUNK as u64) as usize,
                    _ => CHUNK,
                };
                // At least what this frame needs, so a short declared length cannot make
                // every byte a chunk of its own.
                let want = want.max(data.len().min(CHUNK));
                let mut chunk = Vec::new();
                chunk
                    .try_reserve_exact(want)
                    .map_err(|_| self.out_of_memory())?;
                self.open = chunk;
                if !can_allocate(FRAME_ROOM) {
                    return Err(self.out_of_memory());
                }
            }
            let n = data.len().min(self.open.capacity() - self.open.len());
            self.open.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        Ok(())
    }

    /// The body taken; [`HEADROOM`] is free again for the rest of the request.
    pub fn finish(mut self) -> RequestBody {
        // A place for the last chunk was reserved when it was opened.
        let _ = self.seal();
        self.body
    }

    /// Move the open chunk, when it holds anything, to the body; then make room in the
    /// list for the next one (Err when the memory has none).
    fn seal(&mut self) -> Result<(), ()> {
        let open = std::mem::take(&mut self.open);
        if !open.is_empty() {
            self.body.len += open.len();
            // Full chunks convert without a copy; the last one keeps its spare capacity.
            self.body.chunks.push(Bytes::from(open));
        }
        self.body.chunks.try_reserve(1).map_err(|_| ())
    }

    fn out_of_memory(&self) -> Refused {
        Refused::OutOfMemory {
            held: self.len() as u64,
        }
    }
}

/// Whether `bytes` more could be allocated now (tried, then freed at once). The memory a
/// WebAssembly instance grows to stays its own, so what was allocatable stays so until
/// something else takes it.
fn can_allocate(bytes: usize) -> bool {
    let mut probe: Vec<u8> = Vec::new();
    probe.try_reserve_exact(bytes).is_ok()
}

/// Whether this instance's memory holds a body of `len` bytes beside [`HEADROOM`]
/// ([`largest_held`]).
pub fn can_hold(len: u64) -> bool {
    largest_held(len) >= len
}

/// The largest body, up to `upto` bytes, this instance's memory holds beside what a
/// request needs besides ([`HEADROOM`], what it holds before its body, room for a frame),
/// to the nearest [`CHUNK`] below: found by taking that much memory as a request takes it,
/// what is beside first and then the body chunk by chunk, then freeing it all. (One allocation of the whole size is no measure:
/// the allocator may ask the host for all of it again rather than for what it lacks.)
pub fn largest_held(upto: u64) -> u64 {
    let mut beside: Vec<u8> = Vec::new();
    if beside
        .try_reserve_exact(HEADROOM + BEFORE_BODY + FRAME_ROOM)
        .is_err()
    {
        return 0;
    }
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut held = 0u64;
    while held < upto {
        let want = (upto - held).min(CHUNK as u64) as usize;
        let mut chunk = Vec::new();
        if chunks.try_reserve(1).is_err() || chunk.try_reserve_exact(want).is_err() {
            break;
        }
        chunks.push(chunk);
        held += want as u64;
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What holding one chunk costs beyond its bytes (the allocator's header, the `Bytes`
    /// handle, its place in the list, twice that while the list grows), rounded up.
    const PER_CHUNK: usize = 128;

    fn collect(
        limit: u64,
        declared: Option<u64>,
        frames: &[&[u8]],
    ) -> Result<RequestBody, Refused> {
        let mut c = Collector::new(limit, declared);
        for f in frames {
            c.push(f)?;
        }
        Ok(c.finish())
    }

    #[test]
    fn frames_are_held_in_order_in_bounded_chunks() {
        let big = vec![7u8; CHUNK * 2 + 5];
        for declared in [None, Some(3 + big.len() as u64), Some(1)] {
            let body = collect(1 << 30, declared, &[b"abc", &big, b"", b"z"]).unwrap();
            let mut want = b"abc".to_vec();
            want.extend_from_slice(&big);
            want.push(b'z');
            assert_eq!(body.len(), want.len());
            assert_eq!(body.to_vec(), want);
            assert!(
                body.chunks()
                    .iter()
                    .all(|c| !c.is_empty() && c.len() <= CHUNK)
            );
            assert_eq!(body, RequestBody::from(want), "{declared:?}");
        }
    }

    /// Chunks are sized to the declared length: a small body reserves no more than its
    /// length; a large one at most a chunk ahead.
    #[test]
    fn a_declared_length_sizes_the_chunks() {
        let mut c = Collector::new(1 << 30, Some(10));
        c.push(b"0123456789").unwrap();
        assert_eq!(c.open.capacity(), 10);
        let mut c = Collector::new(1 << 30, Some(10 * CHUNK as u64));
        c.push(b"x").unwrap();
        assert_eq!(c.open.capacity(), CHUNK);
        // Many one-byte frames with no declared length: one chunk, not one each.
        let mut c = Collector::new(1 << 30, None);
        for _ in 0..1000 {
            c.push(b"y").unwrap();
        }
        assert_eq!(c.finish().chunks().len(), 1);
    }

    #[test]
    fn a_body_past_the_limit_is_refused_before_it_is_held() {
        let mut c = Collector::new(10, None);
        c.push(b"0123456789").unwrap();
        assert_eq!(c.push(b"a"), Err(Refused::OverLimit));
        assert_eq!(collect(4, Some(2), &[b"abcde"]), Err(Refused::OverLimit));
    }

    #[test]
    fn bodies_compare_by_their_bytes() {
        let a = collect(1 << 20, None, &[b"ab", b"cd"]).unwrap();
        let mut c = Collector::new(1 << 20, Some(1));
        c.push(b"a").unwrap();
        c.push(b"bcd").unwrap();
        let b = c.finish();
        assert_eq!(a, b);
        assert_eq!(a, &b"abcd"[..]);
        assert_ne!(a, RequestBody::from("abce"));
        assert_ne!(a, RequestBody::from("abc"));
        assert!(RequestBody::from(Vec::new()).chunks().is_empty());
        assert!(format!("{a:?}").contains("4 bytes"));
    }

    /// Holding a body costs its length, a little a chunk, one chunk ahead at most and
    /// the headroom probe, whether its length is declared or not and however its frames
    /// are cut.
    #[test]
    fn holding_a_body_costs_its_length() {
        for (len, frame, declared) in [
            (10 << 20, 65_536, true),
            (10 << 20, 65_536, false),
            (3 << 20, 1_000, false),
            (3 << 20, 200_000, true),
            (100, 7, false),
        ] {
            let data = vec![b'a'; frame];
            let (body, peak) = crate::props::alloc::peak(|| {
                let mut c = Collector::new(1 << 30, declared.then_some(len as u64));
                let mut left = len;
                while left > 0 {
                    let n = left.min(frame);
                    c.push(&data[..n]).unwrap();
                    left -= n;
                }
                c.finish()
            });
            assert_eq!(body.len(), len);
            let bound = len + len.div_ceil(CHUNK) * PER_CHUNK + CHUNK + HEADROOM + FRAME_ROOM;
            assert!(
                peak <= bound,
                "{len} bytes in frames of {frame}: {peak} > {bound}"
            );
        }
    }

    /// Natively the memory holds any body the setting allows.
    #[test]
    fn the_largest_body_held_is_found_chunk_by_chunk() {
        assert!(can_hold(256 << 20));
        assert_eq!(largest_held(256 << 20), 256 << 20);
        assert_eq!(largest_held(12_345), 12_345);
        assert_eq!(largest_held(0), 0);
        assert!(can_hold(0));
    }
}
