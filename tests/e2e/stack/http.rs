//! A minimal HTTP/1.1 client for the end-to-end tests: one connection per request
//! (`connection: close`), an optional loopback source address (127.0.0.N, so Envoy's
//! `remote_address` differs between simulated clients), and [`send_all`] to fire many
//! requests at once: every connection is open before the first request is written.
//! No new crate: tokio's `TcpSocket` (bind before connect) and a few lines of parsing.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Barrier;

/// Bound for one request, connection to last byte.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// A request to send; build with [`Request::get`] / [`Request::post`].
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// Source address of the connection; `None` lets the kernel pick (127.0.0.1).
    pub source: Option<Ipv4Addr>,
}

impl Request {
    pub fn get(path: &str) -> Request {
        Request {
            method: "GET".to_owned(),
            path: path.to_owned(),
            headers: Vec::new(),
            source: None,
        }
    }

    pub fn post(path: &str) -> Request {
        Request {
            method: "POST".to_owned(),
            ..Request::get(path)
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Connects from `127.0.0.<last>`.
    pub fn source_ip(mut self, last: u8) -> Request {
        self.source = Some(Ipv4Addr::new(127, 0, 0, last));
        self
    }
}

/// A parsed response; header names are lower-case.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Header `name` as a number; panics naming the response if absent or not one.
    pub fn number(&self, name: &str) -> u64 {
        let value = self
            .header(name)
            .unwrap_or_else(|| panic!("no {name} header in {self:#?}"));
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {value:?} is not a number"))
    }
}

/// Sends one request to `addr`.
pub fn send(addr: SocketAddr, request: Request) -> Response {
    send_all(addr, vec![request]).remove(0)
}

/// Sends `requests` concurrently to `addr`: all connections are opened, then all
/// requests written. Responses come back in request order. Panics on any I/O error.
pub fn send_all(addr: SocketAddr, requests: Vec<Request>) -> Vec<Response> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let barrier = Arc::new(Barrier::new(requests.len()));
        let tasks: Vec<_> = requests
            .into_iter()
            .map(|request| {
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    let described = format!("{} {}", request.method, request.path);
                    match tokio::time::timeout(REQUEST_TIMEOUT, exchange(addr, request, barrier))
                        .await
                    {
                        Ok(Ok(response)) => response,
                        Ok(Err(e)) => panic!("{described} to {addr}: {e}"),
                        Err(_) => panic!("{described} to {addr}: no answer in {REQUEST_TIMEOUT:?}"),
                    }
                })
            })
            .collect();
        let mut responses = Vec::with_capacity(tasks.len());
        for task in tasks {
            responses.push(task.await.unwrap_or_else(|e| panic!("request task: {e}")));
        }
        responses
    })
}

/// One GET over a blocking socket, for readiness probes and admin calls: an error
/// instead of a panic, and short timeouts.
pub fn probe(addr: SocketAddr, path: &str) -> Result<Response, String> {
    use std::io::{Read, Write};
    let timeout = Duration::from_secs(5);
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    let head = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    stream
        .write_all(head.as_bytes())
        .map_err(|e| format!("write to {addr}: {e}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    parse(&raw)
}

async fn exchange(
    addr: SocketAddr,
    request: Request,
    barrier: Arc<Barrier>,
) -> std::io::Result<Response> {
    let mut stream = connect(addr, request.source).await?;
    barrier.wait().await;
    let mut head = format!(
        "{} {} HTTP/1.1\r\nhost: tollgate.test\r\nconnection: close\r\ncontent-length: 0\r\n",
        request.method, request.path
    );
    for (name, value) in &request.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse(&raw).map_err(std::io::Error::other)
}

async fn connect(addr: SocketAddr, source: Option<Ipv4Addr>) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    if let Some(ip) = source {
        socket.bind(SocketAddr::new(IpAddr::V4(ip), 0))?;
    }
    let stream = socket.connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Status line, headers, and a body delimited by content-length, chunked encoding or
/// the end of the connection.
fn parse(raw: &[u8]) -> Result<Response, String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no end of headers in {:?}", String::from_utf8_lossy(raw)))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let rest = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let find = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    let body = if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        dechunk(rest)?
    } else if let Some(length) = find("content-length") {
        let length: usize = length.parse().map_err(|_| "bad content-length")?;
        rest.get(..length)
            .ok_or("body shorter than content-length")?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunk size")?;
        let size_text = String::from_utf8_lossy(&rest[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| "bad chunk size")?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(body);
        }
        body.extend_from_slice(rest.get(..size).ok_or("truncated chunk")?);
        rest = rest.get(size + 2..).ok_or("truncated chunk end")?;
    }
}
