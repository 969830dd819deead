//! How a command finds and talks to the running server: `DATA_DIR/server.json` (written by
//! `pooler serve`) says where it listens, `DATA_DIR/admin-token` is the bearer token, and
//! every call is one JSON request to the admin API (its shapes: [`crate::operate::wire`]). Both files are
//! trusted only when no one else can have written them, and only a loopback address is
//! called: the token goes with every call. A refused request becomes an [`ApiFailure`]
//! whose message is the server's.

use pooler_core::private_file::{Existing, create_private_file, read_private_file};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::operate::wire::{ADMIN_PREFIX, ADMIN_TOKEN_FILE};

/// The file in the data directory that says where the server listens.
pub const SERVER_FILE: &str = "server.json";

/// How long one admin call may take (a refresh reaches the provider).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// `--data-dir` and `--json`, shared by every command that talks to the server.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Data directory of the server to talk to (default: $POOLER_DATA_DIR, else the
    /// platform's data directory).
    #[arg(long, value_name = "DIR", global = true, display_order = 100)]
    pub data_dir: Option<PathBuf>,
    /// Print the admin API's JSON answer instead of text; a failure prints
    /// {"error": {"kind": …, "message": …}} on stdout, with the same exit code.
    #[arg(long, global = true, display_order = 101)]
    pub json: bool,
}

impl ClientArgs {
    /// Connect to the server serving the data directory.
    pub fn connect(&self) -> anyhow::Result<Client> {
        Client::connect(&super::data_dir(self.data_dir.clone())?)
    }

    /// Print `value` as JSON when `--json` was given, else run `text` on it with every
    /// string made visible (`format::visible_json`): an answer carries text from
    /// outside (upstream errors, labels, session ids), and no printer prints it raw.
    pub fn print(
        &self,
        value: &Value,
        text: impl FnOnce(&Value) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        if self.json {
            println!("{}", super::format::json_text(value, true));
            Ok(())
        } else {
            text(&super::format::visible_json(value))
        }
    }
}

/// `DATA_DIR/server.json`: where a running server listens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerFile {
    /// The base URL of the listener (`http://127.0.0.1:8787`).
    pub url: String,
    /// The server's process id.
    pub pid: u32,
}

impl ServerFile {
    /// This process, listening at `addr` (loopback when bound to every address).
    pub fn new(addr: SocketAddr) -> ServerFile {
        let mut addr = addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        ServerFile {
            url: format!("http://{addr}"),
            pid: std::process::id(),
        }
    }

    /// Write the file, readable by the owner only.
    pub fn write(&self, data_dir: &Path) -> anyhow::Result<()> {
        let path = data_dir.join(SERVER_FILE);
        let mut file = create_private_file(&path, Existing::Truncate)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let text = serde_json::to_string_pretty(self)?;
        std::io::Write::write_all(&mut file, text.as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// Read the file, trusted only when no one else can have written it (this user's,
    /// writable by no one else, not a link: [`read_private_file`]), else an error saying
    /// why; `None` when there is none (or it is not ours to understand).
    pub fn read(data_dir: &Path) -> anyhow::Result<Option<ServerFile>> {
        let path = data_dir.join(SERVER_FILE);
        match read_private_file(&path) {
            Ok(text) => Ok(serde_json::from_str(&text).ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(untrusted(&path, &e)),
        }
    }

    /// Where to reach the server: `url` as `pooler serve` writes it, `http://IP:PORT` with a
    /// loopback IP. Anything else (a name, another address, credentials, a path) is
    /// refused, since the commands send the admin token there.
    pub fn loopback_addr(&self) -> Result<SocketAddr, String> {
        let addr = self
            .url
            .strip_prefix("http://")
            .map(|rest| rest.strip_suffix('/').unwrap_or(rest))
            .and_then(|rest| rest.parse::<SocketAddr>().ok());
        match addr {
            Some(addr) if addr.ip().to_canonical().is_loopback() => Ok(addr),
            _ => Err(format!(
                "it names {:?}, not a loopback address (http://127.0.0.1:PORT), and the \
                 commands send the admin token only to this machine's loopback",
                self.url
            )),
        }
    }

    /// Remove the file if it still describes this server.
    pub fn remove_if_ours(&self, data_dir: &Path) {
        if matches!(Self::read(data_dir), Ok(Some(file)) if file == *self) {
            let _ = std::fs::remove_file(data_dir.join(SERVER_FILE));
        }
    }
}

/// The refusal of a file in the data directory someone else may have written.
fn untrusted(path: &Path, why: &dyn std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!(
        "not trusting {}: {why}. `pooler serve` writes it as yours alone (0600); someone else \
         may have replaced it: remove it and start `pooler serve` again",
        path.display()
    )
}

/// No server answers for the data directory (none started, or it stopped): the message says
/// how to start one.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct NoServer(pub String);

/// The admin API refused a request (or failed): its status, code and message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiFailure {
    /// The HTTP status of the answer.
    pub status: StatusCode,
    /// The stable error code (`no-such-account`, `invalid-provider`, …); `unknown` when the
    /// body carried none.
    pub code: String,
    /// What is wrong, for a person; `the server answered <status>` when the body said nothing.
    pub message: String,
}

/// A connection to the admin API of the server serving one data directory.
pub struct Client {
    http: HttpClient<HttpConnector, Full<Bytes>>,
    url: String,
    token: String,
    data_dir: PathBuf,
}

impl Client {
    /// Find the server serving `data_dir` (its `server.json` and admin token).
    pub fn connect(data_dir: &Path) -> anyhow::Result<Client> {
        let not_serving = || {
            NoServer(format!(
                "no pooler is serving {} (start it with `pooler serve`)",
                data_dir.display()
            ))
        };
        let server = ServerFile::read(data_dir)?.ok_or_else(not_serving)?;
        let addr = server
            .loopback_addr()
            .map_err(|why| untrusted(&data_dir.join(SERVER_FILE), &why))?;
        let token_path = data_dir.join(ADMIN_TOKEN_FILE);
        let token = match read_private_file(&token_path) {
            Ok(token) => token.trim().to_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_serving().into()),
            Err(e) => return Err(untrusted(&token_path, &e)),
        };
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        connector.set_nodelay(true);
        Ok(Client {
            http: HttpClient::builder(TokioExecutor::new()).build(connector),
            url: format!("http://{addr}"),
            token,
            data_dir: data_dir.to_owned(),
        })
    }

    /// The server's base URL (what routes point agents at).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `GET path`; see [`Client::call`].
    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(Method::GET, path, None).await
    }

