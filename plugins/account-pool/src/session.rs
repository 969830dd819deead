//! Session keys: which conversation a request belongs to (and its parent), read from the
//! request's headers and JSON body, plus the requested model's family.
//!
//! Keys are namespaced: `session:<id>` for real session ids, `cache:<prompt_cache_key>`
//! for Codex requests that carry only a cache key, so the two never collide.
//!
//! The body is read with [`crate::skim`], which keeps only what [`read_fields`] asks for:
//! the few members a session is read from, each id no longer than a valid id can be. A
//! string over that is no id and is not kept whatever its length, so a body of any size
//! within `max-request-body` is read in a few KiB.

use crate::body::RequestBody;
use crate::http::Headers;
use crate::model::{Family, Provider};
use crate::skim::{self, Cursor, Decoded, Mode, NotJson, Source};

/// The longest accepted session id, in characters.
pub const MAX_ID_CHARS: usize = 512;

/// The most bytes a valid id's text can take (four a character).
const MAX_ID_BYTES: usize = MAX_ID_CHARS * 4;

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
pub fn extract(provider: Provider, headers: &Headers, body: &RequestBody) -> SessionInfo {
    let fields = read_fields(body);
    match provider {
        Provider::Claude => extract_claude(headers, &fields),
        Provider::Codex => extract_codex(headers, &fields),
    }
}

/// What a body states where a session and a model are read: each id only when it is a
/// valid id (a string over 512 characters, blank or with control characters, is none),
/// the last of a repeated member counting, as a full parse would keep it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BodyFields {
    /// The body is JSON (of any kind: only an object has the members below).
    pub json: bool,
    /// The family of the top-level `model`, when it is a string.
    pub family: Option<Family>,
    /// `metadata.user_id`.
    pub user_id: UserId,
    /// `client_metadata`.
    pub client: ClientMetadata,
    /// `prompt_cache_key`.
    pub prompt_cache_key: Option<String>,
}

/// `metadata.user_id`, in Claude Code's forms.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserId {
    /// Its object form (inline, or JSON text): `session_id`, `parent_session_id`.
    pub object: Option<[Option<String>; 2]>,
    /// As text: what follows its last `_session_` (the legacy
    /// `user_<hash>_account_<uuid>_session_<uuid>` form).
    pub legacy: Option<String>,
}

/// `client_metadata` of a Codex request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientMetadata {
    pub thread_id: Option<String>,
    pub session_id: Option<String>,
    /// `x-codex-parent-thread-id`.
    pub parent_thread_id: Option<String>,
    /// `x-codex-turn-metadata`, inline or as JSON text.
    pub turn: Option<TurnMetadata>,
}

/// Codex turn metadata (a header, or a `client_metadata` member).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TurnMetadata {
    pub thread_id: Option<String>,
    pub session_id: Option<String>,
    pub forked_from_thread_id: Option<String>,
    pub parent_thread_id: Option<String>,
}

const TURN_FIELDS: [&str; 4] = [
    "thread_id",
    "session_id",
    "forked_from_thread_id",
    "parent_thread_id",
];

impl TurnMetadata {
    fn from_ids(
        [
            thread_id,
            session_id,
            forked_from_thread_id,
            parent_thread_id,
        ]: [Option<String>; 4],
    ) -> Self {
        TurnMetadata {
            thread_id,
            session_id,
            forked_from_thread_id,
            parent_thread_id,
        }
    }
}

/// The body as far as the extraction reads it ([`BodyFields`]); a body that is not JSON
/// gives the default (`json` false). Every byte is checked, and every member around the
/// ones read is stepped over without being kept ([`crate::skim`]).
pub fn read_fields(body: &RequestBody) -> BodyFields {
    fields_of(&mut Cursor::new(body.chunks())).unwrap_or_default()
}

fn fields_of<S: Source + Clone>(s: &mut S) -> Result<BodyFields, NotJson> {
    let mut fields = BodyFields {
        json: true,
        ..BodyFields::default()
    };
    skim::ws(s);
    if s.peek() == Some(b'{') {
        skim::object(s, |s, key| {
            // A member read is checked as text throughout, as a full parse builds it;
            // the others only as JSON.
            if key.is("model") {
                fields.family = family_value(s)?;
            } else if key.is("metadata") {
                fields.user_id = user_id_of_metadata(s)?;
            } else if key.is("client_metadata") {
                fields.client = client_metadata(s)?;
            } else if key.is("prompt_cache_key") {
                fields.prompt_cache_key = id_value(s)?;
            } else {
                skim::skip_value(s, Mode::Grammar)?;
            }
            Ok(())
        })?;
    } else {
        skim::skip_value(s, Mode::Grammar)?;
    }
    skim::ws(s);
    if skim::at_end(s) {
        Ok(fields)
    } else {
        Err(NotJson)
    }
}

