//! The admin endpoints on the HTTP port (the config views on a debug port instead,
//! when one is bound): `GET /rlconfig` (envoyproxy/ratelimit's text,
//! one line per limit, extensions appended), `GET /config.json` (domains, rules,
//! generation, hash and reload state, which follow a reload), and `/healthcheck`
//! following readiness, with grpc.health.v1 in step.

use std::fs;
use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::server::health::Health;
use tollgate::server::reload::{self, ReloadStatus, Reloader, Trigger};
use tollgate::server::{self, Listeners, ServeOptions};
use tollgate::store::memory::MemoryStore;

const LOGIN: &str = "domain: login
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10, name: login_per_ip}
  - key: account
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 20}
    descriptors:
      - key: path
        value: /admin
        rate_limit: {unlimited: true}
";

const API: &str = "domain: api
hash_tag: [tenant]
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 10}
";

struct Admin {
    http: SocketAddr,
    /// The debug port, when the config views were moved there.
    debug: Option<SocketAddr>,
    grpc: SocketAddr,
    health: Arc<Health>,
    reloader: Arc<Reloader>,
    dir: tempfile::TempDir,
    _stop: oneshot::Sender<()>,
}

async fn start() -> Admin {
    start_with(false).await
}

/// `debug_port`: the config views on a debug listener of their own (`--debug-addr`).
async fn start_with(debug_port: bool) -> Admin {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("login.yaml"), LOGIN).unwrap();
    fs::write(dir.path().join("api.yaml"), API).unwrap();
    let loaded = reload::load_set(dir.path()).expect("fixture loads");
    let store = Arc::new(MemoryStore::new());
    let limiter = Arc::new(Limiter::new(
        loaded.config,
        store,
        LimiterOptions::default(),
    ));
    let status = Arc::new(ReloadStatus::new(Some(loaded.hash)));
    let reloader = Arc::new(Reloader::new(
        limiter.clone(),
        dir.path().into(),
        status.clone(),
    ));
    let health = Arc::new(Health::default());
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut listeners = Listeners::bind(any, any).await.unwrap();
    if debug_port {
        listeners = listeners.bind_debug(any).await.unwrap();
    }
    let (http, grpc, debug) = (
        listeners.http_addr(),
        listeners.grpc_addr(),
        listeners.debug_addr(),
    );
    let (tx, rx) = oneshot::channel::<()>();
    let options = ServeOptions {
        health: health.clone(),
        reload: status,
        drain: std::time::Duration::ZERO,
        tls: None,
        rlqs: None,
        connections: Default::default(),
        global: None,
    };
    tokio::spawn(server::run_with(listeners, limiter, options, async move {
        let _ = rx.await;
    }));
    Admin {
        http,
        debug,
        grpc,
        health,
        reloader,
        dir,
        _stop: tx,
    }
}

/// GET; (status, content type, body). The listener is bound, so connecting works
/// at once.
async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("head and body");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap();
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    (status, content_type, body.to_owned())
}

#[tokio::test]
async fn a_debug_port_takes_the_config_views_off_the_http_port() {
    let admin = start_with(true).await;
    let debug = admin.debug.expect("a debug listener");
    for path in ["/rlconfig", "/config.json"] {
        assert_eq!(get(debug, path).await.0, 200, "{path} on the debug port");
        assert_eq!(
            get(admin.http, path).await.0,
            404,
            "{path} off the HTTP port"
        );
    }
    for path in ["/healthcheck", "/metrics"] {
        assert_eq!(
            get(admin.http, path).await.0,
            200,
            "{path} on the HTTP port"
        );
        assert_eq!(
            get(debug, path).await.0,
            404,
            "{path} not on the debug port"
        );
    }
    let without = start().await;
    assert_eq!(without.debug, None);
    assert_eq!(
        get(without.http, "/rlconfig").await.0,
        200,
        "on the HTTP port by default"
    );
}

#[tokio::test]
async fn rlconfig_lists_every_limit_like_envoyproxy_ratelimit() {
    let admin = start().await;
    let (status, content_type, body) = get(admin.http, "/rlconfig").await;
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    assert_eq!(
        body,
        "api.tenant: unit=SECOND requests_per_unit=5, shadow_mode: false, quota_mode: false, algorithm: token_bucket, burst: 10\n\
         login.remote_address: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false\n\
         login.account: unit=HOUR requests_per_unit=20, shadow_mode: true, quota_mode: false\n\
         login.account.path_/admin: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false, unlimited: true\n"
    );
}

