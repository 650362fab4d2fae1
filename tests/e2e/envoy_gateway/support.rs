//! The Envoy Gateway suite's helpers: plain HTTP GETs and the kubelet's probes, free
//! ports, ShouldRateLimit over mTLS, and the files a process holds open for writing.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tollgate::proto::RateLimitServiceClient;
use tollgate::proto::rate_limit_response::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use super::{DOMAIN, MATCH, PROBE_PATH, Probe, ROUTE};
use crate::common::server::{descriptor, request};
use crate::common::tls_certs::{Leaf, TestCa};

/// `GET path` on 127.0.0.1:port within `timeout`: the status code and the body.
pub(super) fn get(port: u16, path: &str, timeout: Duration) -> Result<(u16, String), String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(timeout)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).map_err(|e| e.to_string())?;
    let (head, body) = raw.split_once("\r\n\r\n").ok_or("no header end")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line: {head}"))?;
    Ok((code, body.to_owned()))
}

/// Four distinct free loopback ports ([`crate::common::ports`]).
pub(super) fn four_free_ports() -> [u16; 4] {
    let ports = crate::common::ports::free_ports(4, false);
    std::array::from_fn(|i| ports[i])
}

/// One probe as the kubelet runs it: passes on 2xx/3xx within the probe's timeout.
pub(super) fn probe(port: u16, probe: &Probe) -> Result<(), String> {
    let started = Instant::now();
    let (code, body) = get(port, PROBE_PATH, probe.timeout)?;
    let took = started.elapsed();
    if !(200..400).contains(&code) || took > probe.timeout {
        return Err(format!("{} got {code} in {took:?}: {body}", probe.name));
    }
    Ok(())
}

/// ShouldRateLimit over mTLS as Envoy sends it (its client certificate from the same
/// CA); the overall code.
pub(super) async fn call(port: u16, ca: &TestCa, identity: Option<&Leaf>) -> Result<Code, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.cert_pem()))
        .domain_name("localhost");
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert_pem, &leaf.key_pem));
    }
    let endpoint = Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| format!("tls config: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let entries = [(ROUTE, ROUTE), (MATCH, MATCH)];
    let response = RateLimitServiceClient::new(channel)
        .should_rate_limit(request(DOMAIN, vec![descriptor(&entries)]))
        .await
        .map_err(|s| format!("call: {s}"))?;
    Code::try_from(response.into_inner().overall_code).map_err(|e| e.to_string())
}

/// Regular files the process holds open for writing, but its stdin, stdout and stderr.
pub(super) fn files_open_for_writing(pid: u32) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        let Ok(target) = fs::read_link(entry.path()) else {
            continue;
        };
        let fd = entry.file_name().into_string().unwrap();
        if ["0", "1", "2"].contains(&fd.as_str())
            || !target.is_absolute()
            || target.starts_with("/dev")
        {
            continue;
        }
        let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap_or_default();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
            .unwrap_or(0);
        // O_WRONLY or O_RDWR.
        if flags & 0o3 != 0 {
            found.push(target.display().to_string());
        }
    }
    found
}
