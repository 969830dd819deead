//! Ids the core assigns: readable, prefixed by what they name, and random enough (80 bits)
//! that two hosts, or a restored backup, never collide. Row and event ids are SQLite
//! integers instead, because the contract orders them.

const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
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
    fn session_ids_are_version_4_uuids() {
        let id = new_session_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"));
    }
}
