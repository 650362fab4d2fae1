//! The pieces of the xDS suites: our own control plane (`tests/python/ads_server.py`,
//! grpcio, sharing no code with tollgate's client) as a child process driven by JSON
//! lines, `tollgate serve` configured over xDS, and a gRPC caller. Used by `xds_sotw`
//! and `e2e_xds`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};
use tollgate::proto::{RateLimitServiceClient, rate_limit_response::Code};

use crate::common::process::{Server, root, tollgate};
use crate::common::server::{descriptor, request};

/// Generous: the machine is shared and Python starts slowly.
pub const WAIT: Duration = Duration::from_secs(20);

/// `TOLLGATE_PYTHON` (the venv `scripts/test` makes); failing, never skipping.
fn python() -> String {
    std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| {
        panic!(
            "TOLLGATE_PYTHON is not set: run `source scripts/bootstrap` (a Python venv with \
             grpcio and xds-protos) or export it"
        )
    })
}

/// The control plane process; killed on drop.
pub struct ControlPlane {
    child: Child,
    stdin: ChildStdin,
    events: mpsc::Receiver<Json>,
    /// Every event read so far, in order.
    pub seen: Vec<Json>,
    pub port: u16,
}

impl ControlPlane {
    /// Listening on `port` (0: any) with `args` (`--node-id`, `--cert`...).
    pub fn start(port: u16, args: &[&str]) -> Self {
        let mut child = Command::new(python())
            .arg(root().join("tests/python/ads_server.py"))
            .args(["--port", &port.to_string()])
            .args(args)
            // gRPC core logs each refused TLS handshake at INFO (CERTIFICATE_VERIFY_FAILED):
            // the mTLS test causes them on purpose, and they would read as failures.
            .env("GRPC_VERBOSITY", "ERROR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the ADS control plane");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(event) = serde_json::from_str::<Json>(&line)
                    && tx.send(event).is_err()
                {
                    break;
                }
            }
        });
        let mut plane = Self {
            child,
            stdin,
            events,
            seen: Vec::new(),
            port: 0,
        };
        let listening = plane.wait_for("listening", |e| e["event"] == "listening");
        plane.port = u16::try_from(listening["port"].as_u64().expect("port")).expect("port");
        plane
    }

    /// Serves this whole set as `version` from now on.
    pub fn set(&mut self, version: &str, resources: Json) {
        self.command(json!({"op": "set", "version": version, "resources": resources}));
    }

    /// Serves the set plus one resource whose bytes do not decode.
    pub fn set_with_garbage(&mut self, version: &str, resources: Json) {
        self.command(
            json!({"op": "set", "version": version, "resources": resources, "garbage": "x"}),
        );
    }

    fn command(&mut self, command: Json) {
        writeln!(self.stdin, "{command}").expect("write to the control plane");
        self.stdin.flush().expect("flush");
        self.wait_for("set acknowledged", |e| e["event"] == "set");
    }

    /// The first event (already seen or coming within [`WAIT`]) that matches.
    pub fn wait_for(&mut self, what: &str, matches: impl Fn(&Json) -> bool) -> Json {
        if let Some(found) = self.seen.iter().find(|e| matches(e)) {
            return found.clone();
        }
        let deadline = Instant::now() + WAIT;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.events.recv_timeout(left) {
                Ok(event) => {
                    self.seen.push(event.clone());
                    if matches(&event) {
                        return event;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "the control plane never reported {what}; saw {:#?}",
            self.seen
        );
    }

    /// Events that arrived so far without waiting, added to `seen`.
    pub fn drain(&mut self) -> &[Json] {
        while let Ok(event) = self.events.try_recv() {
            self.seen.push(event);
        }
        &self.seen
    }

    /// Gone at once, as a crashed control plane is.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One domain with one limit on `key` (any value), EG-shaped or not.
pub fn resource(name: &str, domain: &str, key: &str, unit: &str, per_unit: u32) -> Json {
    json!({
        "name": name,
        "domain": domain,
        "descriptors": [{"key": key, "rate_limit": {"unit": unit, "requests_per_unit": per_unit}}],
    })
}

/// `tollgate serve` reading limits from the control plane at `xds_port`, with short
/// retry intervals; `extra` adds variables.
pub fn serve(xds_port: u16, grpc: u16, http: u16, extra: &[(&str, &str)]) -> Server {
    let mut command = tollgate();
    command
        .arg("serve")
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--drain-seconds", "0"])
        .env("CONFIG_TYPE", "GRPC_XDS_SOTW")
        .env(
            "CONFIG_GRPC_XDS_SERVER_URL",
            format!("127.0.0.1:{xds_port}"),
        )
        .env("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit")
        .env("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "100ms")
        .env("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms")
        .env("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "400ms")
        .env("LOG_FORMAT", "json");
    for (name, value) in extra {
        command.env(name, value);
    }
    Server::spawn(command)
}

/// A runtime and a client for ShouldRateLimit calls from a plain test.
pub struct Caller {
    runtime: tokio::runtime::Runtime,
    client: RateLimitServiceClient<tonic::transport::Channel>,
}

/// What one descriptor's answer said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub over_limit: bool,
    /// The configured limit that applied; `None` when no limit did.
    pub limit: Option<u32>,
}

impl Caller {
    pub fn new(grpc: u16) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let client = runtime
            .block_on(RateLimitServiceClient::connect(format!(
                "http://127.0.0.1:{grpc}"
            )))
            .expect("connect to tollgate");
        Self { runtime, client }
    }

    /// One call with one descriptor; a gRPC error is an `Err`.
    pub fn call(&mut self, domain: &str, entries: &[(&str, &str)]) -> Result<Answer, String> {
        let call = request(domain, vec![descriptor(entries)]);
        let response = self
            .runtime
            .block_on(self.client.should_rate_limit(call))
            .map_err(|s| s.to_string())?
            .into_inner();
        let status = response.statuses.first().ok_or("no status")?;
        Ok(Answer {
            over_limit: status.code == Code::OverLimit as i32,
            limit: status.current_limit.as_ref().map(|l| l.requests_per_unit),
        })
    }

    /// Calls until `want` holds (bounded by [`WAIT`]); the answer that did.
    pub fn until(
        &mut self,
        domain: &str,
        entries: &[(&str, &str)],
        want: impl Fn(&Answer) -> bool,
    ) -> Answer {
        let deadline = Instant::now() + WAIT;
        let mut last = None;
        while Instant::now() < deadline {
            match self.call(domain, entries) {
                Ok(answer) if want(&answer) => return answer,
                other => last = Some(other),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("{domain} {entries:?} never answered as wanted; last {last:?}");
    }
}

/// The body of `GET path` on the HTTP port (`/healthcheck`, `/config.json`, `/metrics`);
/// empty when nothing listens there (yet).
pub fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut response = String::new();
    if stream.write_all(request.as_bytes()).is_err()
        || stream.read_to_string(&mut response).is_err()
    {
        return String::new();
    }
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// Waits until `/healthcheck` says OK (or fails after [`WAIT`]).
pub fn wait_healthy(server: &Server, http: u16) {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if http_get(http, "/healthcheck").starts_with("OK") {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("never healthy:\n{}", server.log());
}

/// Certificates for the TLS tests, written under `dir`.
pub fn write_pem(dir: &Path, name: &str, pem: &str) -> String {
    crate::common::tls_certs::write(dir, name, pem)
        .to_string_lossy()
        .into_owned()
}
