//! Taking an account's own credential out of text its upstream wrote, before the pool
//! stores it (an account's error, quota names) or relays it (an error answer to the
//! client). An upstream may echo what it was sent (`invalid x-api-key sk-ant-…`), and that
//! text reaches people, logs and the route holder, none of whom may see the key.
//!
//! What is taken out: every run of text made of [`PIECE`]-byte pieces of a secret (so the
//! secret whole, cut short, or embedded in a longer word), each run replaced by [`MARK`].
//! Letters match in either case (a parser that lowercases a header value must not let the
//! key through in lowercase; a 12-byte piece matching by chance stays unlikely). A
//! secret shorter than a piece is taken out where it occurs whole; one of [`SHOWN`] bytes
//! or fewer is left alone: the account list shows an API key's last 4 characters anyway,
//! and searching for so little would cut ordinary words.
//!
//! [`StreamRedactor`] does the same over a body that arrives in chunks, holding back only
//! the few bytes that a piece may still continue into, so its output is the same as
//! [`Redactor::redact_bytes`] of the whole body.

use std::borrow::Cow;
use std::collections::HashSet;
use std::ops::Range;

use crate::model::Credential;

/// What a run of secret text is replaced with.
pub const MARK: &str = "[redacted]";

/// The length, in bytes, of the shortest piece of a secret that is taken out.
pub const PIECE: usize = 12;

/// Secrets of at most this many bytes are not looked for.
pub const SHOWN: usize = 4;

/// Texts up to this long are searched piece by piece against each secret; longer ones
/// through a set of the secrets' pieces (built once per text).
const DIRECT_LIMIT: usize = 64;

/// A stream holds back at most this much for a run that may go on; past it the run is cut
/// (each part still replaced).
const HOLD_LIMIT: usize = 64 * 1024;

/// The secrets of one credential, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Redactor<'a> {
    secrets: [&'a str; 2],
}

impl<'a> Redactor<'a> {
    /// An API key, or an OAuth access and refresh token.
    pub fn for_credential(credential: &'a Credential) -> Self {
        match credential {
            Credential::ApiKey(key) => Redactor {
                secrets: [key.as_str(), ""],
            },
            Credential::OAuth(t) => Redactor {
                secrets: [t.access_token.as_str(), t.refresh_token.as_str()],
            },
        }
    }

    fn searched(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.secrets
            .iter()
            .map(|s| s.as_bytes())
            .filter(|s| s.len() > SHOWN)
    }

    /// `text` with every run of secret pieces replaced by [`MARK`].
    pub fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let runs = self.runs(text.as_bytes());
        if runs.is_empty() {
            return Cow::Borrowed(text);
        }
        // Runs end on character boundaries, so the result is UTF-8.
        let out = replace(text.as_bytes(), &runs);
        Cow::Owned(
            String::from_utf8(out)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        )
    }

    /// [`Redactor::redact`] of bytes (a body that may not be UTF-8).
    pub fn redact_bytes<'t>(&self, bytes: &'t [u8]) -> Cow<'t, [u8]> {
        let runs = self.runs(bytes);
        if runs.is_empty() {
            Cow::Borrowed(bytes)
        } else {
            Cow::Owned(replace(bytes, &runs))
        }
    }

    /// The runs of `text` to take out: sorted, apart (not even adjacent), each widened to
    /// whole UTF-8 characters.
    fn runs(&self, text: &[u8]) -> Vec<Range<usize>> {
        // Most texts a served answer brings (`allowed`, `5h`) are shorter than anything
        // searched for: no copy is made for them.
        let shortest = self.searched().map(|s| s.len().min(PIECE)).min();
        if shortest.is_none_or(|n| text.len() < n) {
            return Vec::new();
        }
        let mut found: Vec<Range<usize>> = Vec::new();
        // ASCII lowercasing keeps every byte where it was, so the runs apply to `text`.
        let lower = text.to_ascii_lowercase();
        let text = lower.as_slice();
        let secrets: Vec<Vec<u8>> = self.searched().map(<[u8]>::to_ascii_lowercase).collect();
        let long: Vec<&[u8]> = secrets
            .iter()
            .map(Vec::as_slice)
            .filter(|s| s.len() >= PIECE)
            .collect();
        if !long.is_empty() && text.len() >= PIECE {
            if text.len() <= DIRECT_LIMIT {
                for (i, piece) in text.windows(PIECE).enumerate() {
                    if long.iter().any(|s| s.windows(PIECE).any(|w| w == piece)) {
                        found.push(i..i + PIECE);
                    }
                }
            } else {
                let pieces: HashSet<&[u8]> = long.iter().flat_map(|s| s.windows(PIECE)).collect();
                for (i, piece) in text.windows(PIECE).enumerate() {
                    if pieces.contains(piece) {
                        found.push(i..i + PIECE);
                    }
                }
            }
        }
        for short in secrets.iter().filter(|s| s.len() < PIECE) {
            for (i, w) in text.windows(short.len()).enumerate() {
                if w == short {
                    found.push(i..i + short.len());
                }
            }
        }
        found.sort_by_key(|r| r.start);
        let mut runs: Vec<Range<usize>> = Vec::new();
        for r in found {
            let r = widen(text, r);
            match runs.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => runs.push(r),
            }
        }
        runs
    }
}