#[tokio::test]
async fn config_json_shows_rules_generation_hash_and_reloads() {
    let admin = start().await;
    let (status, content_type, body) = get(admin.http, "/config.json").await;
    assert_eq!(status, 200);
    assert_eq!(content_type, "application/json");
    let json: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["generation"], 1);
    let hash = json["hash"].as_str().expect("hash").to_owned();
    assert_eq!(hash.len(), 16);
    assert_eq!(json["reload"]["failures"], 0);
    assert!(json["loaded_at"].as_f64().is_some());
    let domains: Vec<&str> = json["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["domain"].as_str().unwrap())
        .collect();
    assert_eq!(domains, ["api", "login"]);
    let login = &json["domains"][1]["rules"];
    assert_eq!(login[0]["key"], "login.remote_address");
    assert_eq!(login[0]["name"], "login_per_ip");
    assert_eq!(login[0]["limits"][0]["unit"], "minute");
    assert_eq!(login[0]["limits"][0]["requests_per_unit"], 10);
    assert_eq!(login[0]["limits"][0]["window_seconds"], 60);
    assert_eq!(login[0]["limits"][0]["algorithm"], "fixed_window");
    assert_eq!(login[1]["shadow_mode"], true);
    assert_eq!(login[2]["path"], "account.path_/admin");
    assert_eq!(login[2]["unlimited"], true);
    assert_eq!(login[2]["limits"], serde_json::json!([]));
    let api = &json["domains"][0]["rules"][0];
    assert_eq!(api["hash_tag"], serde_json::json!(["tenant"]));
    assert_eq!(api["limits"][0]["burst"], 10);

    // A broken file: the failure shows, the served set does not change.
    fs::write(admin.dir.path().join("api.yaml"), "domain: api\nnope: 1\n").unwrap();
    assert!(admin.reloader.reload(Trigger::Manual).await.is_err());
    let json: Value = serde_json::from_str(&get(admin.http, "/config.json").await.2).unwrap();
    assert_eq!(json["generation"], 1);
    assert_eq!(json["hash"], hash.as_str());
    assert_eq!(json["reload"]["failures"], 1);
    let errors = json["reload"]["last_error"]
        .as_array()
        .expect("errors")
        .clone();
    assert!(
        errors[0].as_str().unwrap().contains("api.yaml:2"),
        "{errors:?}"
    );
    assert!(json["reload"]["last_failure"].as_f64().is_some());

    // Removed: a new generation, a new hash, one domain.
    fs::remove_file(admin.dir.path().join("api.yaml")).unwrap();
    admin
        .reloader
        .reload(Trigger::Manual)
        .await
        .expect("login alone loads");
    let json: Value = serde_json::from_str(&get(admin.http, "/config.json").await.2).unwrap();
    assert_eq!(json["generation"], 2);
    assert_ne!(json["hash"], hash.as_str());
    assert_eq!(json["reload"]["successes"], 1);
    assert_eq!(json["domains"].as_array().unwrap().len(), 1);
    let (_, _, text) = get(admin.http, "/rlconfig").await;
    assert!(!text.contains("api."), "{text}");
}

#[tokio::test]
async fn healthcheck_and_grpc_health_follow_readiness() {
    let admin = start().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", admin.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = HealthClient::new(channel);
    let grpc_status = |mut client: HealthClient<tonic::transport::Channel>| async move {
        let request = HealthCheckRequest {
            service: "ratelimit".into(),
        };
        client.check(request).await.unwrap().into_inner().status
    };
    assert_eq!(get(admin.http, "/healthcheck").await.2, "OK");
    assert_eq!(
        grpc_status(client.clone()).await,
        ServingStatus::Serving as i32
    );

    admin.health.set_backend_reachable(false);
    let (status, _, body) = get(admin.http, "/healthcheck").await;
    assert_eq!(status, 500);
    assert!(body.contains("backend unreachable"), "{body}");
    // The gRPC reporter follows on its own task: poll, bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while grpc_status(client.clone()).await != ServingStatus::NotServing as i32 {
        assert!(
            std::time::Instant::now() < deadline,
            "gRPC health still SERVING"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    admin.health.set_backend_reachable(true);
    let (status, _, body) = get(admin.http, "/healthcheck").await;
    assert_eq!((status, body.as_str()), (200, "OK"));
    while grpc_status(client.clone()).await != ServingStatus::Serving as i32 {
        assert!(
            std::time::Instant::now() < deadline,
            "gRPC health not SERVING again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
