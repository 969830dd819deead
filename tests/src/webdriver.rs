//! A small WebDriver client (the W3C protocol, JSON over HTTP/1.1 on loopback) driving
//! Debian's headless `chromium` through its `chromedriver`, for the status page's browser
//! test. Blocking (std `TcpStream`): call it from `tokio::task::block_in_place` in an async
//! test.
//!
//! [`Browser::start`] fails with a message that says what to install when the browser or
//! its driver is missing (CI installs both; a test must not skip silently).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Where Debian's packages put the browser and its driver.
pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// The key under which WebDriver names an element.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A headless chromium session; the driver is stopped when dropped.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    profile: tempfile::TempDir,
}

/// An element of the page.
#[derive(Debug, Clone)]
pub struct Element(String);

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("its address").port()
}

/// One HTTP/1.1 exchange with the driver: the status and the JSON answer.
fn exchange(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<(u16, Value)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length = None;
    let mut chunked = false;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            let name = name.trim().to_ascii_lowercase();
            if name == "content-length" {
                length = value.trim().parse::<usize>().ok();
            }
            if name == "transfer-encoding" && value.trim().eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    let mut bytes = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            if size == 0 {
                break;
            }
            bytes.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(length) = length {
        bytes.resize(length, 0);
        reader.read_exact(&mut bytes)?;
    } else {
        reader.read_to_end(&mut bytes)?;
    }
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok((status, value))
}

impl Browser {
    /// Start `chromedriver` on a loopback port and a headless chromium session (a fresh
    /// profile, a laptop-sized window).
    pub fn start() -> Browser {
        for (path, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
            assert!(
                Path::new(path).exists(),
                "the browser test needs {path} (Debian package `{package}`): \
                 run `apt-get install -y --no-install-recommends chromium chromium-driver`"
            );
        }
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let profile = tempfile::tempdir().expect("a browser profile directory");
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
            profile,
        };
        // The driver listens within a moment of starting; a bounded wait for the process.
        let started = Instant::now();
        loop {
            if let Ok((200, status)) = exchange(port, "GET", "/status", None)
                && status["value"]["ready"] == true
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "chromedriver did not start listening on 127.0.0.1:{port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1366,900", "--no-first-run", "--no-default-browser-check",
                    format!("--user-data-dir={}", browser.profile.path().display()),
                ],
            },
        }}});
        let answer = browser.call("POST", "/session", Some(&capabilities));
        browser.session = answer["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromedriver started no session: {answer}"))
            .to_owned();
        browser
    }

    /// A WebDriver command; its `value`. A WebDriver error fails the test with its message.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (status, answer) = exchange(self.port, method, path, body)
            .unwrap_or_else(|e| panic!("chromedriver: {method} {path}: {e}"));
        assert!(
            status == 200,
            "chromedriver: {method} {path} answered {status}: {answer}"
        );
        answer["value"].clone()
    }

    fn session_call(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    /// Open `url` (waits for the page's load event).
    pub fn goto(&self, url: &str) {
        self.session_call("POST", "/url", Some(&json!({ "url": url })));
    }

    /// The current URL.
    pub fn url(&self) -> String {
        self.session_call("GET", "/url", None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The page's current markup.
    pub fn source(&self) -> String {
        self.session_call("GET", "/source", None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The elements matching a CSS selector, now.
    pub fn find_all(&self, css: &str) -> Vec<Element> {
        let found = self.session_call(
            "POST",
            "/elements",
            Some(&json!({"using": "css selector", "value": css})),
        );
        found
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|e| e[ELEMENT].as_str())
                    .map(|id| Element(id.to_owned()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Wait (up to `limit`) until `check` gives a value, re-reading the page every 50 ms;
    /// fails naming `what`. For what the page's own script does after a moment (its
    /// requests to the server, its refresh).
    pub fn wait_for<T>(
        &self,
        what: &str,
        limit: Duration,
        check: impl Fn(&Self) -> Option<T>,
    ) -> T {
        let started = Instant::now();
        loop {
            if let Some(value) = check(self) {
                return value;
            }
            assert!(
                started.elapsed() < limit,
                "timed out waiting for {what}; the page at {} is:\n{}",
                self.url(),
                self.source()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The rendered text of the first element matching `css`, read in one step in the page
    /// (the page redraws itself: a found element may be replaced a moment later).
    pub fn text(&self, css: &str) -> Option<String> {
        self.in_page(css, "return e.innerText;")
    }

    /// An attribute of the first element matching `css`, read in one step in the page.
    pub fn attribute(&self, css: &str, name: &str) -> Option<String> {
        let name = serde_json::to_string(name).expect("a JSON string");
        self.in_page(css, &format!("return e.getAttribute({name});"))
    }

    /// `body` run in the page with `e` the first element matching `css`; None when nothing
    /// matches or the result is not a string.
    fn in_page(&self, css: &str, body: &str) -> Option<String> {
        let css = serde_json::to_string(css).expect("a JSON string");
        let script =
            format!("const e = document.querySelector({css}); if (!e) return null; {body}");
        self.execute(&script).as_str().map(str::to_owned)
    }

    /// Click the first element matching `css`, as a person would (WebDriver's element
    /// click). When the page redrew the element between finding and clicking it, find it
    /// again (a few times).
    pub fn click(&self, css: &str) {
        for _ in 0..5 {
            let element = self
                .find_all(css)
                .into_iter()
                .next()
                .unwrap_or_else(|| panic!("nothing to click matches {css}"));
            let path = format!("/session/{}/element/{}/click", self.session, element.0);
            let (status, answer) = exchange(self.port, "POST", &path, Some(&json!({})))
                .unwrap_or_else(|e| panic!("chromedriver: click: {e}"));
            if status == 200 {
                return;
            }
            assert_eq!(
                answer["value"]["error"], "stale element reference",
                "chromedriver: click {css} answered {status}: {answer}"
            );
        }
        panic!("{css} was redrawn under every click");
    }

    /// Run `script` in the page; its result.
    pub fn execute(&self, script: &str) -> Value {
        self.session_call(
            "POST",
            "/execute/sync",
            Some(&json!({"script": script, "args": []})),
        )
    }

    /// A PNG screenshot of the window, written to `path` (its directory created).
    pub fn screenshot(&self, path: &Path) {
        let encoded = self.session_call("GET", "/screenshot", None);
        let png = decode_base64(encoded.as_str().expect("a base64 screenshot"));
        assert!(png.starts_with(b"\x89PNG"), "the screenshot is not a PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("create the screenshot's directory");
        }
        std::fs::write(path, png).expect("write the screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = exchange(
                self.port,
                "DELETE",
                &format!("/session/{}", self.session),
                None,
            );
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// The build's target directory: `CARGO_TARGET_DIR`, else the one holding this test binary
/// (`target/debug/deps/…`).
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "target"))
        .map(Path::to_path_buf)
        .or_else(|| exe.ancestors().nth(3).map(Path::to_path_buf))
        .expect("a target directory")
}

/// Standard base64 (with padding, as WebDriver sends screenshots).
fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let mut buffer = 0u32;
    let mut bits = 0;
    for c in text.bytes().filter_map(value) {
        buffer = ((buffer << 6) | u32::from(c)) & 0x00ff_ffff;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_decodes_what_webdriver_sends() {
        assert_eq!(super::decode_base64("iVBORw=="), b"\x89PNG");
        assert_eq!(super::decode_base64("aGVsbG8gd29ybGQ="), b"hello world");
        assert_eq!(super::decode_base64(""), b"");
    }
}