/// A string value's text when it is at most `cap` bytes; a longer one is checked and
/// dropped as it is read, never held.
fn bounded_text(s: &mut impl Source, cap: usize) -> Result<Option<String>, NotJson> {
    let mut text = Vec::new();
    let mut over = false;
    skim::read_string(s, &mut |piece| {
        if over {
            return;
        }
        if text.len() + piece.len() > cap {
            over = true;
            text = Vec::new();
        } else {
            text.extend_from_slice(piece);
        }
    })?;
    Ok(if over {
        None
    } else {
        String::from_utf8(text).ok()
    })
}

/// The value next, when it is a string holding a valid id.
fn id_value(s: &mut impl Source) -> Result<Option<String>, NotJson> {
    if s.peek() == Some(b'"') {
        Ok(bounded_text(s, MAX_ID_BYTES)?.filter(|t| valid_id(t)))
    } else {
        skim::skip_value(s, Mode::Text)?;
        Ok(None)
    }
}

/// The ids of the members `names` of the value next, when it is an object.
fn ids_of<S: Source, const N: usize>(
    s: &mut S,
    names: [&str; N],
) -> Result<Option<[Option<String>; N]>, NotJson> {
    if s.peek() != Some(b'{') {
        skim::skip_value(s, Mode::Text)?;
        return Ok(None);
    }
    let mut ids: [Option<String>; N] = std::array::from_fn(|_| None);
    skim::object(s, |s, key| match names.iter().position(|n| key.is(n)) {
        Some(k) => {
            ids[k] = id_value(s)?;
            Ok(())
        }
        None => skim::skip_value(s, Mode::Text),
    })?;
    Ok(Some(ids))
}

/// The ids of a JSON document that is an object (whitespace around it); None when it is
/// not one (not JSON, or JSON of another kind).
fn document_ids<S: Source, const N: usize>(
    s: &mut S,
    names: [&str; N],
) -> Option<[Option<String>; N]> {
    skim::ws(s);
    if s.peek() != Some(b'{') {
        return None;
    }
    let ids = ids_of(s, names).ok()??;
    skim::ws(s);
    skim::at_end(s).then_some(ids)
}

/// The ids of the value next when it is an object, inline or as JSON text (a string that
/// holds a JSON object); `text` is handed a string's decoded contents as they are read.
fn ids_of_object_or_text<S: Source + Clone, const N: usize>(
    s: &mut S,
    names: [&str; N],
    text: &mut dyn FnMut(&[u8]),
) -> Result<Option<[Option<String>; N]>, NotJson> {
    if s.peek() != Some(b'"') {
        return ids_of(s, names);
    }
    let start = s.clone();
    skim::read_string(s, text)?;
    // Read again as a document of its own, decoded as it goes: the string is not held.
    let mut inner = start;
    inner.bump();
    Ok(document_ids(&mut Decoded::new(inner), names))
}

/// The family of the value next, when it is a string (read as it goes, not held).
fn family_value(s: &mut impl Source) -> Result<Option<Family>, NotJson> {
    if s.peek() != Some(b'"') {
        skim::skip_value(s, Mode::Text)?;
        return Ok(None);
    }
    let mut scan = FamilyScan::default();
    skim::read_string(s, &mut |piece| scan.feed(piece))?;
    Ok(Some(scan.family()))
}

/// [`Family::of`] over text fed in pieces: which family names it contains, ASCII case
/// ignored.
#[derive(Default)]
struct FamilyScan {
    /// The last eight bytes, lowercased, the latest lowest.
    last: u64,
    /// Which of [`FamilyScan::NAMES`] were seen.
    seen: [bool; 4],
}

/// Up to eight bytes as the low bytes of a word, the last lowest; and the mask of them.
const fn packed(text: &[u8]) -> (u64, u64) {
    let mut word = 0u64;
    let mut i = 0;
    while i < text.len() {
        word = (word << 8) | text[i] as u64;
        i += 1;
    }
    (word, u64::MAX >> (64 - 8 * text.len()))
}