    /// `POST path` with `body` as JSON; see [`Client::call`].
    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.call(Method::POST, path, Some(body)).await
    }

    /// `PUT path` with `body` as JSON; see [`Client::call`].
    pub async fn put(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.call(Method::PUT, path, Some(body)).await
    }

    /// `DELETE path`; see [`Client::call`].
    pub async fn delete(&self, path: &str) -> anyhow::Result<Value> {
        self.call(Method::DELETE, path, None).await
    }

    /// One call: `path` is relative to `/_pooler/` (segments already percent-encoded, see
    /// [`crate::operate::wire::percent_encode`]). A refusal is an [`ApiFailure`].
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let uri = format!("{}{ADMIN_PREFIX}{path}", self.url);
        let body = body.map(Value::to_string).unwrap_or_default();
        let request = Request::builder()
            .method(method)
            .uri(&uri)
            .header(AUTHORIZATION, format!("Bearer {}", self.token))
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .context("cannot build the admin request")?;
        let exchange = async {
            let response = self.http.request(request).await.map_err(|e| {
                NoServer(format!(
                    "no pooler is serving {} (start it with `pooler serve`): {} does not answer ({e})",
                    self.data_dir.display(),
                    self.url
                ))
            })?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .context("the server's answer was cut off")?
                .to_bytes();
            Ok::<_, anyhow::Error>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "the server did not answer within {}s",
                    CALL_TIMEOUT.as_secs()
                )
            })??;
        let value: Value = serde_json::from_slice(&bytes).with_context(|| {
            format!("the server answered {status} with something that is not JSON")
        })?;
        if status.is_success() {
            return Ok(value);
        }
        let error = &value["error"];
        Err(ApiFailure {
            status,
            code: error["code"].as_str().unwrap_or("unknown").to_owned(),
            message: error["message"]
                .as_str()
                .map_or_else(|| format!("the server answered {status}"), str::to_owned),
        }
        .into())
    }
}

/// Decode the field `name` of an answer into `T`.
pub fn field<T: serde::de::DeserializeOwned>(answer: &Value, name: &str) -> anyhow::Result<T> {
    serde_json::from_value(answer[name].clone())
        .with_context(|| format!("the server's answer has no valid `{name}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(url: &str) -> ServerFile {
        ServerFile {
            url: url.to_owned(),
            pid: 1,
        }
    }

    #[test]
    fn only_a_loopback_address_is_called() {
        for (url, addr) in [
            ("http://127.0.0.1:8787", "127.0.0.1:8787"),
            ("http://127.0.0.1:8787/", "127.0.0.1:8787"),
            ("http://127.1.2.3:9", "127.1.2.3:9"),
            ("http://[::1]:8787", "[::1]:8787"),
            ("http://[::ffff:127.0.0.1]:8787", "[::ffff:127.0.0.1]:8787"),
        ] {
            assert_eq!(
                file(url).loopback_addr(),
                Ok(addr.parse().unwrap()),
                "{url}"
            );
        }
        for url in [
            "http://0.0.0.0:8787",
            "http://[::]:8787",
            "http://192.0.2.1:8787",
            "http://10.0.0.1:8787",
            "http://[::ffff:192.0.2.1]:8787",
            "http://localhost:8787",
            "http://me@127.0.0.1:8787",
            "http://127.0.0.1:8787@192.0.2.1:80",
            "http://127.0.0.1:8787/admin",
            "http://127.0.0.1",
            "https://127.0.0.1:8787",
            "127.0.0.1:8787",
            "",
        ] {
            let why = file(url).loopback_addr().unwrap_err();
            assert!(why.contains("loopback"), "{url}: {why}");
        }
    }

    #[test]
    fn the_file_pooler_serve_writes_names_a_loopback_address() {
        for listen in ["127.0.0.1:8787", "0.0.0.0:8787", "[::]:8787", "[::1]:8787"] {
            let written = ServerFile::new(listen.parse().unwrap());
            assert!(written.loopback_addr().is_ok(), "{listen}: {}", written.url);
        }
    }
}
