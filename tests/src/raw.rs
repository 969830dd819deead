//! HTTP/1.1 on a bare socket, for what a well-behaved client or server never sends: a
//! `CONNECT` to the pool, a body that trickles or a head too large for the listener, and an
//! upstream that answers `101 Switching Protocols` to a plain `POST`.

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
