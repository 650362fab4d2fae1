//! The deployment's own Envoy config, `deploy/envoy/envoy.yaml` (the file
//! docker-compose.yml mounts), made runnable on loopback: parsed into JSON, with only
//! the addresses replaced (admin, the listener, the endpoints of the `tollgate` and
//! `upstream` clusters). Routes, rate-limit actions, filter settings and timeouts stay
//! exactly as users get them.

use serde_json::{Value, json};

use crate::common::envoy::render::{envoy_yaml_path, lb_endpoints, load_yaml};

/// Where the test stack listens and what it talks to.
#[derive(Clone, Debug)]
pub struct Addresses {
    pub admin: u16,
    pub listener: u16,
    pub replicas: Vec<u16>,
    pub upstream: u16,
}

fn cluster_mut<'a>(config: &'a mut Value, name: &str) -> &'a mut Value {
    config["static_resources"]["clusters"]
        .as_array_mut()
        .and_then(|clusters| clusters.iter_mut().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("envoy.yaml has no cluster named {name:?}"))
}

fn loopback(port: u16) -> Value {
    json!({ "address": "127.0.0.1", "port_value": port })
}

fn endpoint(port: u16) -> Value {
    json!({ "endpoint": { "address": { "socket_address": loopback(port) } } })
}

/// The deployment's config with loopback addresses, as JSON text (valid Envoy YAML).
pub fn render(addresses: &Addresses) -> String {
    let mut config = load_yaml(&envoy_yaml_path());
    config["admin"]["address"]["socket_address"] = loopback(addresses.admin);

    let listeners = config["static_resources"]["listeners"]
        .as_array_mut()
        .expect("envoy.yaml has static_resources.listeners");
    assert_eq!(listeners.len(), 1, "envoy.yaml should have one listener");
    listeners[0]["address"]["socket_address"] = loopback(addresses.listener);

    let tollgate = cluster_mut(&mut config, "tollgate");
    let declared = lb_endpoints(tollgate).len();
    assert_eq!(
        declared,
        addresses.replicas.len(),
        "envoy.yaml declares {declared} tollgate endpoints, the test runs {}",
        addresses.replicas.len()
    );
    tollgate["load_assignment"]["endpoints"][0]["lb_endpoints"] =
        addresses.replicas.iter().map(|&p| endpoint(p)).collect();

    let upstream = cluster_mut(&mut config, "upstream");
    assert_eq!(lb_endpoints(upstream).len(), 1, "one upstream endpoint");
    upstream["load_assignment"]["endpoints"][0]["lb_endpoints"] =
        json!([endpoint(addresses.upstream)]);

    serde_json::to_string_pretty(&config).expect("JSON")
}