impl FamilyScan {
    /// The names in [`Family::of`]'s order, packed ([`packed`]).
    const NAMES: [((u64, u64), Family); 4] = [
        (packed(b"fable"), Family::Fable),
        (packed(b"sonnet"), Family::Sonnet),
        (packed(b"opus"), Family::Opus),
        (packed(b"haiku"), Family::Haiku),
    ];

    fn feed(&mut self, piece: &[u8]) {
        for &b in piece {
            self.last = (self.last << 8) | u64::from(b.to_ascii_lowercase());
            for (k, ((name, mask), _)) in Self::NAMES.iter().enumerate() {
                if self.last & mask == *name {
                    self.seen[k] = true;
                }
            }
        }
    }

    fn family(&self) -> Family {
        Self::NAMES
            .iter()
            .zip(self.seen)
            .find(|(_, seen)| *seen)
            .map_or(Family::Other, |((_, family), _)| *family)
    }
}

/// What follows the last `_session_` of text fed in pieces, kept only while it could be a
/// valid id.
#[derive(Default)]
struct LegacyScan {
    /// The last bytes (the latest lowest), to find `_session_` across pieces.
    last: u128,
    /// Whether `_session_` was seen.
    found: bool,
    /// What followed the last one, while no longer than a valid id can be.
    suffix: Vec<u8>,
    /// It was longer.
    over: bool,
}

impl LegacyScan {
    const MARK: &'static [u8; 9] = b"_session_";

    fn feed(&mut self, piece: &[u8]) {
        let mark = Self::MARK
            .iter()
            .fold(0u128, |w, &c| (w << 8) | u128::from(c));
        let mask = (1u128 << (Self::MARK.len() * 8)) - 1;
        for &b in piece {
            self.last = (self.last << 8) | u128::from(b);
            if self.last & mask == mark {
                self.found = true;
                self.suffix.clear();
                self.over = false;
            } else if self.found && !self.over {
                if self.suffix.len() < MAX_ID_BYTES {
                    self.suffix.push(b);
                } else {
                    self.over = true;
                    self.suffix = Vec::new();
                }
            }
        }
    }

    /// The id after the last `_session_`, when it is valid.
    fn id(self) -> Option<String> {
        if !self.found || self.over {
            return None;
        }
        String::from_utf8(self.suffix)
            .ok()
            .filter(|id| valid_id(id))
    }
}

fn user_id_of_metadata<S: Source + Clone>(s: &mut S) -> Result<UserId, NotJson> {
    let mut user = UserId::default();
    if s.peek() != Some(b'{') {
        skim::skip_value(s, Mode::Text)?;
        return Ok(user);
    }
    skim::object(s, |s, key| {
        if key.is("user_id") {
            let is_text = s.peek() == Some(b'"');
            let mut legacy = LegacyScan::default();
            let object = ids_of_object_or_text(s, ["session_id", "parent_session_id"], &mut |p| {
                legacy.feed(p)
            })?;
            user = UserId {
                object,
                legacy: if is_text { legacy.id() } else { None },
            };
            Ok(())
        } else {
            skim::skip_value(s, Mode::Text)
        }
    })?;
    Ok(user)
}

fn client_metadata<S: Source + Clone>(s: &mut S) -> Result<ClientMetadata, NotJson> {
    let mut client = ClientMetadata::default();
    if s.peek() != Some(b'{') {
        skim::skip_value(s, Mode::Text)?;
        return Ok(client);
    }
    skim::object(s, |s, key| {
        if key.is("thread_id") {
            client.thread_id = id_value(s)?;
        } else if key.is("session_id") {
            client.session_id = id_value(s)?;
        } else if key.is("x-codex-parent-thread-id") {
            client.parent_thread_id = id_value(s)?;
        } else if key.is("x-codex-turn-metadata") {
            client.turn =
                ids_of_object_or_text(s, TURN_FIELDS, &mut |_| {})?.map(TurnMetadata::from_ids);
        } else {
            skim::skip_value(s, Mode::Text)?;
        }
        Ok(())
    })?;
    Ok(client)
}

/// Turn metadata given as a header's JSON text.
fn turn_of_header(text: &str) -> Option<TurnMetadata> {
    let chunk = [bytes::Bytes::copy_from_slice(text.as_bytes())];
    document_ids(&mut Cursor::new(&chunk), TURN_FIELDS).map(TurnMetadata::from_ids)
}

