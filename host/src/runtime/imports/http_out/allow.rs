//! The allow-list of hosts a plugin may reach: the configured entries ([`parse_entry`]),
//! and the origins a person granted by setting a URL, kept in the plugin's grants file.
//! Plain `http://` is refused to every host but loopback, whatever the list says.

use hyper::Uri;

/// A URL scheme the allow-list knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `http://`: allowed only to loopback hosts.
    Http,
    /// `https://`.
    Https,
}

impl Scheme {
    fn parse(text: &str) -> Option<Scheme> {
        match text.to_ascii_lowercase().as_str() {
            "http" => Some(Scheme::Http),
            "https" => Some(Scheme::Https),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    /// The port a URL of this scheme without one goes to.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// Whether `host` (as a URL writes it: lower case, an IPv6 address in brackets) is this
/// machine: `localhost`, 127.0.0.0/8 or ::1. Only such hosts may be reached over plain
/// `http://`; names that merely resolve to loopback do not count.
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" {
        return true;
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&host);
    bare.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// A host as a URL may name one: a bracketed IPv6 address, or a name / IPv4 address of
/// letters, digits, `-`, `.` and `_` (what the `http` crate accepts beyond that, like
/// `a[:]`, no connector resolves).
fn valid_host(host: &str) -> bool {
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        }
    }
}

/// One entry of an allow-list: a scheme, a host and a port (`None`: any port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The scheme the entry allows.
    pub scheme: Scheme,
    /// The host name or address, lowercase.
    pub host: String,
    /// The port; `None` allows any.
    pub port: Option<u16>,
}

impl Origin {
    /// The origin of an absolute `http(s)://` URL, with the scheme's default port when it
    /// names none. `None` for anything else (a duration, a number, `ftp://…`).
    pub fn of_url(url: &str) -> Option<Origin> {
        let uri = url.trim().parse::<Uri>().ok()?;
        Origin::of_uri(&uri)
    }

    fn of_uri(uri: &Uri) -> Option<Origin> {
        let scheme = Scheme::parse(uri.scheme_str()?)?;
        let host = uri.host().filter(|h| valid_host(h))?.to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(scheme.default_port());
        Some(Origin {
            scheme,
            host,
            port: Some(port),
        })
    }

    fn matches(&self, request: &Origin) -> bool {
        self.scheme == request.scheme
            && self.host == request.host
            && self.port.is_none_or(|p| Some(p) == request.port)
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}://{}:{port}", self.scheme.name(), self.host),
            None => write!(f, "{}://{}:*", self.scheme.name(), self.host),
        }
    }
}

/// Why an outgoing request or an allow-list entry is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowError {
    /// Plain `http://` to a host that is not this machine.
    #[error(
        "`{0}` is plain http:// to a host other than this machine; use https:// (http:// is allowed only to localhost, 127.0.0.0/8 and ::1)"
    )]
    PlainHttp(String),
    /// Not an entry the list understands.
    #[error(
        "`{0}` is not an allowed host: write `host`, `host:port` or `https://host[:port]` (`http://` only for loopback)"
    )]
    Malformed(String),
    /// A value that names an http(s) URL, but not one every reader takes the same way.
    #[error(
        "`{0}` is not a usable URL: accepted values are an absolute URL `http(s)://host[:port][/path]` with a host of letters, digits, `-`, `.` and `_` (or `[IPv6]`), a port from 1 to 65535, no `user@`, no percent-encoding in the host, and no backslash, space or control character"
    )]
    BadUrl(String),
}

/// Whether `value` is an `http(s)://` URL whose origin every parser reads the same way: a
/// host `valid_host` accepts, a port from 1 to 65535 when one is written, no userinfo,
/// and no backslash, whitespace or control character (NUL included) anywhere. A looser
/// value (`http://evil.example\@127.0.0.1/`, `http://127.0.0.1:99999/`) is read as one
/// origin by one parser and another by the next, or by none: it would be granted one
/// origin and fail every request sent to it.
pub fn strict_url(value: &str) -> bool {
    let lower = value.get(..8).unwrap_or(value).to_ascii_lowercase();
    let Some(rest) = (if lower.starts_with("https://") {
        value.get(8..)
    } else if lower.starts_with("http://") {
        value.get(7..)
    } else {
        None
    }) else {
        return false;
    };
    if value
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '\\')
    {
        return false;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return false;
    }
    // The port is what follows the last `:` outside an IPv6 address's brackets.
    let after_host = authority.rfind(']').map_or(0, |at| at + 1);
    let (host, port) = match authority[after_host..].rfind(':') {
        Some(at) => (
            &authority[..after_host + at],
            Some(&authority[after_host + at + 1..]),
        ),
        None => (authority, None),
    };
    let port_ok = port.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u32>().is_ok_and(|n| (1..=65_535).contains(&n))
    });
    valid_host(host) && port_ok
}

