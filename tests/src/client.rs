//! A small HTTP/1.1 client for tests: whole responses, or the head first and the body as it
//! streams.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// A whole response.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A keep-alive client.
#[derive(Clone)]
pub struct TestClient {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for TestClient {
    fn default() -> Self {
        Self::new()
    }
}

impl TestClient {
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        TestClient {
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }

    /// Send a request and return the response head; the body streams.
    pub async fn open(&self, request: Request<Full<Bytes>>) -> anyhow::Result<Response<Incoming>> {
        Ok(self.client.request(request).await?)
    }

    /// Send a request and read the whole response.
    pub async fn send(&self, request: Request<Full<Bytes>>) -> anyhow::Result<Answer> {
        let response = self.open(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }

    /// GET `url`.
    pub async fn get(&self, url: &str) -> anyhow::Result<Answer> {
        self.send(Request::get(url).body(Full::new(Bytes::new()))?)
            .await
    }

    /// GET `url` with a safety-net timeout (a hung request fails the test instead of hanging it).
    pub async fn get_within(&self, url: &str, limit: Duration) -> anyhow::Result<Answer> {
        tokio::time::timeout(limit, self.get(url))
            .await
            .map_err(|_| anyhow::anyhow!("GET {url} did not finish within {limit:?}"))?
    }
}
