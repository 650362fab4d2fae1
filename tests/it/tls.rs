//! TLS and mTLS on the gRPC port, with certificates made at test time (rcgen): under
//! mTLS a client without a certificate, or with one from another CA, or without the
//! required SAN, is refused, and a client with a good one is served; plain text is
//! refused on a TLS port; new certificate files are picked up without a restart and
//! a broken set is refused while the old one keeps serving.

use crate::common;
use crate::common::tls_certs as certs;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use certs::{Leaf, TestCa, write};
use common::server::{config, descriptor, request};
use tokio::sync::oneshot;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::RateLimitServiceClient;
use tollgate::proto::rate_limit_response::Code;
use tollgate::server::tls::ServerTls;
use tollgate::server::{Listeners, ServeOptions, run_with};
use tollgate::settings::tls::GrpcTls;
use tollgate::store::memory::MemoryStore;

const YAML: &str = "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";

struct Running {
    addr: SocketAddr,
    tls: Arc<ServerTls>,
    _dir: tempfile::TempDir,
    files: GrpcTls,
    _stop: oneshot::Sender<()>,
}

/// Serves on 127.0.0.1:0 with `server` as its certificate; `client_ca` turns on mTLS.
async fn serve(ca: &TestCa, client_ca: Option<&TestCa>, client_san: Option<&str>) -> Running {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ca.server();
    let files = GrpcTls {
        cert: write(dir.path(), "tls.crt", &server.cert_pem),
        key: write(dir.path(), "tls.key", &server.key_pem),
        client_ca: client_ca.map(|c| write(dir.path(), "ca.crt", &c.cert_pem())),
        client_san: client_san.map(str::to_owned),
    };
    let tls = ServerTls::load(files.clone()).expect("certificates load");
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let listeners = Listeners::bind(any, any).await.expect("bind");
    let addr = listeners.grpc_addr();
    let limiter = Arc::new(Limiter::new(
        config(YAML),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    ));
    let options = ServeOptions {
        tls: Some(tls.clone()),
        ..ServeOptions::default()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(run_with(listeners, limiter, options, async move {
        let _ = stopped.await;
    }));
    Running {
        addr,
        tls,
        _dir: dir,
        files,
        _stop: stop,
    }
}

/// One ShouldRateLimit call over TLS trusting `trust`, presenting `identity` if any.
async fn call(addr: SocketAddr, trust: &TestCa, identity: Option<&Leaf>) -> Result<Code, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(trust.cert_pem()))
        .domain_name("localhost");
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert_pem, &leaf.key_pem));
    }
    let endpoint = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| format!("tls config: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5));
    let attempt = async {
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let response = RateLimitServiceClient::new(channel)
            .should_rate_limit(request("tls", vec![descriptor(&[("k", "v")])]))
            .await
            .map_err(|s| format!("call: {s}"))?;
        Ok(Code::try_from(response.into_inner().overall_code).unwrap())
    };
    tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .map_err(|_| "no answer within 10 s".to_owned())?
}

async fn plain_call(addr: SocketAddr) -> Result<(), String> {
    let attempt = async {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        RateLimitServiceClient::new(channel)
            .should_rate_limit(request("tls", vec![descriptor(&[("k", "v")])]))
            .await
            .map(|_| ())
            .map_err(|s| s.to_string())
    };
    tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .map_err(|_| "no answer".to_owned())?
}

#[tokio::test]
async fn mtls_refuses_clients_without_a_good_certificate_and_serves_the_others() {
    let ca = TestCa::new("tollgate test CA");
    let server = serve(&ca, Some(&ca), None).await;
    let good = ca.client(&["envoy.internal"]);
    assert_eq!(call(server.addr, &ca, Some(&good)).await, Ok(Code::Ok));

    let without = call(server.addr, &ca, None).await;
    assert!(
        without.is_err(),
        "a client without a certificate was served"
    );
    let stranger = TestCa::new("someone else's CA").client(&["envoy.internal"]);
    let foreign = call(server.addr, &ca, Some(&stranger)).await;
    assert!(
        foreign.is_err(),
        "a certificate from another CA was accepted"
    );
    assert!(
        plain_call(server.addr).await.is_err(),
        "plain text was served"
    );
    // The refusals did not disturb anyone else.
    assert_eq!(call(server.addr, &ca, Some(&good)).await, Ok(Code::Ok));
}

