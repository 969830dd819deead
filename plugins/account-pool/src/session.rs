//! Session keys: which conversation a request belongs to (and its parent), read from the
//! request's headers and JSON body, plus the requested model's family.
//!
//! Keys are namespaced: `session:<id>` for real session ids, `cache:<prompt_cache_key>`
//! for Codex requests that carry only a cache key, so the two never collide.

use crate::http::Headers;
use crate::model::{Family, Provider};
use serde_json::Value;

/// The longest accepted session id, in characters.
pub const MAX_ID_CHARS: usize = 512;

/// What a request says about its conversation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionInfo {
    /// The session key (`session:<id>` or `cache:<key>`), when the request has a valid one.
    pub key: Option<String>,
    /// The parent session's key, when it names a different valid session.
    pub parent: Option<String>,
    /// The requested model's family (Codex is always `Other`).
    pub family: Option<Family>,
}

/// A valid id: non-blank, at most 512 characters, no control characters.
pub fn valid_id(s: &str) -> bool {
    !s.trim().is_empty() && s.chars().count() <= MAX_ID_CHARS && !s.chars().any(char::is_control)
}

fn session_key(id: &str) -> String {
    format!("session:{id}")
}

/// Normalise a session given by a person or a stored key: `session:<id>` and `cache:<key>`
/// are kept, a raw id becomes `session:<id>`. None when the id is not valid.
pub fn normalise_key(s: &str) -> Option<String> {
    let raw = s
        .strip_prefix("session:")
        .or_else(|| s.strip_prefix("cache:"))
        .unwrap_or(s);
    if !valid_id(raw) {
        return None;
    }
    if s.starts_with("session:") || s.starts_with("cache:") {
        Some(s.to_owned())
    } else {
        Some(session_key(s))
    }
}

/// Read the session of a request. A body that is not JSON gives a session-less request.
pub fn extract(provider: Provider, headers: &Headers, body: &[u8]) -> SessionInfo {
    let json = read_fields(body);
    match provider {
        Provider::Claude => extract_claude(headers, json.as_ref()),
        Provider::Codex => extract_codex(headers, json.as_ref()),
    }
}

/// The top-level body fields the extraction reads.
const FIELDS: [&str; 4] = ["metadata", "model", "client_metadata", "prompt_cache_key"];

/// The body as far as the extraction reads it: for a JSON object, an object of just its
/// [`FIELDS`] (the last of a repeated key, as a full parse would keep); for other JSON,
/// `null`; for a body that is not JSON, None. Every other member — the messages and tools,
/// nearly all of an agent's request — is checked and skipped without being built
/// ([`crate::skim`]): a full parse into a `Value` allocated every string and object of a
/// body that can be megabytes.
pub fn read_fields(body: &[u8]) -> Option<Value> {
    match crate::skim::members(body, &FIELDS) {
        Ok(Some(kept)) => Some(Value::Object(kept)),
        Ok(None) => serde_json::from_slice::<serde::de::IgnoredAny>(body)
            .ok()
            .map(|_| Value::Null),
        Err(()) => None,
    }
}

/// A JSON object that may be given inline or as a string holding JSON.
fn object_or_json_string(v: &Value) -> Option<Value> {
    match v {
        Value::Object(_) => Some(v.clone()),
        Value::String(s) if s.trim_start().starts_with('{') => serde_json::from_str(s).ok(),
        _ => None,
    }
}

fn valid_str(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str).filter(|s| valid_id(s))
}

/// Claude: `metadata.user_id` — its JSON form's `session_id`, or the legacy
/// `user_<hash>_account_<uuid>_session_<uuid>` suffix — else the
/// `X-Claude-Code-Session-Id` header. Parent: the JSON form's `parent_session_id`.
pub fn extract_claude(headers: &Headers, body: Option<&Value>) -> SessionInfo {
    let user_id = body.and_then(|b| b.pointer("/metadata/user_id"));
    let user_json = user_id.and_then(object_or_json_string);
    let from_json = user_json
        .as_ref()
        .and_then(|u| valid_str(u.get("session_id")))
        .map(str::to_owned);
    let from_legacy = user_id
        .and_then(Value::as_str)
        .and_then(|s| s.rsplit_once("_session_").map(|(_, id)| id))
        .filter(|id| valid_id(id))
        .map(str::to_owned);
    let from_header = headers
        .get("x-claude-code-session-id")
        .filter(|s| valid_id(s))
        .map(str::to_owned);
    let id = from_json.or(from_legacy).or(from_header);
    let parent = user_json
        .as_ref()
        .and_then(|u| valid_str(u.get("parent_session_id")))
        .filter(|p| Some(*p) != id.as_deref())
        .map(session_key);
    let family = body
        .and_then(|b| b.get("model"))
        .and_then(Value::as_str)
        .map(Family::of);
    SessionInfo {
        key: id.map(|id| session_key(&id)),
        parent,
        family,
    }
}

