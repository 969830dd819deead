//! HTTP/1.1 on a bare socket, for what a well-behaved client or server never sends: a
//! `CONNECT` to the pool, a body that trickles or a head too large for the listener, and an
//! upstream that answers `101 Switching Protocols` to a plain `POST`.
//! [`blocking`] has the same on plain threads, for the tests that drive a `pooler serve`
//! process: raw-socket fake upstreams and one-shot requests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server sent back on a raw connection, and whether it closed it.
#[derive(Debug)]
pub struct RawAnswer {
    /// Everything read, as text (lossy).
    pub text: String,
    /// The server closed the connection (EOF or reset) before the read gave up.
    pub closed: bool,
}

impl RawAnswer {
    /// The status code of the first response line (`HTTP/1.1 405 …` → 405), if any.
    pub fn status(&self) -> Option<u16> {
        self.text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
    }

    /// The first value of header `name` (case-insensitive) in the response head.
    pub fn header(&self, name: &str) -> Option<&str> {
        let head = self.text.split("\r\n\r\n").next()?;
        head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// The response body (everything after the head; chunk framing left as sent).
    pub fn body(&self) -> &str {
        self.text.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }
}

/// Connect to `addr`, send `request` as is, and read until the server closes the connection
/// or `within` passes (a safety net, not a timer under test). A server that answers and
/// closes before the whole request is written is read all the same.
pub async fn exchange(addr: SocketAddr, request: &[u8], within: Duration) -> RawAnswer {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let _ = stream.write_all(request).await;
    read_answer(&mut stream, within).await
}

/// Read what the server sends on `stream` until it closes the connection or `within` passes.
pub async fn read_answer(stream: &mut TcpStream, within: Duration) -> RawAnswer {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let deadline = tokio::time::Instant::now() + within;
    let closed = loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => break false,
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    };
    RawAnswer {
        text: String::from_utf8_lossy(&out).into_owned(),
        closed,
    }
}

/// An upstream that answers every request with the same raw bytes and closes the
/// connection; it counts the requests it answered. It stops when dropped.
pub struct RawUpstream {
    addr: SocketAddr,
    answered: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawUpstream {
    /// Answer each request (its head, and its body by `content-length`) with `reply`.
    pub async fn start(reply: Vec<u8>) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let answered = Arc::new(AtomicUsize::new(0));
        let count = answered.clone();
        let reply = Arc::new(reply);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    continue;
                };
                let (count, reply) = (count.clone(), reply.clone());
                tokio::spawn(async move {
                    if read_request(&mut stream).await {
                        count.fetch_add(1, Ordering::SeqCst);
                        let _ = stream.write_all(&reply).await;
                        let _ = stream.shutdown().await;
                    }
                });
            }
        });
        RawUpstream {
            addr,
            answered,
            task,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many requests it answered.
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }
}

/// Read one request (head, then `content-length` bytes of body); false when the connection
/// ended first.
async fn read_request(stream: &mut TcpStream) -> bool {
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while data.len() < head_end + length {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    }
    true
}