/// Whether `value` looks like an http(s) URL at all (so it must be a [`strict_url`]).
fn names_a_url(value: &str) -> bool {
    let lower = value.get(..8).unwrap_or(value).to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// Parse one configured entry into the origins it allows:
///
/// - `https://host[:port]`, `http://host[:port]`: that scheme, host and port (the scheme's
///   default port when none is given); `http://` only to loopback.
/// - `host:port`: `https` at that port (and `http` too when the host is loopback).
/// - `host`: `https` at 443; a loopback host (`127.0.0.1`, `localhost`, `[::1]`) at any port,
///   `http` or `https` (the tests' fake upstreams and local gateways sit on loopback ports).
pub fn parse_entry(entry: &str) -> Result<Vec<Origin>, AllowError> {
    let malformed = || AllowError::Malformed(entry.to_string());
    let text = entry.trim().to_ascii_lowercase();
    if text.is_empty() {
        return Err(malformed());
    }
    if text.contains("://") {
        let uri = text.parse::<Uri>().map_err(|_| malformed())?;
        let path_ok = uri
            .path_and_query()
            .is_none_or(|p| p.as_str().is_empty() || p.as_str() == "/");
        let origin = Origin::of_uri(&uri)
            .filter(|_| path_ok && !text.contains('@'))
            .ok_or_else(malformed)?;
        if origin.scheme == Scheme::Http && !is_loopback(&origin.host) {
            return Err(AllowError::PlainHttp(entry.to_string()));
        }
        return Ok(vec![origin]);
    }
    if text.contains(['/', '@', '?', '#']) || text.contains(char::is_whitespace) {
        return Err(malformed());
    }
    // `[v6]:port`, `host:port`, or a bare host (a bare IPv6 address has colons but no
    // brackets: written as such it is taken whole).
    let (host, port) = match text.rfind(':') {
        Some(i) if !text[..i].contains(':') || text[..i].ends_with(']') => {
            let port = text[i + 1..].parse::<u16>().map_err(|_| malformed())?;
            (text[..i].to_string(), Some(port))
        }
        _ => (text.clone(), None),
    };
    let host = match host.parse::<std::net::Ipv6Addr>() {
        Ok(_) => format!("[{host}]"),
        Err(_) => host,
    };
    if !valid_host(&host) {
        return Err(malformed());
    }
    let loopback = is_loopback(&host);
    let https = Origin {
        scheme: Scheme::Https,
        host: host.clone(),
        port: match (port, loopback) {
            (Some(port), _) => Some(port),
            (None, true) => None,
            (None, false) => Some(Scheme::Https.default_port()),
        },
    };
    let mut origins = vec![https.clone()];
    if loopback {
        origins.push(Origin {
            scheme: Scheme::Http,
            ..https
        });
    }
    Ok(origins)
}

/// The origins one plugin may call: scheme, host and port, case-insensitive.
///
/// Two sources: the configuration's `allowed-hosts` (see [`parse_entry`]), and the URLs a
/// person set as the plugin's settings through the admin API (`pooler config set
/// pool.claude-upstream-url …`). Each such setting grants exactly the scheme, host and
/// port of the value the person gave (not of what the plugin stored or answered), and a
/// new value of the same setting replaces its grant (a value that is not a URL revokes
/// it). The grants are kept in a file in the plugin's directory, `KEY ORIGIN` a line, so
/// they survive a restart. A plugin cannot grant itself anything: only the host's admin
/// path grants. Plain `http://` is refused to every host but loopback, whatever the list
/// says.
#[derive(Debug, Default)]
pub struct AllowList {
    entries: Vec<Origin>,
    granted: std::sync::RwLock<Vec<Grant>>,
    grants_file: Option<std::path::PathBuf>,
}

/// A person's grant: the setting it came from (empty for a line of the file's old,
/// keyless format) and what it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Grant {
    key: String,
    origins: Vec<Origin>,
}

