//! Envoy end to end with limits served over xDS, shaped as Envoy Gateway serves them:
//! a real Envoy whose ratelimit filter asks for domain `envoy-gateway/gateway-1/http`
//! with a route-level generic key and a per-user `rule-0-match-0` entry (Envoy
//! Gateway's `distinct` header match), in front of `tollgate serve` started with
//! Envoy Gateway's environment (`CONFIG_TYPE=GRPC_XDS_SOTW`, node `envoy-ratelimit`,
//! `FORCE_START_WITHOUT_INITIAL_CONFIG`, a `RUNTIME_ROOT` that does not exist), which
//! reads its limits from our own control plane (`tests/python/ads_server.py`, which
//! answers only node `envoy-ratelimit`, as Envoy Gateway's does). A limit changed on
//! the control plane is what Envoy's clients see next.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::stack::guard::{Guarded, run_dir};
use crate::stack::http::{self, Request, Response};
use crate::stack::start::{free_ports, upstream};
use crate::stack::{Window, envoy_binary};
use crate::xds_plane::{ControlPlane, serve, wait_healthy};

const DOMAIN: &str = "envoy-gateway/gateway-1/http";
/// Envoy Gateway's first-level key and value: the route's rule.
const ROUTE: &str = "httproute/default/api/rule/0/match/0/www_example_com";
const ROOM: Duration = Duration::from_secs(20);

/// Envoy Gateway's `RateLimitConfig` for one rule: `per_user` requests a minute for
/// each distinct `x-user-id`.
fn gateway_config(per_user: u32) -> Json {
    json!([{
        "name": DOMAIN,
        "domain": DOMAIN,
        "descriptors": [{
            "key": ROUTE,
            "value": ROUTE,
            "descriptors": [{
                "key": "rule-0-match-0",
                "rate_limit": {"unit": "MINUTE", "requests_per_unit": per_user},
            }],
        }],
    }])
}

/// Envoy with the route actions Envoy Gateway generates for that rule.
fn envoy_config(admin: u16, listener: u16, tollgate: u16, upstream: u16) -> Json {
    let address =
        |port: u16| json!({"socket_address": {"address": "127.0.0.1", "port_value": port}});
    let endpoint = |port: u16| json!({"endpoint": {"address": address(port)}});
    json!({
        "admin": {"address": address(admin)},
        "static_resources": {
            "listeners": [{
                "name": "http",
                "address": address(listener),
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "http",
                        "route_config": {"virtual_hosts": [{
                            "name": "www_example_com",
                            "domains": ["*"],
                            "routes": [{
                                "match": {"prefix": "/"},
                                "route": {
                                    "cluster": "upstream",
                                    "rate_limits": [{"actions": [
                                        {"generic_key": {"descriptor_key": ROUTE, "descriptor_value": ROUTE}},
                                        {"request_headers": {"header_name": "x-user-id", "descriptor_key": "rule-0-match-0"}},
                                    ]}],
                                },
                            }],
                        }]},
                        "http_filters": [
                            {
                                "name": "envoy.filters.http.ratelimit",
                                "typed_config": {
                                    "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
                                    "domain": DOMAIN,
                                    "timeout": "1s",
                                    "failure_mode_deny": true,
                                    "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
                                    "rate_limit_service": {
                                        "transport_api_version": "V3",
                                        "grpc_service": {"envoy_grpc": {"cluster_name": "ratelimit"}},
                                    },
                                },
                            },
                            {
                                "name": "envoy.filters.http.router",
                                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                            },
                        ],
                    },
                }]}],
            }],
            "clusters": [
                {
                    "name": "ratelimit",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        },
                    },
                    "load_assignment": {"cluster_name": "ratelimit", "endpoints": [{"lb_endpoints": [endpoint(tollgate)]}]},
                },
                {
                    "name": "upstream",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {"cluster_name": "upstream", "endpoints": [{"lb_endpoints": [endpoint(upstream)]}]},
                },
            ],
        },
    })
}

fn user(id: &str) -> Request {
    Request::get("/").header("x-user-id", id)
}

fn statuses(responses: &[Response]) -> Vec<u16> {
    responses.iter().map(|r| r.status).collect()
}

/// Envoy's admin `/ready` answers 200, bounded.
fn wait_ready(envoy: &mut Guarded, admin: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        envoy.assert_running();
        if http::probe(admin, "/ready").is_ok_and(|r| r.status == 200) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("Envoy never ready:\n{}", envoy.log_tail(40));
}

#[test]
fn envoy_gateway_shaped_limits_served_over_xds_limit_envoys_traffic() {
    let envoy_bin = envoy_binary();
    let dir = tempfile::Builder::new()
        .prefix("e2e_xds-")
        .tempdir_in(run_dir())
        .expect("temp dir");
    let mut plane = ControlPlane::start(0, &["--node-id", "envoy-ratelimit"]);
    plane.set("1", gateway_config(3));
    let ports = free_ports(4);
    let (grpc, http_port, admin, listener) = (ports[0], ports[1], ports[2], ports[3]);
    // Envoy Gateway's generated Deployment, less what needs its cluster (TLS, Redis).
    let server = serve(
        plane.port,
        grpc,
        http_port,
        &[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "false"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ],
    );
    wait_healthy(&server, http_port);
    plane.wait_for("the ACK of version 1", |e| {
        e["event"] == "request" && e["version_info"] == "1" && e["error_detail"].is_null()
    });
    let (_upstream, upstream_port) = upstream(dir.path());
    let config = dir.path().join("envoy.json");
    let rendered = envoy_config(admin, listener, grpc, upstream_port);
    std::fs::write(&config, rendered.to_string()).expect("write envoy.json");
    let mut command = Command::new(&envoy_bin);
    command
        .arg("-c")
        .arg(&config)
        .args(["--disable-hot-restart", "--concurrency", "1"])
        .args(["--log-level", "warn"]);
    let mut envoy = Guarded::spawn("envoy", dir.path(), &envoy_bin.to_string_lossy(), command);
    let listener = SocketAddr::from(([127, 0, 0, 1], listener));
    wait_ready(&mut envoy, SocketAddr::from(([127, 0, 0, 1], admin)));

    let run = std::process::id();
    let window = Window::with_room(&[60], ROOM);
    let alice = format!("alice-{run}");
    let answers = (0..5)
        .map(|_| http::send(listener, user(&alice)))
        .collect::<Vec<_>>();
    assert_eq!(
        statuses(&answers),
        [200, 200, 200, 429, 429],
        "{answers:#?}"
    );
    assert_eq!(answers[0].header("x-ratelimit-limit"), Some("3, 3;w=60"));
    let bob = format!("bob-{run}");
    assert_eq!(http::send(listener, user(&bob)).status, 200, "per user");

    // The control plane raises the limit: Envoy's next clients get the new one.
    plane.set("2", gateway_config(5));
    plane.wait_for("the ACK of version 2", |e| {
        e["event"] == "request" && e["version_info"] == "2" && e["error_detail"].is_null()
    });
    let carol = format!("carol-{run}");
    let answers = (0..6)
        .map(|_| http::send(listener, user(&carol)))
        .collect::<Vec<_>>();
    assert_eq!(
        statuses(&answers),
        [200, 200, 200, 200, 200, 429],
        "{answers:#?}"
    );
    assert_eq!(answers[0].header("x-ratelimit-limit"), Some("5, 5;w=60"));
    window.assert_same();
    drop(server);
}