/// The same on blocking sockets, for the tests that drive a real `pooler serve` process from
/// plain threads: a raw-socket fake upstream that reads whole requests and refuses what the
/// real Anthropic API refuses, and a one-shot HTTP/1.1 request.
pub mod blocking {
    use std::io::{BufRead, BufReader, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// The refusal the real Anthropic API would give a request a raw-socket fake received (the
    /// strict rules of `pooler_tests::provider`), as HTTP/1.1 bytes; `None` when it would serve
    /// it. The fakes of these tests answer with it instead of their own reply.
    pub fn claude_refusal(
        method: &str,
        path: &str,
        headers: &std::collections::HashMap<String, String>,
        body: &[u8],
    ) -> Option<Vec<u8>> {
        let received = crate::upstream::Received {
            method: method.to_owned(),
            path: path.to_owned(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect(),
            body: body.to_vec().into(),
        };
        crate::provider::refusal(crate::provider::Contract::Api, &received)
            .map(|reply| reply.to_http1())
    }

    /// The body of a request a raw-socket fake is reading, after its head: `content-length`
    /// bytes, or the chunks of a `transfer-encoding: chunked` body (how the pool's wasi:http
    /// requests arrive). `None` when the connection ends first.
    pub fn read_body(
        reader: &mut impl std::io::BufRead,
        headers: &std::collections::HashMap<String, String>,
    ) -> Option<Vec<u8>> {
        let chunked = headers
            .get("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        if !chunked {
            let length = headers
                .get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; length];
            reader.read_exact(&mut body).ok()?;
            return Some(body);
        }
        let mut body = Vec::new();
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                return Some(body);
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }

    /// One request a raw-socket fake upstream read: the request line's method and path, the
    /// headers (names lower-cased) and the whole body ([`read_body`]).
    #[derive(Debug, Clone)]
    pub struct RawRequest {
        pub method: String,
        pub path: String,
        pub headers: std::collections::HashMap<String, String>,
        pub body: Vec<u8>,
    }

    /// Read one request from a fake upstream's connection; `None` when the connection ends
    /// before the request does.
    pub fn read_request(reader: &mut impl BufRead) -> Option<RawRequest> {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        let mut words = line.split_whitespace();
        let method = words.next().unwrap_or("").to_owned();
        let path = words.next().unwrap_or("").to_owned();
        let mut headers = std::collections::HashMap::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return None;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
            }
        }
        let body = read_body(reader, &headers)?;
        Some(RawRequest {
            method,
            path,
            headers,
            body,
        })
    }

    /// One HTTP/1.1 request over a plain socket (`Connection: close`); the status and the body.
    pub fn http(
        addr: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut request =
            format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        std::io::Read::read_to_string(&mut stream, &mut response).unwrap();
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }

    /// A fake Messages API on loopback that refuses what the real one refuses
    /// ([`claude_refusal`]) and answers every other request 429 with `Retry-After: 3600`. Its
    /// URL, and how many requests got the 429.
    pub fn rate_limited_claude() -> (String, Arc<AtomicUsize>) {
        let limited = Arc::new(AtomicUsize::new(0));
        let count = limited.clone();
        let url = strict_claude(move |_, stream| {
            count.fetch_add(1, Ordering::SeqCst);
            write_rate_limited(stream);
        });
        (url, limited)
    }

    /// The real API's answer to a request over the per-minute limit: 429 with `Retry-After:
    /// 3600`, and the connection closed.
    pub fn write_rate_limited(stream: &mut impl Write) {
        let answer = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#;
        let _ = write!(
            stream,
            "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
             retry-after: 3600\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
            answer.len()
        );
    }

    /// A loopback listener that hands every connection to `handle`, each on a thread of its
    /// own; its URL (`http://127.0.0.1:PORT`).
    pub fn serve_each(handle: impl Fn(TcpStream) + Send + Sync + 'static) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let handle = Arc::new(handle);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let handle = handle.clone();
                std::thread::spawn(move || handle(stream));
            }
        });
        url
    }

    /// A loopback receiver (a webhook's, say) that takes one connection at a time, keeps each
    /// request it reads whole and answers it `status` with no body; its URL and the requests
    /// so far.
    pub fn receiver(status: u16) -> (String, Arc<Mutex<Vec<RawRequest>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let keep = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                if let Some(request) = read_request(&mut reader) {
                    keep.lock().unwrap().push(request);
                }
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
            }
        });
        (url, seen)
    }

    /// A raw fake Messages API on loopback: each request is read whole and refused as the
    /// real API would refuse it ([`claude_refusal`]); `answer` writes the answer to every
    /// other one. Its URL.
    pub fn strict_claude(
        answer: impl Fn(RawRequest, &mut TcpStream) + Send + Sync + 'static,
    ) -> String {
        serve_each(move |mut stream| {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let Some(r) = read_request(&mut reader) else {
                return;
            };
            if let Some(refusal) = claude_refusal(&r.method, &r.path, &r.headers, &r.body) {
                let _ = stream.write_all(&refusal);
                return;
            }
            answer(r, &mut stream);
        })
    }
}