/// `r` widened to whole UTF-8 characters (continuation bytes join the run they touch).
fn widen(text: &[u8], mut r: Range<usize>) -> Range<usize> {
    while r.start > 0 && is_continuation(text[r.start]) {
        r.start -= 1;
    }
    while r.end < text.len() && is_continuation(text[r.end]) {
        r.end += 1;
    }
    r
}

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

fn replace(text: &[u8], runs: &[Range<usize>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut at = 0;
    for r in runs {
        out.extend_from_slice(&text[at..r.start]);
        out.extend_from_slice(MARK.as_bytes());
        at = r.end;
    }
    out.extend_from_slice(&text[at..]);
    out
}

/// [`Redactor`] over a body that arrives in chunks: [`StreamRedactor::push`] each chunk,
/// then [`StreamRedactor::finish`]. Owns its secrets (it lives as long as the relay).
#[derive(Debug)]
pub struct StreamRedactor {
    secrets: [String; 2],
    /// Bytes not yet given out: a piece may still continue into them.
    held: Vec<u8>,
}

impl StreamRedactor {
    pub fn new(credential: &Credential) -> Self {
        let r = Redactor::for_credential(credential);
        StreamRedactor {
            secrets: r.secrets.map(str::to_owned),
            held: Vec::new(),
        }
    }

    fn redactor(&self) -> Redactor<'_> {
        Redactor {
            secrets: [self.secrets[0].as_str(), self.secrets[1].as_str()],
        }
    }

    /// What of the body so far can be given out, redacted (possibly nothing yet).
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(chunk);
        let text = std::mem::take(&mut self.held);
        let runs = self.redactor().runs(&text);
        // A piece starting at `cut` or later may still run into the next chunk; everything
        // before it is decided, unless a run reaching `cut` may still grow.
        let mut cut = text.len().saturating_sub(PIECE - 1);
        loop {
            let before = cut;
            if let Some(r) = runs
                .iter()
                .find(|r| r.start < cut && r.end >= cut && text.len() - r.start <= HOLD_LIMIT)
            {
                cut = r.start;
            }
            // Never give out part of a character: a run may widen into it.
            while cut > 0 && cut < text.len() && is_continuation(text[cut]) {
                cut -= 1;
            }
            if cut == before {
                break;
            }
        }
        let given: Vec<Range<usize>> = runs
            .iter()
            .filter(|r| r.start < cut)
            .map(|r| r.start..r.end.min(cut))
            .collect();
        let out = replace(&text[..cut], &given);
        self.held = text[cut..].to_vec();
        out
    }

    /// The rest of the body, redacted, once it has ended (or broken).
    pub fn finish(&mut self) -> Vec<u8> {
        let rest = std::mem::take(&mut self.held);
        self.redactor().redact_bytes(&rest).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::OAuthTokens;
    use proptest::prelude::*;

    const KEY: &str = "sk-ant-api03-Qz7xK2pL9mW4vN8rOKOK";

    fn key(k: &str) -> Credential {
        Credential::ApiKey(k.to_owned())
    }

    #[test]
    fn an_echoed_key_is_taken_out_whole_cut_or_embedded() {
        let c = key(KEY);
        let r = Redactor::for_credential(&c);
        assert_eq!(
            r.redact(&format!("invalid x-api-key {KEY}")),
            "invalid x-api-key [redacted]"
        );
        assert_eq!(
            r.redact(&format!("key {}… was refused", &KEY[..20])),
            "key [redacted]… was refused"
        );
        assert_eq!(r.redact(&format!("x{}y", &KEY[9..25])), "x[redacted]y");
        assert_eq!(r.redact(&format!("«{KEY}»")), "«[redacted]»");
        assert_eq!(r.redact(&KEY.to_ascii_lowercase()), "[redacted]");
        // Two echoes apart, two marks; nothing else changes.
        assert_eq!(
            r.redact(&format!("{KEY} and {KEY}")),
            "[redacted] and [redacted]"
        );
        assert!(matches!(r.redact("invalid x-api-key"), Cow::Borrowed(_)));
        // Eleven bytes of it are no piece; the hint's last four are not looked for.
        assert_eq!(r.redact(&KEY[13..24]), &KEY[13..24]);
        assert_eq!(r.redact("hint …OKOK"), "hint …OKOK");
    }

    #[test]
    fn both_oauth_tokens_are_taken_out_and_short_secrets_only_whole() {
        let c = Credential::OAuth(OAuthTokens {
            access_token: "sk-ant-oat01-Lp4oI8uY2tR6eW1qOLDA".into(),
            refresh_token: "rt-short".into(),
            expires_at: None,
            chatgpt_account_id: Some("acct-visible-0000000000".into()),
        });
        let r = Redactor::for_credential(&c);
        assert_eq!(
            r.redact("bearer sk-ant-oat01-Lp4oI8uY2tR6eW1qOLDA, refresh rt-short, rt-shor"),
            "bearer [redacted], refresh [redacted], rt-shor"
        );
        // The account id is no secret: it is sent as a plain header.
        assert_eq!(
            r.redact("acct-visible-0000000000"),
            "acct-visible-0000000000"
        );
        let tiny = key("abcd");
        assert_eq!(Redactor::for_credential(&tiny).redact("abcd"), "abcd");
    }

    #[test]
    fn long_texts_are_searched_the_same_way() {
        let c = key(KEY);
        let r = Redactor::for_credential(&c);
        let long = format!("{}{KEY}{}", "a".repeat(100), "é".repeat(40));
        assert_eq!(
            r.redact(&long),
            format!("{}[redacted]{}", "a".repeat(100), "é".repeat(40))
        );
        let mut bytes = b"\x00\xff".to_vec();
        bytes.extend_from_slice(KEY.as_bytes());
        assert_eq!(r.redact_bytes(&bytes).as_ref(), b"\x00\xff[redacted]");
    }

    #[test]
    fn a_stream_holds_back_only_what_a_piece_may_continue_into() {
        let c = key(KEY);
        let mut s = StreamRedactor::new(&c);
        let mut out = s.push(b"{\"error\":\"invalid key sk-ant-api0");
        assert!(!String::from_utf8_lossy(&out).contains("sk-ant-api0"));
        assert!(out.len() >= 20, "most of it goes out at once: {out:?}");
        out.extend(s.push(b"3-Qz7xK2pL9mW4vN8rOKOK\"}"));
        out.extend(s.finish());
        assert_eq!(out, b"{\"error\":\"invalid key [redacted]\"}");
    }

    /// Every 12-byte window of `s`.
    fn pieces(s: &str) -> Vec<&[u8]> {
        s.as_bytes().windows(PIECE).collect()
    }

    proptest! {
        #![proptest_config(crate::props::config())]

        /// Whatever the text around it and however a body is cut into chunks: no piece of
        /// the secret is left, the stream's output is the whole text's, and text without
        /// the secret is unchanged.
        #[test]
        fn no_piece_is_left_and_chunks_do_not_matter(
            secret in "[a-zA-Z0-9_-]{12,60}",
            before in "[a-zA-Z0-9 é{}\":_-]{0,80}",
            after in "[a-zA-Z0-9 é{}\":_-]{0,80}",
            from in 0usize..60,
            len in 0usize..60,
            cuts in prop::collection::vec(0usize..200, 0..6),
        ) {
            let c = key(&secret);
            let r = Redactor::for_credential(&c);
            let from = from.min(secret.len());
            let part = &secret[from..(from + len).min(secret.len())];
            let text = format!("{before}{part}{after}");
            let whole = r.redact(&text).into_owned();
            // Pieces match in either case.
            let lower = secret.to_ascii_lowercase();
            let holds = |t: &str| {
                let t = t.to_ascii_lowercase();
                pieces(&lower).iter().any(|p| t.as_bytes().windows(PIECE).any(|w| w == *p))
            };
            prop_assert!(!holds(&whole), "{}", whole);
            if part.len() < PIECE && !holds(&text) {
                prop_assert_eq!(&whole, &text);
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).collect();
            cuts.sort_unstable();
            let mut s = StreamRedactor::new(&c);
            let mut streamed = Vec::new();
            let mut at = 0;
            for cut in cuts.into_iter().chain([text.len()]) {
                streamed.extend(s.push(&text.as_bytes()[at..cut]));
                at = cut;
            }
            streamed.extend(s.finish());
            prop_assert_eq!(String::from_utf8(streamed).unwrap(), whole);
        }
    }
}