/// Configured entries that do not parse are dropped with a warning (the configuration is
/// validated at load, so this is only for a list built by hand).
fn parse_entries(entries: &[String]) -> Vec<Origin> {
    entries
        .iter()
        .filter(|entry| !entry.trim().is_empty())
        .flat_map(|entry| match parse_entry(entry) {
            Ok(origins) => origins,
            Err(e) => {
                tracing::warn!(error = %e, "allowed-hosts entry ignored");
                Vec::new()
            }
        })
        .collect()
}

/// One line of the grants file: `KEY ORIGIN` (`claude-upstream-url https://api.test:443`),
/// or an old keyless `host:port` line (read as the configured entry `host:port` would be).
fn parse_grant(line: &str) -> Option<Grant> {
    let line = line.trim();
    if line.is_empty() {
        return None;
    }
    match line.split_once(' ') {
        Some((key, url)) => {
            let origin = Origin::of_url(url)?;
            Some(Grant {
                key: key.to_string(),
                origins: vec![origin],
            })
        }
        None => Some(Grant {
            key: String::new(),
            origins: parse_entry(line).ok()?,
        }),
    }
}

impl AllowList {
    /// The list of the configured `entries` (see [`parse_entry`]), with no grants; an entry that
    /// does not parse is dropped with a warning.
    pub fn new(entries: &[String]) -> Self {
        AllowList {
            entries: parse_entries(entries),
            ..AllowList::default()
        }
    }