/// Claude: `metadata.user_id` — its JSON form's `session_id`, or the legacy
/// `user_<hash>_account_<uuid>_session_<uuid>` suffix — else the
/// `X-Claude-Code-Session-Id` header. Parent: the JSON form's `parent_session_id`.
pub fn extract_claude(headers: &Headers, body: &BodyFields) -> SessionInfo {
    let [from_json, parent] = body.user_id.object.clone().unwrap_or_default();
    let from_header = headers
        .get("x-claude-code-session-id")
        .filter(|s| valid_id(s))
        .map(str::to_owned);
    let id = from_json.or(body.user_id.legacy.clone()).or(from_header);
    let parent = parent
        .filter(|p| Some(p) != id.as_ref())
        .map(|p| session_key(&p));
    SessionInfo {
        key: id.map(|id| session_key(&id)),
        parent,
        family: body.family,
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
pub fn extract_codex(headers: &Headers, body: &BodyFields) -> SessionInfo {
    let header_turn = headers
        .get("x-codex-turn-metadata")
        .and_then(turn_of_header)
        .unwrap_or_default();
    let client = &body.client;
    let body_turn = client.turn.clone().unwrap_or_default();
    let header = |name: &str| headers.get(name).filter(|s| valid_id(s)).map(str::to_owned);

    let id = header("thread-id")
        .or(header_turn.thread_id)
        .or_else(|| client.thread_id.clone())
        .or(body_turn.thread_id)
        .or_else(|| header("session-id"))
        .or_else(|| header("session_id"))
        .or(header_turn.session_id)
        .or_else(|| client.session_id.clone())
        .or(body_turn.session_id);
    let key = match &id {
        Some(id) => Some(session_key(id)),
        None => body.prompt_cache_key.as_ref().map(|k| format!("cache:{k}")),
    };
    let parent = [
        header_turn.forked_from_thread_id,
        body_turn.forked_from_thread_id,
        header("x-codex-parent-thread-id"),
        header_turn.parent_thread_id,
        client.parent_thread_id.clone(),
        body_turn.parent_thread_id,
    ]
    .into_iter()
    .flatten()
    .find(|p| Some(p) != id.as_ref())
    .map(|p| session_key(&p));
    SessionInfo {
        key,
        parent,
        family: body.json.then_some(Family::Other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// The extraction as it was written over a parsed body (`serde_json::Value`): the
    /// reference the field reading must agree with.
    mod reference {
        use super::super::{Family, Headers, SessionInfo, session_key, valid_id};
        use serde_json::{Map, Value};

        /// The top-level body fields the extraction reads.
        pub const FIELDS: [&str; 4] = ["metadata", "model", "client_metadata", "prompt_cache_key"];

        /// The body as a skipping parse reads it: for a JSON object, an object of just
        /// its [`FIELDS`], each built by serde_json (the last of a repeated key); for other
        /// JSON, `null`; for a body that is not JSON, None. `Err` when serde_json refuses
        /// it for a limit the skim does not keep.
        pub fn read(body: &[u8]) -> Result<Option<Value>, ()> {
            use serde::de::{Deserializer as _, IgnoredAny, MapAccess, Visitor};
            struct Fields;
            impl<'de> Visitor<'de> for Fields {
                type Value = Value;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("JSON")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
                    let mut kept = Map::new();
                    while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                        if FIELDS.contains(&key.as_ref()) {
                            kept.insert(key.into_owned(), map.next_value::<Value>()?);
                        } else {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                    Ok(Value::Object(kept))
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(
                    self,
                    mut seq: A,
                ) -> Result<Value, A::Error> {
                    while seq.next_element::<IgnoredAny>()?.is_some() {}
                    Ok(Value::Null)
                }
                fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
                    Ok(Value::Null)
                }
                fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
                    Ok(Value::Null)
                }
                fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
                    Ok(Value::Null)
                }
                fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
                    Ok(Value::Null)
                }
                fn visit_str<E>(self, _: &str) -> Result<Value, E> {
                    Ok(Value::Null)
                }
                fn visit_borrowed_str<E>(self, _: &'de str) -> Result<Value, E> {
                    Ok(Value::Null)
                }
                fn visit_bytes<E>(self, _: &[u8]) -> Result<Value, E> {
                    Ok(Value::Null)
                }
                fn visit_unit<E>(self) -> Result<Value, E> {
                    Ok(Value::Null)
                }
            }
            // A top-level string is skipped, not built (serde_json would check its UTF-8).
            let mut de = serde_json::Deserializer::from_slice(body);
            let value = match body.iter().find(|b| !b" \n\r\t".contains(b)) {
                Some(b'{') => (&mut de).deserialize_any(Fields),
                _ => (&mut de)
                    .deserialize_ignored_any(IgnoredAny)
                    .map(|_| Value::Null),
            };
            let value = value.and_then(|v| de.end().map(|()| v));
            match value {
                Ok(v) => Ok(Some(v)),
                Err(e) if crate::skim::tests::is_unkept_limit(&e) => Err(()),
                Err(_) => Ok(None),
            }
        }

        /// The same limits in a document held in a string.
        pub fn unkept_limit_inside(body: Option<&Value>) -> bool {
            let texts = [
                body.and_then(|b| b.pointer("/metadata/user_id")),
                body.and_then(|b| b.pointer("/client_metadata/x-codex-turn-metadata")),
            ];
            texts
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .any(|s| {
                    serde_json::from_str::<Value>(s)
                        .is_err_and(|e| crate::skim::tests::is_unkept_limit(&e))
                })
        }

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

        pub fn claude(headers: &Headers, body: Option<&Value>) -> SessionInfo {
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

        pub fn codex(headers: &Headers, body: Option<&Value>) -> SessionInfo {
            let header_turn = headers
                .get("x-codex-turn-metadata")
                .and_then(|s| serde_json::from_str::<Value>(s).ok());
            let client_meta = body.and_then(|b| b.get("client_metadata"));
            let body_turn = client_meta
                .and_then(|c| c.get("x-codex-turn-metadata"))
                .and_then(object_or_json_string);
            let header = |name: &str| headers.get(name).filter(|s| valid_id(s)).map(str::to_owned);
            let field = |v: Option<&Value>, name: &str| {
                valid_str(v.and_then(|v| v.get(name))).map(str::to_owned)
            };
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
                None => valid_str(body.and_then(|b| b.get("prompt_cache_key")))
                    .map(|k| format!("cache:{k}")),
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

        /// Both providers' extraction from a parsed body.
        pub fn both(headers: &Headers, body: Option<&Value>) -> [SessionInfo; 2] {
            [claude(headers, body), codex(headers, body)]
        }
    }

    /// A body's bytes held as the glue holds them, its frames cut at `cuts`.
    fn hold(body: &[u8], cuts: &[usize]) -> RequestBody {
        let mut held = crate::body::Collector::new(u64::MAX, None);
        for c in &crate::skim::chunked(body, cuts) {
            held.push(c).unwrap();
        }
        held.finish()
    }

    /// Both providers' extraction from a body's bytes, cut into chunks at `cuts`.
    fn both(headers: &Headers, body: &[u8], cuts: &[usize]) -> [SessionInfo; 2] {
        let body = hold(body, cuts);
        [
            extract(Provider::Claude, headers, &body),
            extract(Provider::Codex, headers, &body),
        ]
    }

    /// The most reading a body's session may allocate, whatever the body: the few ids
    /// it keeps (each at most [`MAX_ID_BYTES`]) and their answers.
    const READ_BUDGET: usize = 24 << 10;

    /// How many places [`long_body`] knows.
    const LONG_PLACES: usize = 14;
    /// The place [`long_body`] nests arrays `long` deep.
    const DEEP_PLACE: usize = 13;

    /// A body with the text `long` at place `place` (where a session or model is read,
    /// or skipped), among the members of `others` (a JSON object's text).
    fn long_body(place: usize, long: &str, others: &str) -> Vec<u8> {
        let turn_text = |v: Value| Value::String(v.to_string());
        let member: (&str, Value) = match place {
            0 => ("model", json!(format!("claude-{long}"))),
            1 => ("metadata", json!({ "user_id": long })),
            2 => (
                "metadata",
                json!({ "user_id": turn_text(json!({ "session_id": long, "parent_session_id": "p" })) }),
            ),
            3 => (
                "metadata",
                json!({ "user_id": turn_text(json!({ "device_id": long, "session_id": "s-in-text" })) }),
            ),
            4 => (
                "metadata",
                json!({ "user_id": format!("user_a_session_{long}") }),
            ),
            5 => (
                "metadata",
                json!({ "user_id": format!("{long}_session_legacy-1") }),
            ),
            6 => (
                "metadata",
                json!({ "user_id": { "session_id": long, "parent_session_id": long } }),
            ),
            7 => (
                "client_metadata",
                json!({ "thread_id": long, "session_id": long, "x-codex-parent-thread-id": long }),
            ),
            8 => (
                "client_metadata",
                json!({ "x-codex-turn-metadata": turn_text(json!({ "thread_id": long, "session_id": "s-turn" })) }),
            ),
            9 => ("prompt_cache_key", json!(long)),
            10 => (long, json!(1)),
            11 => ("metadata", json!({ long: 1, "user_id": "u_session_k" })),
            12 => ("messages", json!([{ "role": "user", "content": long }])),
            _ => {
                let depth = long.len();
                let text = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
                let mut body = serde_json::to_vec(&json!({ "model": "claude-opus" })).unwrap();
                body.pop();
                body.extend_from_slice(b",\"messages\":");
                body.extend_from_slice(text.as_bytes());
                body.push(b'}');
                return body;
            }
        };
        let mut object = match serde_json::from_str::<Value>(others) {
            Ok(Value::Object(o)) => o,
            _ => serde_json::Map::new(),
        };
        object.insert(member.0.to_owned(), member.1);
        serde_json::to_vec(&Value::Object(object)).unwrap()
    }

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
            r#"{"metadata":{"user_id":{"session_id":"a"},"user_id":"{\"session_id\":\"b\"}_session_c"}}"#.into(),
            r#"{"metadata":{"user_id":"{\"session_id\":\" \",\"k\":\"_session_zz\"}"}}"#.into(),
            r#"{"prompt_cache_key":"pck","client_metadata":{"session_id":"c-1","x-codex-turn-metadata":"{\"thread_id\":\"t-1\",\"forked_from_thread_id\":\"f-1\"}"},"input":[1,2,3]}"#.into(),
            r#"{"client_metadata":{"x-codex-turn-metadata":" {\"session_id\":\"ws\"}\n"}}"#.into(),
            r#"{"client_metadata":{"x-codex-turn-metadata":"\u00a0{\"session_id\":\"nbsp\"}"}}"#.into(),
            r#"{"prompt_cache_key":"only-the-cache-key","input":{"deep":[[[[{"a":null}]]]]}}"#.into(),
            r#"{"model":null,"metadata":7}"#.into(),
            r#"{"model":"Claude-\u0053ONNET"}"#.into(),
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
            assert_eq!(
                both(&headers, body.as_bytes(), &[]),
                reference::both(&headers, full.as_ref()),
                "{body:.120}"
            );
            let fields = read_fields(&body.clone().into());
            assert_eq!(fields.json, full.is_some(), "{body:.80}");
        }
    }

    fn claude(headers: &[(&str, &str)], body: Value) -> SessionInfo {
        let mut h = Headers::new();
        for (n, v) in headers {
            h.push(n, *v);
        }
        extract(Provider::Claude, &h, &body.to_string().into())
    }

    fn codex(headers: &[(&str, &str)], body: Value) -> SessionInfo {
        let mut h = Headers::new();
        for (n, v) in headers {
            h.push(n, *v);
        }
        extract(Provider::Codex, &h, &body.to_string().into())
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
        let s = extract(Provider::Claude, &Headers::new(), &b"not json {"[..].into());
        assert_eq!(s, SessionInfo::default());
        let s = extract(
            Provider::Codex,
            &Headers::from([("session-id", "s")]),
            &b"\x00\xff"[..].into(),
        );
        assert_eq!(s.key.as_deref(), Some("session:s"), "headers still count");
    }

    #[test]
    fn family_scan_is_family_of_text_fed_in_any_pieces() {
        for text in [
            "claude-OPUS-4",
            "sonnet",
            "x-haiku-y",
            "fable-opus",
            "opu",
            "",
            "hAiKu",
        ] {
            for cut in 0..=text.len() {
                let mut scan = FamilyScan::default();
                scan.feed(&text.as_bytes()[..cut]);
                scan.feed(&text.as_bytes()[cut..]);
                assert_eq!(scan.family(), Family::of(text), "{text} cut at {cut}");
            }
        }
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

        /// Any headers and any body (damaged, not JSON, not an object), held in chunks
        /// cut anywhere: extraction never panics, does not depend on the cuts, and finds
        /// what a parse of the body gives the reference (a full parse, and a parse that
        /// builds only the fields read).
        #[test]
        fn extraction_agrees_with_a_parse_on_any_body(
            headers in any_headers(),
            body in props::body(),
            cuts in prop::collection::vec(any::<usize>(), 0..4),
        ) {
            let h = headers_of(&headers);
            let got = both(&h, &body, &cuts);
            prop_assert_eq!(&got, &both(&h, &body, &[]));
            if let Ok(full) = serde_json::from_slice::<Value>(&body)
                && !reference::unkept_limit_inside(Some(&full))
            {
                prop_assert_eq!(&got, &reference::both(&h, Some(&full)));
            }
            if let Ok(read) = reference::read(&body)
                && !reference::unkept_limit_inside(read.as_ref())
            {
                prop_assert_eq!(&got, &reference::both(&h, read.as_ref()));
            }
            for info in &got {
                for k in info.key.iter().chain(info.parent.iter()) {
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
            let bare = extract(Provider::Claude, &headers_of(&headers), &plain(vec![], vec![]).into());
            let mut noisy_headers = extra_headers;
            noisy_headers.extend(headers.iter().cloned());
            let noisy = extract(
                Provider::Claude,
                &headers_of(&noisy_headers),
                &plain(in_metadata, top).into(),
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
            let bare = extract(Provider::Codex, &headers_of(&headers), &build(vec![], vec![]).into());
            let mut noisy_headers = extra_headers;
            noisy_headers.extend(headers.iter().cloned());
            let noisy = extract(
                Provider::Codex,
                &headers_of(&noisy_headers),
                &build(if client.is_some() { in_client } else { vec![] }, top).into(),
            );
            prop_assert_eq!(&noisy, &bare);
            if headers.is_empty() && client.is_none() {
                let want = cache_key.filter(|k| valid_id(k)).map(|k| format!("cache:{k}"));
                prop_assert_eq!(&bare.key, &want);
            }
        }
    }

    proptest! {
        // Megabyte bodies: fewer cases than the other properties.
        #![proptest_config(ProptestConfig { cases: 32, ..props::config() })]

        /// A body up to megabytes with a long string (or key, or nesting) wherever the
        /// extraction reads — a model name, `metadata.user_id` in each of its forms, a
        /// Codex id, turn metadata held in a string — or skips, among any other members:
        /// reading it, for both providers, allocates no more than a fixed budget, and finds
        /// what a full parse of it gives the reference (a string over 512 characters is
        /// no id).
        #[test]
        fn reading_any_body_takes_a_fixed_budget(
            place in 0usize..LONG_PLACES,
            len in prop::sample::select(vec![513usize, 3_000, 70_000, 1 << 20]),
            piece in prop::sample::select(vec![
                "x", "é", "\n", "😀", "_session_", "Opus", "\"", "\\", "{", "\u{0}",
            ]),
            others in props::object_text(),
            cuts in prop::collection::vec(any::<usize>(), 0..3),
        ) {
            let long = piece.repeat(len / piece.len() + 1);
            let body = long_body(place, &long, &others);
            let mut h = Headers::new();
            h.push("x-claude-code-session-id", "h-1");
            h.push("thread-id", " ");
            let held = hold(&body, &cuts);
            let (got, peak) = props::alloc::peak(|| {
                [
                    extract(Provider::Claude, &h, &held),
                    extract(Provider::Codex, &h, &held),
                ]
            });
            prop_assert!(
                peak <= READ_BUDGET,
                "{} bytes to read a {}-byte body (place {})", peak, body.len(), place
            );
            match serde_json::from_slice::<Value>(&body) {
                Ok(full) if !reference::unkept_limit_inside(Some(&full)) => {
                    prop_assert_eq!(&got, &reference::both(&h, Some(&full)));
                }
                // Deeper than serde_json builds: JSON to the scanner up to its depth,
                // else not JSON (so session-less).
                _ if place == DEEP_PLACE => {
                    let json = long.len() <= crate::skim::MAX_DEPTH;
                    prop_assert_eq!(&got[0].key, &Some("session:h-1".to_owned()));
                    prop_assert_eq!(got[0].family, json.then_some(Family::Opus));
                    prop_assert_eq!(got[1].family, json.then_some(Family::Other));
                }
                _ => {}
            }
        }
    }
}
