//! Ids the core assigns: readable, prefixed by what they name, and random enough (80 bits)
//! that two hosts, or a restored backup, never collide. Row and event ids are SQLite
//! integers instead, because the contract orders them.

const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

use std::cell::Cell;

thread_local! {
    /// The state of this thread's seeded generator, when [`seed_this_thread`] set one.
    static SEEDED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Draws the ids made on this thread from a generator seeded with `seed` (`None`: from the
/// operating system's random source again, the default). For a simulation that must repeat
/// exactly — the week simulator runs the whole host on one thread, so the same seed gives
/// the same ids and the same order wherever ids are sorted. Never in a server: ids must not
/// be guessable there.
pub fn seed_this_thread(seed: Option<u64>) {
    SEEDED.set(seed);
}

/// SplitMix64: one step of the seeded generator (state in, next state and output out).
fn splitmix64(state: u64) -> (u64, u64) {
    let next = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = next;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (next, z ^ (z >> 31))
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    if let Some(mut state) = SEEDED.get() {
        for chunk in bytes.chunks_mut(8) {
            let (next, out) = splitmix64(state);
            state = next;
            chunk.copy_from_slice(&out.to_le_bytes()[..chunk.len()]);
        }
        SEEDED.set(Some(state));
        return bytes;
    }
    // The OS random source failing leaves nothing sensible to do: every id, and the route
    // tokens the pool issues, depend on it.
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    bytes
}

/// `<prefix>_<16 lowercase base32 characters>`, e.g. `th_k3v9…`.
pub fn new_id(prefix: &str) -> String {
    let bytes = random_bytes::<10>();
    let mut out = String::with_capacity(prefix.len() + 17);
    out.push_str(prefix);
    out.push('_');
    // 10 bytes = 80 bits = 16 groups of 5 bits.
    let mut acc: u128 = 0;
    for b in bytes {
        acc = (acc << 8) | u128::from(b);
    }
    for i in (0..16).rev() {
        out.push(ALPHABET[((acc >> (i * 5)) & 31) as usize] as char);
    }
    out
}

/// A random UUID (version 4) in its canonical text form: the provider session id of a
/// thread, shaped like the ones Claude Code and Codex send.
pub fn new_session_id() -> String {
    let mut b = random_bytes::<16>();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_their_prefix_and_sixteen_base32_characters() {
        let id = new_id("th");
        assert!(id.starts_with("th_"));
        assert_eq!(id.len(), 19);
        assert!(id[3..].bytes().all(|c| ALPHABET.contains(&c)));
        assert_ne!(new_id("th"), new_id("th"));
    }

    #[test]
    fn a_seeded_thread_repeats_its_ids_and_other_threads_stay_random() {
        seed_this_thread(Some(7));
        let first = (new_id("th"), new_session_id(), new_id("rq"));
        seed_this_thread(Some(7));
        let again = (new_id("th"), new_session_id(), new_id("rq"));
        assert_eq!(first, again);
        assert_ne!(
            first.0,
            first.2[..].replace("rq_", "th_"),
            "the stream moves on"
        );
        let elsewhere = std::thread::spawn(|| (new_id("th"), new_id("th")))
            .join()
            .unwrap();
        assert_ne!(elsewhere.0, first.0);
        assert_ne!(elsewhere.0, elsewhere.1);
        seed_this_thread(None);
        assert_ne!(new_id("th"), new_id("th"));
    }

    #[test]
    fn session_ids_are_version_4_uuids() {
        let id = new_session_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"));
    }
}