    /// The configured `entries` plus the grants kept in `grants_file` (a missing file is no
    /// grants). A file someone else could have written (another user's, one others can
    /// write, a symbolic link) is an error: it would grant their hosts.
    pub fn with_grants(
        entries: &[String],
        grants_file: std::path::PathBuf,
    ) -> anyhow::Result<Self> {
        let granted = match pooler_core::private_file::read_private_file(&grants_file) {
            Ok(text) => text.lines().filter_map(parse_grant).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(anyhow::anyhow!(
                    "cannot read {}: {e}",
                    grants_file.display()
                ));
            }
        };
        Ok(AllowList {
            entries: parse_entries(entries),
            granted: std::sync::RwLock::new(granted),
            grants_file: Some(grants_file),
        })
    }

    /// Check a value a person is about to give setting `key`, before the plugin stores it:
    /// a value that names an http(s) URL must be a [`strict_url`], and a plain `http://` URL
    /// to a host other than loopback is refused.
    pub fn check_value(value: &str) -> Result<(), AllowError> {
        let text = value.trim();
        if names_a_url(text) && !strict_url(text) {
            return Err(AllowError::BadUrl(text.to_string()));
        }
        match Origin::of_url(value) {
            Some(origin) if origin.scheme == Scheme::Http && !is_loopback(&origin.host) => {
                Err(AllowError::PlainHttp(value.trim().to_string()))
            }
            _ => Ok(()),
        }
    }

    /// A person set setting `key` to `value`: if `value` is an absolute http(s) URL, its
    /// scheme, host and port replace whatever the setting granted before; any other value
    /// revokes the setting's grant. The grants file is rewritten (atomically) when anything
    /// changed. Returns what the setting grants now.
    pub fn set_grant(&self, key: &str, value: &str) -> anyhow::Result<Option<Origin>> {
        Self::check_value(value)?;
        let origin = Origin::of_url(value);
        let mut granted = self.granted.write().unwrap_or_else(|e| e.into_inner());
        let before = granted.clone();
        granted.retain(|g| g.key != key);
        if let Some(origin) = &origin {
            granted.push(Grant {
                key: key.to_string(),
                origins: vec![origin.clone()],
            });
        }
        if *granted == before {
            return Ok(origin);
        }
        if let Err(e) = self.save(&granted) {
            *granted = before;
            return Err(e);
        }
        Ok(origin)
    }

    fn save(&self, granted: &[Grant]) -> anyhow::Result<()> {
        let Some(file) = &self.grants_file else {
            return Ok(());
        };
        let mut text = String::new();
        for grant in granted {
            for origin in &grant.origins {
                if grant.key.is_empty() {
                    // An old keyless line stays as it was written.
                    let port = origin.port.map(|p| format!(":{p}")).unwrap_or_default();
                    text.push_str(&format!("{}{port}\n", origin.host));
                    break;
                }
                text.push_str(&format!("{} {origin}\n", grant.key));
            }
        }
        if let Some(dir) = file.parent() {
            pooler_core::private_file::create_private_dir(dir)
                .map_err(|e| anyhow::anyhow!("cannot use {}: {e}", dir.display()))?;
        }
        // Written aside (0600, like every file in the data directory) and renamed over: a
        // crash leaves the old list or the new one.
        let partial = file.with_extension("partial");
        pooler_core::private_file::create_private_file(
            &partial,
            pooler_core::private_file::Existing::Truncate,
        )
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
        .and_then(|()| std::fs::rename(&partial, file))
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", file.display()))
    }

    /// Whether a request to `uri` may be sent: its scheme, host and port are on the list,
    /// and it is not plain `http://` to a host other than loopback.
    pub fn allows(&self, uri: &Uri) -> bool {
        self.check(uri).is_ok()
    }

    /// [`Self::allows`], with the rule a refused request broke.
    pub fn check(&self, uri: &Uri) -> Result<(), &'static str> {
        let Some(request) = Origin::of_uri(uri) else {
            return Err("not an absolute http(s) URL");
        };
        if request.scheme == Scheme::Http && !is_loopback(&request.host) {
            return Err("plain http:// is allowed only to loopback");
        }
        let listed = self.entries.iter().any(|o| o.matches(&request))
            || self
                .granted
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|g| g.origins.iter().any(|o| o.matches(&request)));
        if listed {
            Ok(())
        } else {
            Err("the scheme, host and port are not on the plugin's allowed-hosts list")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn the_default_list_denies_everything() {
        assert!(!AllowList::default().allows(&uri("http://127.0.0.1:1/")));
    }

    #[test]
    fn entries_match_scheme_host_and_port() {
        let list = AllowList::new(&[
            "API.example.com".into(),
            "alt.example.com:8443".into(),
            "https://tls.example.com".into(),
            "127.0.0.1:8080".into(),
            "[::1]:9".into(),
            "localhost".into(),
        ]);
        // A bare host: https on 443 only.
        assert!(list.allows(&uri("https://api.example.com/v1")));
        assert!(list.allows(&uri("https://api.example.com:443/v1")));
        assert!(!list.allows(&uri("https://api.example.com:444/")));
        assert!(!list.allows(&uri("http://api.example.com/")), "plain http");
        assert!(!list.allows(&uri("http://api.example.com:443/")), "scheme");
        // host:port: https on that port.
        assert!(list.allows(&uri("https://alt.example.com:8443/")));
        assert!(!list.allows(&uri("https://alt.example.com/")));
        assert!(!list.allows(&uri("http://alt.example.com:8443/")));
        assert!(list.allows(&uri("https://tls.example.com/")));
        assert!(!list.allows(&uri("https://tls.example.com:8443/")));
        // Loopback: http as well, on the port given (or any, for a bare loopback host).
        assert!(list.allows(&uri("http://127.0.0.1:8080/x")));
        assert!(list.allows(&uri("https://127.0.0.1:8080/x")));
        assert!(!list.allows(&uri("http://127.0.0.1:8081/x")));
        assert!(!list.allows(&uri("http://127.0.0.1/x")));
        assert!(list.allows(&uri("http://[::1]:9/")));
        assert!(list.allows(&uri("http://localhost:4567/")));
        assert!(list.allows(&uri("https://LOCALHOST:1/")));
        assert!(!list.allows(&uri("https://evil.example.com/")));
        assert!(!list.allows(&uri("https://api.example.com.evil.test/")));
    }

    #[test]
    fn only_loopback_hosts_count_as_loopback() {
        for host in [
            "localhost",
            "LocalHost",
            "localhost.",
            "127.0.0.1",
            "127.255.0.9",
            "[::1]",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "128.0.0.1",
            "10.0.0.1",
            "[::2]",
            "localhost.evil.test",
            "127.0.0.1.evil.test",
            "0.0.0.0",
            "",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn plain_http_is_refused_beyond_loopback_whatever_the_list_says() {
        assert_eq!(
            parse_entry("http://api.example.com"),
            Err(AllowError::PlainHttp("http://api.example.com".into()))
        );
        assert!(parse_entry("http://127.0.0.1:9100").is_ok());
        for bad in [
            "",
            "a b",
            "https://x/path",
            "https://u@x",
            "x:notaport",
            "ftp://x",
        ] {
            assert!(parse_entry(bad).is_err(), "{bad:?}");
        }
        let list = AllowList::new(&["api.example.com:80".into()]);
        assert_eq!(
            list.check(&uri("http://api.example.com/")),
            Err("plain http:// is allowed only to loopback")
        );
        assert!(AllowList::check_value("http://api.example.com/v1").is_err());
        assert!(AllowList::check_value("http://127.0.0.1:9/v1").is_ok());
        assert!(AllowList::check_value("https://api.example.com/v1").is_ok());
        assert!(AllowList::check_value("20s").is_ok(), "not a URL");
    }

    /// A value that names an http(s) URL but not one every parser reads alike is refused
    /// before anything stores or grants it; well-formed ones pass.
    #[test]
    fn a_loose_url_value_is_refused_before_it_is_stored_or_granted() {
        for bad in [
            "http://127.0.0.1:99999/",
            "http://127.0.0.1:0/",
            "http://127.0.0.1:/",
            "http://evil.example\\@127.0.0.1/",
            "http://user@127.0.0.1/",
            "http://127.0.0.1%00.evil.example/",
            "http://127.0.0.1\0/",
            "HTTPS://api.example.com/a\\b",
            "https://[::1/",
            "https://",
        ] {
            assert_eq!(
                AllowList::check_value(bad),
                Err(AllowError::BadUrl(bad.trim().to_string())),
                "{bad:?}"
            );
            assert!(!strict_url(bad), "{bad:?}");
        }
        for good in [
            "http://127.0.0.1:65535/v1",
            "https://api.anthropic.com",
            "https://[::1]:8443/x?y=%20",
            "HTTPS://chatgpt.com/backend-api/codex",
            "http://localhost",
        ] {
            assert!(strict_url(good), "{good:?}");
            assert_eq!(AllowList::check_value(good), Ok(()), "{good:?}");
        }
        let list = AllowList::new(&[]);
        assert!(
            list.set_grant("upstream", "http://127.0.0.1:99999/")
                .is_err()
        );
        assert!(
            !list.allows(&uri("http://127.0.0.1:80/")),
            "nothing granted"
        );
    }

    #[test]
    fn a_granted_url_opens_its_origin_and_survives_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plugin").join("allowed-hosts");
        let list = AllowList::with_grants(&["api.example.com".to_string()], file.clone()).unwrap();
        assert!(!list.allows(&uri("http://127.0.0.1:9100/v1")));
        assert_eq!(list.set_grant("wait", "20s").unwrap(), None, "not a URL");
        assert_eq!(list.set_grant("x", "ftp://127.0.0.1/").unwrap(), None);
        assert!(
            list.set_grant("upstream", "http://127.0.0.1:9100")
                .unwrap()
                .is_some()
        );
        assert!(
            list.set_grant("token", "https://Upstream.Test/base")
                .unwrap()
                .is_some()
        );
        assert!(list.allows(&uri("http://127.0.0.1:9100/v1/messages")));
        assert!(
            !list.allows(&uri("http://127.0.0.1:9101/")),
            "only the granted port"
        );
        assert!(
            !list.allows(&uri("https://127.0.0.1:9100/")),
            "only the granted scheme"
        );
        assert!(list.allows(&uri("https://upstream.test/x")));
        assert!(
            !list.allows(&uri("https://upstream.test:8443/x")),
            "443 was granted"
        );
        assert!(
            list.allows(&uri("https://api.example.com/")),
            "configured hosts stay"
        );

        let reloaded = AllowList::with_grants(&[], file).unwrap();
        assert!(reloaded.allows(&uri("http://127.0.0.1:9100/v1")));
        assert!(reloaded.allows(&uri("https://upstream.test/")));
        assert!(!reloaded.allows(&uri("https://api.example.com/")));
    }

    #[test]
    fn a_new_value_revokes_the_setting_s_old_grant_and_keeps_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("allowed-hosts");
        let list = AllowList::with_grants(&[], file.clone()).unwrap();
        list.set_grant("upstream", "https://old.test/v1").unwrap();
        list.set_grant("token", "https://tokens.test/oauth")
            .unwrap();
        assert!(list.allows(&uri("https://old.test/v1/messages")));

        list.set_grant("upstream", "https://new.test/v1").unwrap();
        assert!(
            !list.allows(&uri("https://old.test/v1/messages")),
            "revoked"
        );
        assert!(list.allows(&uri("https://new.test/v1/messages")));
        assert!(
            list.allows(&uri("https://tokens.test/oauth")),
            "another key"
        );

        // Two settings on one origin: changing one leaves the other's grant.
        list.set_grant("token", "https://new.test/oauth").unwrap();
        list.set_grant("upstream", "https://third.test").unwrap();
        assert!(list.allows(&uri("https://new.test/oauth")));

        // A value that is not a URL revokes too; and so it is after a restart.
        list.set_grant("token", "off").unwrap();
        assert!(!list.allows(&uri("https://new.test/oauth")));
        let reloaded = AllowList::with_grants(&[], file.clone()).unwrap();
        assert!(!reloaded.allows(&uri("https://old.test/")));
        assert!(!reloaded.allows(&uri("https://new.test/")));
        assert!(reloaded.allows(&uri("https://third.test/")));
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "upstream https://third.test:443\n"
        );

        // Plain http beyond loopback is never granted.
        assert!(list.set_grant("upstream", "http://third.test").is_err());
        assert!(list.allows(&uri("https://third.test/")), "nothing changed");
    }

    /// The grants file is private (0600) however it was written, and one someone else could
    /// have written is not read: it would grant their hosts.
    #[cfg(unix)]
    #[test]
    fn the_grants_file_is_private_and_one_others_could_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plugin").join("allowed-hosts");
        let list = AllowList::with_grants(&[], file.clone()).unwrap();
        list.set_grant("upstream", "https://mine.test").unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode();
        assert_eq!(mode(&file) & 0o777, 0o600);
        assert_eq!(mode(file.parent().unwrap()) & 0o777, 0o700);

        std::fs::write(&file, "upstream https://theirs.test:443\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = AllowList::with_grants(&[], file.clone()).unwrap_err();
        assert!(e.to_string().contains("writable by others"), "{e}");

        let planted = dir.path().join("planted");
        std::fs::rename(&file, &planted).unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&planted, &file).unwrap();
        let e = AllowList::with_grants(&[], file.clone()).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
    }

    /// A grants file of the earlier, keyless format (`host:port` lines) still loads: each
    /// line as the configured entry `host:port` would be.
    #[test]
    fn an_old_keyless_grants_file_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("allowed-hosts");
        std::fs::write(&file, "127.0.0.1:9100\nupstream.test:443\n").unwrap();
        let list = AllowList::with_grants(&[], file.clone()).unwrap();
        assert!(list.allows(&uri("http://127.0.0.1:9100/")));
        assert!(list.allows(&uri("https://upstream.test/")));
        assert!(!list.allows(&uri("http://upstream.test:443/")));
        list.set_grant("k", "https://k.test").unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(
            text,
            "127.0.0.1:9100\nupstream.test:443\nk https://k.test:443\n"
        );
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        fn url_like() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<String>(),
                (
                    prop_oneof![
                        Just("http"),
                        Just("https"),
                        Just("HTTPS"),
                        Just("ftp"),
                        Just("")
                    ],
                    "[a-zA-Z0-9.\\[\\]:@-]{0,24}",
                    proptest::option::of(any::<u16>()),
                    "[a-z/?#%]{0,8}",
                )
                    .prop_map(|(scheme, host, port, path)| match port {
                        Some(port) => format!("{scheme}://{host}:{port}{path}"),
                        None => format!("{scheme}://{host}{path}"),
                    }),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any text as a configured entry, a setting's value or a request's URL: no panic;
            /// an entry that parses never allows plain http beyond loopback.
            #[test]
            fn any_entry_or_url_is_parsed_or_refused(text in url_like()) {
                if let Ok(origins) = parse_entry(&text) {
                    for o in origins {
                        prop_assert!(o.scheme == Scheme::Https || is_loopback(&o.host), "{o}");
                    }
                }
                let _ = AllowList::check_value(&text);
                let list = AllowList::new(std::slice::from_ref(&text));
                if let Ok(uri) = text.parse::<Uri>() {
                    let _ = list.check(&uri);
                }
            }

            /// A granted URL allows exactly its own origin: the same URL, and nothing with
            /// another scheme or port.
            #[test]
            fn a_grant_allows_its_origin_and_no_other(text in url_like()) {
                let list = AllowList::default();
                let Ok(Some(origin)) = list.set_grant("k", &text) else { return Ok(()) };
                let port = origin.port.unwrap();
                let same = format!("{}://{}:{port}/x", origin.scheme.name(), origin.host);
                prop_assert!(list.allows(&same.parse().unwrap()), "{same}");
                let other_port = format!("{}://{}:{}/x", origin.scheme.name(), origin.host, port.wrapping_add(1));
                prop_assert!(!list.allows(&other_port.parse().unwrap()));
                if is_loopback(&origin.host) {
                    let other = match origin.scheme { Scheme::Http => "https", Scheme::Https => "http" };
                    let other_scheme = format!("{other}://{}:{port}/x", origin.host);
                    prop_assert!(!list.allows(&other_scheme.parse().unwrap()));
                }
            }
        }
    }
}
