//! Route tokens: 256 random bits as base64url without padding (43 characters), stored only
//! as a SHA-256 hash and compared in constant time.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

/// Encode 32 random bytes as a token.
pub fn encode(random: &[u8; 32]) -> String {
    URL_SAFE_NO_PAD.encode(random)
}

/// The stored hash of a token.
pub fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Compare two byte strings in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

/// The token a client sent: `Authorization: Bearer <token>`, else `x-api-key`.
pub fn from_headers(headers: &crate::http::Headers) -> Option<String> {
    let bearer = headers.get("authorization").and_then(|v| {
        let v = v.trim();
        let (scheme, rest) = v.split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| rest.trim().to_owned())
    });
    bearer
        .or_else(|| headers.get("x-api-key").map(|v| v.trim().to_owned()))
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Headers;

    #[test]
    fn tokens_are_43_char_base64url() {
        let t = encode(&[0xfb; 32]);
        assert_eq!(t.len(), 43);
        assert!(
            t.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        );
        assert_ne!(encode(&[1; 32]), encode(&[2; 32]));
    }

    #[test]
    fn hashes_compare_in_constant_time() {
        let h = hash("abc");
        assert_eq!(h.len(), 32);
        assert!(constant_time_eq(&h, &hash("abc")));
        assert!(!constant_time_eq(&h, &hash("abd")));
        assert!(!constant_time_eq(&h, &h[..31]));
    }

    #[allow(clippy::type_complexity)] // a table of cases reads better inline
    #[test]
    fn token_comes_from_bearer_or_api_key() {
        let table: [(&[(&str, &str)], Option<&str>); 5] = [
            (&[("authorization", "Bearer tok1")], Some("tok1")),
            (&[("Authorization", "bearer  tok2 ")], Some("tok2")),
            (&[("x-api-key", "tok3")], Some("tok3")),
            (&[("authorization", "Basic abc")], None),
            (&[("authorization", "Bearer ")], None),
        ];
        for (pairs, want) in table {
            let mut h = Headers::new();
            for (n, v) in pairs {
                h.push(n, *v);
            }
            assert_eq!(from_headers(&h).as_deref(), want, "{pairs:?}");
        }
    }
}