#[tokio::test]
async fn tls_without_a_client_ca_serves_any_tls_client_but_not_plain_text() {
    let ca = TestCa::new("tollgate test CA");
    let server = serve(&ca, None, None).await;
    assert!(!server.tls.mutual());
    assert_eq!(call(server.addr, &ca, None).await, Ok(Code::Ok));
    assert!(
        plain_call(server.addr).await.is_err(),
        "plain text was served"
    );
    // A client that does not trust the server's CA gives up.
    let other = TestCa::new("other");
    assert!(call(server.addr, &other, None).await.is_err());
}

#[tokio::test]
async fn a_required_client_san_is_enforced() {
    let ca = TestCa::new("tollgate test CA");
    let server = serve(&ca, Some(&ca), Some("envoy.internal")).await;
    let right = ca.client(&["envoy.internal"]);
    let wrong = ca.client(&["intruder.internal"]);
    assert_eq!(call(server.addr, &ca, Some(&right)).await, Ok(Code::Ok));
    assert!(call(server.addr, &ca, Some(&wrong)).await.is_err());
}

#[tokio::test]
async fn new_certificate_files_are_served_without_a_restart() {
    let old_ca = TestCa::new("old CA");
    let server = serve(&old_ca, Some(&old_ca), None).await;
    let _watch = server.tls.spawn_reload(Duration::from_millis(100));
    let old_client = old_ca.client(&["envoy.internal"]);
    assert_eq!(
        call(server.addr, &old_ca, Some(&old_client)).await,
        Ok(Code::Ok)
    );

    // A half-written set (new certificate, old key) is refused; the old one serves on.
    let new_ca = TestCa::new("new CA");
    let new_server = new_ca.server();
    let dir = server.files.cert.parent().unwrap().to_path_buf();
    write(&dir, "tls.crt", &new_server.cert_pem);
    assert!(
        server.tls.reload().is_err(),
        "a key mismatch must be refused"
    );
    assert_eq!(
        call(server.addr, &old_ca, Some(&old_client)).await,
        Ok(Code::Ok)
    );

    // The complete new set (certificate, key, client CA) is picked up by the watcher.
    write(&dir, "tls.key", &new_server.key_pem);
    write(&dir, "ca.crt", &new_ca.cert_pem());
    let new_client = new_ca.client(&["envoy.internal"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if call(server.addr, &new_ca, Some(&new_client)).await == Ok(Code::Ok) {
            break;
        }
        assert!(Instant::now() < deadline, "new certificates never served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(server.tls.reloads() >= 1);
    // Clients of the old CA are now refused, both ways round.
    assert!(call(server.addr, &old_ca, Some(&old_client)).await.is_err());
    assert!(call(server.addr, &new_ca, Some(&old_client)).await.is_err());
}

#[test]
fn unreadable_or_wrong_files_stop_the_start_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("ca");
    let leaf = ca.server();
    let missing = GrpcTls {
        cert: dir.path().join("absent.crt"),
        key: write(dir.path(), "tls.key", &leaf.key_pem),
        client_ca: None,
        client_san: None,
    };
    let error = ServerTls::load(missing)
        .err()
        .expect("missing file")
        .to_string();
    assert!(error.contains("absent.crt"), "{error}");

    let other = ca.server();
    let mismatched = GrpcTls {
        cert: write(dir.path(), "tls.crt", &leaf.cert_pem),
        key: write(dir.path(), "other.key", &other.key_pem),
        client_ca: None,
        client_san: None,
    };
    let error = ServerTls::load(mismatched)
        .err()
        .expect("mismatch")
        .to_string();
    assert!(error.contains("tls.crt"), "{error}");

    let empty_ca = GrpcTls {
        cert: write(dir.path(), "tls.crt", &leaf.cert_pem),
        key: write(dir.path(), "tls.key", &leaf.key_pem),
        client_ca: Some(write(dir.path(), "ca.crt", "not a certificate\n")),
        client_san: None,
    };
    let error = ServerTls::load(empty_ca)
        .err()
        .expect("empty CA")
        .to_string();
    assert!(error.contains("ca.crt"), "{error}");
    let _: PathBuf = dir.path().to_path_buf();
}