/// Codex: the first valid id of header `thread-id`; `thread_id` of the header turn
/// metadata; `client_metadata.thread_id`; `thread_id` of the body turn metadata; headers
/// `session-id`, `session_id`; then `session_id` of the header turn metadata, of
/// `client_metadata` and of the body turn metadata. Else `cache:` + `prompt_cache_key`.
/// Parent: the first valid id, different from the session's, of `forked_from_thread_id`
/// (header turn metadata, then body turn metadata), header `x-codex-parent-thread-id`,
/// header-turn `parent_thread_id`, `client_metadata["x-codex-parent-thread-id"]`,
/// body-turn `parent_thread_id`.
pub fn extract_codex(headers: &Headers, body: Option<&Value>) -> SessionInfo {
    let header_turn = headers
        .get("x-codex-turn-metadata")
        .and_then(|s| serde_json::from_str::<Value>(s).ok());
    let client_meta = body.and_then(|b| b.get("client_metadata"));
    let body_turn = client_meta
        .and_then(|c| c.get("x-codex-turn-metadata"))
        .and_then(object_or_json_string);
    let header = |name: &str| headers.get(name).filter(|s| valid_id(s)).map(str::to_owned);
    let field =
        |v: Option<&Value>, name: &str| valid_str(v.and_then(|v| v.get(name))).map(str::to_owned);

    let id = header("thread-id")
        .or_else(|| field(header_turn.as_ref(), "thread_id"))
        .or_else(|| field(client_meta, "thread_id"))
        .or_else(|| field(body_turn.as_ref(), "thread_id"))
        .or_else(|| header("session-id"))
        .or_else(|| header("session_id"))
        .or_else(|| field(header_turn.as_ref(), "session_id"))
        .or_else(|| field(client_meta, "session_id"))
        .or_else(|| field(body_turn.as_ref(), "session_id"));
    let key = match &id {
        Some(id) => Some(session_key(id)),
        None => {
            valid_str(body.and_then(|b| b.get("prompt_cache_key"))).map(|k| format!("cache:{k}"))
        }
    };
    let parent = [
        field(header_turn.as_ref(), "forked_from_thread_id"),
        field(body_turn.as_ref(), "forked_from_thread_id"),
        header("x-codex-parent-thread-id"),
        field(header_turn.as_ref(), "parent_thread_id"),
        field(client_meta, "x-codex-parent-thread-id"),
        field(body_turn.as_ref(), "parent_thread_id"),
    ]
    .into_iter()
    .flatten()
    .find(|p| Some(p) != id.as_ref())
    .map(|p| session_key(&p));
    SessionInfo {
        key,
        parent,
        family: body.map(|_| Family::Other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Reading only the extraction's fields finds what a full parse finds, for both
    /// providers, on every kind of body.
    #[test]
    fn reading_the_fields_extracts_what_a_full_parse_does() {
        let big: String = (0..2_000)
            .map(|i| {
                format!(r#"{{"role":"user","content":"message {i} with \"quotes\" and ünïcode"}},"#)
            })
            .collect();
        let bodies: Vec<String> = vec![
            format!(
                r#"{{"model":"claude-opus-4","messages":[{}{{"role":"user","content":"x"}}],"metadata":{{"user_id":"{{\"session_id\":\"s-1\",\"parent_session_id\":\"p-1\"}}"}},"tools":[{{"name":"t","input_schema":{{"type":"object"}}}}]}}"#,
                big
            ),
            r#"{"metadata":{"user_id":"user_ab_account_cd_session_legacy-1"},"model":"claude-haiku"}"#.into(),
            // A repeated key: the last one counts, as in a full parse.
            r#"{"model":"claude-haiku","model":"claude-opus-4","metadata":{"user_id":"u"},"metadata":{"user_id":"user_x_session_last"}}"#.into(),
            r#"{"prompt_cache_key":"pck","client_metadata":{"session_id":"c-1","x-codex-turn-metadata":"{\"thread_id\":\"t-1\",\"forked_from_thread_id\":\"f-1\"}"},"input":[1,2,3]}"#.into(),
            r#"{"prompt_cache_key":"only-the-cache-key","input":{"deep":[[[[{"a":null}]]]]}}"#.into(),
            r#"{"model":null,"metadata":7}"#.into(),
            "[1, 2, 3]".into(),
            r#""a string""#.into(),
            "42".into(),
            "null".into(),
            "{}".into(),
            // Not JSON: truncated, trailing garbage, empty.
            r#"{"model":"claude-opus-4","messages":["#.into(),
            r#"{"model":"claude-opus-4"} trailing"#.into(),
            String::new(),
        ];
        let mut headers = Headers::new();
        headers.push("x-claude-code-session-id", "h-1");
        for body in &bodies {
            let full: Option<Value> = serde_json::from_slice(body.as_bytes()).ok();
            let read = read_fields(body.as_bytes());
            assert_eq!(read.is_some(), full.is_some(), "{body:.80}");
            assert_eq!(
                extract_claude(&headers, read.as_ref()),
                extract_claude(&headers, full.as_ref()),
                "claude: {body:.80}"
            );
            assert_eq!(
                extract_codex(&headers, read.as_ref()),
                extract_codex(&headers, full.as_ref()),
                "codex: {body:.80}"
            );
            if let (Some(Value::Object(read)), Some(Value::Object(full))) = (&read, &full) {
                for (k, v) in read {
                    assert_eq!(full.get(k), Some(v), "{k} of {body:.80}");
                }
                assert!(read.keys().all(|k| FIELDS.contains(&k.as_str())));
            }
        }
    }

    fn claude(headers: &[(&str, &str)], body: Value) -> SessionInfo {
        let mut h = Headers::new();
        for (n, v) in headers {
            h.push(n, *v);
        }
        extract(Provider::Claude, &h, body.to_string().as_bytes())
    }

    fn codex(headers: &[(&str, &str)], body: Value) -> SessionInfo {
        let mut h = Headers::new();
        for (n, v) in headers {
            h.push(n, *v);
        }
        extract(Provider::Codex, &h, body.to_string().as_bytes())
    }

    #[test]
    fn valid_ids_are_non_blank_short_and_without_control_characters() {
        let long = "x".repeat(513);
        let max = "é".repeat(512);
        let table: [(&str, bool); 7] = [
            ("abc", true),
            ("", false),
            ("   ", false),
            ("a\nb", false),
            ("a\u{7f}", false),
            (&long, false),
            (&max, true),
        ];
        for (id, want) in table {
            assert_eq!(valid_id(id), want, "{id:?}");
        }
    }

    #[test]
    fn claude_session_sources_in_order() {
        let uuid = "6f1c2d3e-0000-4000-8000-000000000001";
        let table = [
            (
                "json form of metadata.user_id",
                vec![("x-claude-code-session-id", "hdr")],
                json!({"model":"claude-opus-4","metadata":{"user_id":
                    json!({"device_id":"d","account_uuid":"a","session_id":"s-json"}).to_string()}}),
                Some("session:s-json"),
            ),
            (
                "legacy suffix",
                vec![],
                json!({"metadata":{"user_id": format!("user_abc_account_x_session_{uuid}")}}),
                Some(format!("session:{uuid}").leak() as &str),
            ),
            (
                "header when the body has none",
                vec![("X-Claude-Code-Session-Id", "hdr-1")],
                json!({"model":"claude-sonnet-4"}),
                Some("session:hdr-1"),
            ),
            (
                "invalid json id falls back to the header",
                vec![("x-claude-code-session-id", "hdr-2")],
                json!({"metadata":{"user_id": json!({"session_id":"  "}).to_string()}}),
                Some("session:hdr-2"),
            ),
            ("nothing", vec![], json!({"model":"x"}), None),
        ];
        for (name, headers, body, want) in table {
            assert_eq!(claude(&headers, body).key.as_deref(), want, "{name}");
        }
    }

    #[test]
    fn claude_parent_and_family() {
        let body = json!({"model":"Claude-Opus-4-1","metadata":{"user_id":
            json!({"session_id":"child","parent_session_id":"parent"}).to_string()}});
        let s = claude(&[], body);
        assert_eq!(s.key.as_deref(), Some("session:child"));
        assert_eq!(s.parent.as_deref(), Some("session:parent"));
        assert_eq!(s.family, Some(Family::Opus));
        let same = json!({"metadata":{"user_id":
            json!({"session_id":"p","parent_session_id":"p"}).to_string()}});
        assert_eq!(
            claude(&[], same).parent,
            None,
            "a parent equal to the session is ignored"
        );
    }

    /// AP-17: Codex session keys from headers and body fields, in the documented order,
    /// with the `prompt_cache_key` fallback in its own namespace.
    #[allow(clippy::type_complexity)] // a table of cases reads better inline
    #[test]
    fn codex_session_sources_in_order() {
        let turn = json!({"session_id":"turn-s","thread_id":"turn-t"}).to_string();
        let table: Vec<(&str, Vec<(&str, &str)>, Value, Option<&str>)> = vec![
            (
                "thread-id header first",
                vec![("thread-id", "t1"), ("session-id", "s1")],
                json!({"prompt_cache_key":"k"}),
                Some("session:t1"),
            ),
            (
                "header turn thread_id",
                vec![("x-codex-turn-metadata", &turn), ("session-id", "s1")],
                json!({}),
                Some("session:turn-t"),
            ),
            (
                "client_metadata.thread_id",
                vec![("session-id", "s1")],
                json!({"client_metadata":{"thread_id":"cm-t"}}),
                Some("session:cm-t"),
            ),
            (
                "body turn thread_id",
                vec![("session-id", "s1")],
                json!({"client_metadata":{"x-codex-turn-metadata": json!({"thread_id":"bt"}).to_string()}}),
                Some("session:bt"),
            ),
            (
                "session-id beats session_id",
                vec![("session_id", "s2"), ("session-id", "s1")],
                json!({}),
                Some("session:s1"),
            ),
            (
                "session_id header",
                vec![("session_id", "s2")],
                json!({}),
                Some("session:s2"),
            ),
            (
                "client_metadata.session_id",
                vec![],
                json!({"client_metadata":{"session_id":"cm-s"},"prompt_cache_key":"k"}),
                Some("session:cm-s"),
            ),
            (
                "prompt_cache_key fallback",
                vec![],
                json!({"prompt_cache_key":"k1"}),
                Some("cache:k1"),
            ),
            (
                "invalid header skipped",
                vec![("thread-id", " ")],
                json!({"prompt_cache_key":"k2"}),
                Some("cache:k2"),
            ),
            ("nothing", vec![], json!({"input":[]}), None),
        ];
        for (name, headers, body, want) in table {
            assert_eq!(codex(&headers, body).key.as_deref(), want, "{name}");
        }
    }

    #[test]
    fn codex_parent_differs_from_the_session() {
        let turn = json!({"thread_id":"child","forked_from_thread_id":"parent"}).to_string();
        let s = codex(&[("x-codex-turn-metadata", &turn)], json!({}));
        assert_eq!(s.key.as_deref(), Some("session:child"));
        assert_eq!(s.parent.as_deref(), Some("session:parent"));
        assert_eq!(s.family, Some(Family::Other));
        let s = codex(
            &[("thread-id", "a"), ("x-codex-parent-thread-id", "a")],
            json!({}),
        );
        assert_eq!(s.parent, None);
    }

    /// AP-24: a body that is not JSON is a session-less request, never an error.
    #[test]
    fn non_json_body_is_session_less() {
        let s = extract(Provider::Claude, &Headers::new(), b"not json {");
        assert_eq!(s, SessionInfo::default());
        let s = extract(
            Provider::Codex,
            &Headers::from([("session-id", "s")]),
            b"\x00\xff",
        );
        assert_eq!(s.key.as_deref(), Some("session:s"), "headers still count");
    }

    #[test]
    fn normalise_key_accepts_raw_and_stored_forms() {
        assert_eq!(normalise_key("abc").as_deref(), Some("session:abc"));
        assert_eq!(normalise_key("session:abc").as_deref(), Some("session:abc"));
        assert_eq!(normalise_key("cache:k").as_deref(), Some("cache:k"));
        assert_eq!(normalise_key(""), None);
        assert_eq!(normalise_key("session:"), None);
    }

    use crate::props;
    use proptest::prelude::*;

    /// Header names that are not read for a session (near misses included).
    const DECOY_HEADERS: [&str; 7] = [
        "x-session-id",
        "x-claude-code-session",
        "thread",
        "x-thread-id",
        "session",
        "anthropic-session-id",
        "x-codex-thread-id",
    ];

    fn headers_of(pairs: &[(String, String)]) -> Headers {
        let mut h = Headers::new();
        for (n, v) in pairs {
            h.push(n, v.as_str());
        }
        h
    }

    fn any_headers() -> impl Strategy<Value = Vec<(String, String)>> {
        let name = prop::sample::select(vec![
            "x-claude-code-session-id",
            "thread-id",
            "session-id",
            "session_id",
            "x-codex-turn-metadata",
            "x-codex-parent-thread-id",
            "x-session-id",
            "thread",
        ])
        .prop_map(str::to_owned);
        let value = prop_oneof![
            3 => props::text(),
            1 => props::json().prop_map(|v| v.to_string()),
        ];
        prop::collection::vec((name, value), 0..4)
    }

    /// Members, object or header names, that no documented place uses.
    fn decoys(taken: &'static [&'static str]) -> impl Strategy<Value = Vec<(String, Value)>> {
        prop::collection::vec(
            (
                props::key().prop_filter("undocumented", move |k| !taken.contains(&k.as_str())),
                props::json(),
            ),
            0..4,
        )
    }

    fn decoy_headers() -> impl Strategy<Value = Vec<(String, String)>> {
        prop::collection::vec(
            (
                prop::sample::select(DECOY_HEADERS.to_vec()).prop_map(str::to_owned),
                props::text(),
            ),
            0..3,
        )
    }

    /// Where a Claude request states its session.
    #[derive(Debug, Clone)]
    enum ClaudePlace {
        Nowhere,
        /// `metadata.user_id` holding JSON text with `session_id` (and a parent).
        JsonText,
        /// `metadata.user_id` as an inline object.
        Inline,
        /// The legacy `user_<h>_account_<u>_session_<id>` form.
        Legacy,
        /// The `X-Claude-Code-Session-Id` header.
        Header,
    }

    fn claude_place() -> impl Strategy<Value = ClaudePlace> {
        prop_oneof![
            Just(ClaudePlace::Nowhere),
            Just(ClaudePlace::JsonText),
            Just(ClaudePlace::Inline),
            Just(ClaudePlace::Legacy),
            Just(ClaudePlace::Header),
        ]
    }

    fn as_object(kv: Vec<(String, Value)>) -> serde_json::Map<String, Value> {
        kv.into_iter().collect()
    }

    proptest! {
        #![proptest_config(props::config())]

        /// Any headers and any body (damaged, not JSON, not an object): extraction never
        /// panics, gives the same answer twice, and finds what a full parse of the body
        /// would give it.
        #[test]
        fn extraction_is_total_deterministic_and_agrees_with_a_full_parse(
            headers in any_headers(),
            body in props::body(),
        ) {
            let h = headers_of(&headers);
            for provider in [Provider::Claude, Provider::Codex] {
                let once = extract(provider, &h, &body);
                prop_assert_eq!(&once, &extract(provider, &h, &body));
                if let Ok(full) = serde_json::from_slice::<Value>(&body) {
                    let by_full = match provider {
                        Provider::Claude => extract_claude(&h, Some(&full)),
                        Provider::Codex => extract_codex(&h, Some(&full)),
                    };
                    prop_assert_eq!(&once, &by_full);
                }
                for k in once.key.iter().chain(once.parent.iter()) {
                    prop_assert!(normalise_key(k).as_deref() == Some(k.as_str()), "{}", k);
                }
            }
        }

        /// A Claude session comes only from `metadata.user_id` and the session header:
        /// members, `metadata` fields and headers anywhere else change nothing, and an
        /// id stated in a documented place is the key.
        #[test]
        fn a_claude_session_comes_only_from_its_documented_places(
            place in claude_place(),
            id in props::text(),
            parent in props::text(),
            top in decoys(&["metadata", "model"]),
            in_metadata in decoys(&["user_id"]),
            extra_headers in decoy_headers(),
        ) {
            let mut headers = Vec::new();
            let user_id = match place {
                ClaudePlace::Nowhere => None,
                ClaudePlace::JsonText => Some(Value::String(
                    serde_json::json!({"session_id": id, "parent_session_id": parent}).to_string(),
                )),
                ClaudePlace::Inline => {
                    Some(serde_json::json!({"session_id": id, "parent_session_id": parent}))
                }
                ClaudePlace::Legacy => Some(Value::String(format!("user_ab_account_cd_session_{id}"))),
                ClaudePlace::Header => {
                    headers.push(("x-claude-code-session-id".to_owned(), id.clone()));
                    None
                }
            };
            let plain = |metadata_extra: Vec<(String, Value)>, top_extra: Vec<(String, Value)>| {
                let mut metadata = as_object(metadata_extra);
                if let Some(u) = &user_id {
                    metadata.insert("user_id".into(), u.clone());
                }
                let mut body = as_object(top_extra);
                body.insert("model".into(), Value::String("claude-sonnet-4-5".into()));
                body.insert("metadata".into(), Value::Object(metadata));
                Value::Object(body).to_string()
            };
            let bare = extract(Provider::Claude, &headers_of(&headers), plain(vec![], vec![]).as_bytes());
            let mut noisy_headers = extra_headers;
            noisy_headers.extend(headers.iter().cloned());
            let noisy = extract(
                Provider::Claude,
                &headers_of(&noisy_headers),
                plain(in_metadata, top).as_bytes(),
            );
            prop_assert_eq!(&noisy, &bare);
            let stated = match place {
                ClaudePlace::Nowhere => None,
                _ if !valid_id(&id) => None,
                // The id is what follows the last `_session_`: an id with `_` in it may
                // make another (the real ids are UUIDs).
                ClaudePlace::Legacy if id.contains('_') => None,
                _ => Some(session_key(&id)),
            };
            if stated.is_some() {
                prop_assert_eq!(&bare.key, &stated);
            } else if matches!(place, ClaudePlace::Nowhere) {
                prop_assert_eq!(&bare.key, &None);
            }
        }

        /// A Codex session comes only from its documented headers, `client_metadata`
        /// fields and `prompt_cache_key`: anything else changes nothing.
        #[test]
        fn a_codex_session_comes_only_from_its_documented_places(
            headers in any_headers(),
            client in prop::option::of(prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "thread_id", "session_id", "x-codex-turn-metadata",
                        "x-codex-parent-thread-id",
                    ]).prop_map(str::to_owned),
                    prop_oneof![
                        props::text().prop_map(Value::String),
                        props::json(),
                    ],
                ),
                0..4,
            )),
            cache_key in prop::option::of(props::text()),
            top in decoys(&["client_metadata", "prompt_cache_key", "model", "metadata"]),
            in_client in decoys(&[
                "thread_id", "session_id", "x-codex-turn-metadata", "x-codex-parent-thread-id",
            ]),
            extra_headers in decoy_headers(),
        ) {
            let build = |client_extra: Vec<(String, Value)>, top_extra: Vec<(String, Value)>| {
                let mut body = as_object(top_extra);
                if let Some(c) = &client {
                    let mut meta = as_object(client_extra);
                    meta.extend(c.iter().cloned());
                    body.insert("client_metadata".into(), Value::Object(meta));
                }
                if let Some(k) = &cache_key {
                    body.insert("prompt_cache_key".into(), Value::String(k.clone()));
                }
                Value::Object(body).to_string()
            };
            let bare = extract(Provider::Codex, &headers_of(&headers), build(vec![], vec![]).as_bytes());
            let mut noisy_headers = extra_headers;
            noisy_headers.extend(headers.iter().cloned());
            let noisy = extract(
                Provider::Codex,
                &headers_of(&noisy_headers),
                build(if client.is_some() { in_client } else { vec![] }, top).as_bytes(),
            );
            prop_assert_eq!(&noisy, &bare);
            if headers.is_empty() && client.is_none() {
                let want = cache_key.filter(|k| valid_id(k)).map(|k| format!("cache:{k}"));
                prop_assert_eq!(&bare.key, &want);
            }
        }
    }
}
