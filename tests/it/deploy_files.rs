//! The deployment files agree with tollgate and with the end-to-end tests: parses
//! `docker-compose.yml`, `deploy/envoy/envoy.yaml`, the `Dockerfile` and every file of
//! `deploy/kubernetes/` (YAML through serde-saphyr into `serde_json::Value`), and
//! checks ports against tollgate's defaults (gRPC 8081, HTTP 8080), the probes, the
//! mounts (compose mounts the very files `tests/e2e/e2e_envoy.rs` runs; Kubernetes mounts
//! the config as a directory, never subPath), the timeouts, and that the Kubernetes
//! ConfigMap and Envoy snippet are copies of what the tests exercise. The Kubernetes
//! half is in `deploy_files/kubernetes.rs`; `deploy_files/compose_health.rs` runs the
//! compose healthcheck against a real `tollgate serve`.

use crate::common;
mod compose_health;
mod kubernetes;

use std::collections::BTreeSet;
use std::fs;
use std::net::SocketAddr;

use serde_json::Value;

use common::envoy::REDIS_TIMEOUT_MS;
use common::envoy::render::{cluster, envoy_yaml_path, lb_endpoints, load_yaml};
use common::process::root;
use tollgate::settings::{DEFAULT_GRPC_ADDR, DEFAULT_HTTP_ADDR, DEFAULT_REDIS_TIMEOUT_MS};

fn default_port(addr: &str) -> u64 {
    u64::from(addr.parse::<SocketAddr>().expect("a socket address").port())
}

fn grpc_port() -> u64 {
    default_port(DEFAULT_GRPC_ADDR)
}

fn http_port() -> u64 {
    default_port(DEFAULT_HTTP_ADDR)
}

fn compose() -> Value {
    load_yaml(&root().join("docker-compose.yml"))
}

fn service<'a>(compose: &'a Value, name: &str) -> &'a Value {
    let service = &compose["services"][name];
    assert!(
        service.is_object(),
        "docker-compose.yml has no service {name}"
    );
    service
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap_or_else(|| panic!("not a string: {v}")))
        .collect()
}

/// The target of the service's read-only bind mount of `host` (a path relative to
/// the compose file, which is the repository root).
fn mount_target(service: &Value, host: &str) -> String {
    for volume in strings(&service["volumes"]) {
        let parts: Vec<&str> = volume.split(':').collect();
        if parts[0] == host {
            assert_eq!(parts.get(2), Some(&"ro"), "{volume} should be read-only");
            assert!(root().join(host).exists(), "{host} does not exist");
            return parts[1].to_owned();
        }
    }
    panic!("no mount of {host} in {service}");
}

/// The argument after `flag` in a command line.
fn arg_after<'a>(command: &[&'a str], flag: &str) -> &'a str {
    let at = command.iter().position(|a| *a == flag);
    at.and_then(|i| command.get(i + 1))
        .unwrap_or_else(|| panic!("no {flag} VALUE in {command:?}"))
}

fn envoy() -> Value {
    load_yaml(&envoy_yaml_path())
}

/// The ratelimit filter of the one HTTP connection manager.
fn ratelimit_filter(envoy: &Value) -> &Value {
    let hcm = &envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0];
    hcm["typed_config"]["http_filters"]
        .as_array()
        .and_then(|f| {
            f.iter()
                .find(|f| f["name"] == "envoy.filters.http.ratelimit")
        })
        .expect("envoy.yaml has the envoy.filters.http.ratelimit filter")
}

/// (host, port) of each endpoint of a cluster.
fn endpoints(cluster: &Value) -> Vec<(String, u64)> {
    lb_endpoints(cluster)
        .iter()
        .map(|e| {
            let socket = &e["endpoint"]["address"]["socket_address"];
            let host = socket["address"].as_str().expect("an address").to_owned();
            (host, socket["port_value"].as_u64().expect("a port"))
        })
        .collect()
}

/// Envoy durations are `<seconds>s` ("1s", "0.250s").
fn duration_ms(value: &Value) -> f64 {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("not a duration: {value}"));
    let seconds: f64 = text
        .strip_suffix('s')
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an Envoy duration: {text}"));
    seconds * 1000.0
}

#[test]
fn compose_mounts_the_files_the_e2e_tests_run() {
    let compose = compose();
    let envoy_config = envoy();

    let proxy = service(&compose, "envoy");
    let target = mount_target(proxy, "./deploy/envoy/envoy.yaml");
    assert_eq!(root().join("deploy/envoy/envoy.yaml"), envoy_yaml_path());
    assert_eq!(arg_after(&strings(&proxy["command"]), "-c"), target);
    let published = strings(&proxy["ports"]).join(" ");
    let admin = &envoy_config["admin"]["address"]["socket_address"]["port_value"];
    let listener = &envoy_config["static_resources"]["listeners"][0]["address"]["socket_address"];
    for port in [admin, &listener["port_value"]] {
        assert!(
            published.contains(&format!(":{port}")),
            "{port} not published: {published}"
        );
    }

    // Envoy's tollgate cluster is exactly the compose replicas, on the default port.
    let replicas: BTreeSet<String> = compose["services"]
        .as_object()
        .expect("services")
        .keys()
        .filter(|name| name.starts_with("tollgate-"))
        .cloned()
        .collect();
    assert_eq!(replicas.len(), 2, "two replicas: {replicas:?}");
    let tollgate = endpoints(cluster(&envoy_config, "tollgate"));
    let expected: BTreeSet<(String, u64)> =
        replicas.iter().map(|r| (r.clone(), grpc_port())).collect();
    assert_eq!(tollgate.into_iter().collect::<BTreeSet<_>>(), expected);

    for name in &replicas {
        let replica = service(&compose, name);
        let target = mount_target(replica, "./config");
        assert_eq!(arg_after(&strings(&replica["command"]), "--config"), target);
        // The healthcheck asks the real readiness endpoint (compose_health.rs runs it).
        let health = compose_health::healthcheck_script(replica);
        let probe = format!("/dev/tcp/127.0.0.1/{}", http_port());
        assert!(health.contains(&probe), "{name}: {health}");
        assert!(health.contains("GET /healthcheck "), "{name}: {health}");
        // The HTTP port (metrics) is published, on this machine only.
        let published = strings(&replica["ports"]);
        assert!(
            published
                .iter()
                .any(|p| p.starts_with("127.0.0.1:") && p.ends_with(&format!(":{}", http_port()))),
            "{name} publishes no HTTP port on 127.0.0.1: {published:?}"
        );
        assert_eq!(
            replica["depends_on"]["redis-cluster-init"]["condition"],
            "service_completed_successfully"
        );
        assert_eq!(proxy["depends_on"][name]["condition"], "service_healthy");
    }

    // The upstream runs the e2e tests' echo.py on the port Envoy's cluster names.
    let upstream = service(&compose, "upstream");
    let script = mount_target(upstream, "./deploy/upstream/echo.py");
    let command = strings(&upstream["command"]);
    assert!(command.contains(&script.as_str()), "{command:?}");
    let port: u64 = arg_after(&command, "--port").parse().expect("a port");
    assert_eq!(
        endpoints(cluster(&envoy_config, "upstream")),
        [("upstream".to_owned(), port)]
    );
}

#[test]
fn compose_creates_a_six_node_redis_cluster_and_tollgate_uses_it() {
    let compose = compose();
    let mut addresses = Vec::new();
    for n in 1..=6 {
        let node = service(&compose, &format!("redis-{n}"));
        let command = strings(&node["command"]);
        assert_eq!(arg_after(&command, "--cluster-enabled"), "yes");
        assert_eq!(arg_after(&command, "--port"), "6379");
        let ip = node["networks"]["tollgate"]["ipv4_address"]
            .as_str()
            .expect("a fixed IP");
        addresses.push(format!("{ip}:6379"));
    }
    let init = service(&compose, "redis-cluster-init");
    let script = strings(&init["command"]).join(" ").replace("\\\n", " ");
    let flat = script.split_whitespace().collect::<Vec<_>>().join(" ");
    let create = format!("redis-cli --cluster create {}", addresses.join(" "));
    assert!(flat.contains(&create), "expected `{create}` in {flat}");
    assert!(flat.contains("--cluster-replicas 1"), "{flat}");
    for n in 1..=6 {
        assert_eq!(
            init["depends_on"][format!("redis-{n}")]["condition"],
            "service_healthy"
        );
    }

    let seeds: Vec<String> = (1..=6).map(|n| format!("redis-{n}:6379")).collect();
    for name in ["tollgate-1", "tollgate-2"] {
        let env = &service(&compose, name)["environment"];
        assert_eq!(env["REDIS_TYPE"], "cluster");
        assert_eq!(env["REDIS_URL"], seeds.join(","));
    }
}

#[test]
fn envoy_gives_tollgate_time_to_decide_and_names_known_domains() {
    let envoy_config = envoy();
    let filter = &ratelimit_filter(&envoy_config)["typed_config"];
    let timeout = duration_ms(&filter["timeout"]);
    assert!(
        timeout > DEFAULT_REDIS_TIMEOUT_MS as f64 && timeout > REDIS_TIMEOUT_MS as f64,
        "Envoy's ratelimit timeout ({timeout} ms) must exceed tollgate's Redis timeout \
         ({DEFAULT_REDIS_TIMEOUT_MS} ms by default, {REDIS_TIMEOUT_MS} ms in the e2e tests)"
    );
    assert_eq!(filter["failure_mode_deny"], false);
    assert_eq!(filter["enable_x_ratelimit_headers"], "DRAFT_VERSION_03");
    assert_eq!(filter["rate_limit_service"]["transport_api_version"], "V3");
    let tollgate = cluster(&envoy_config, "tollgate");
    let options = &tollgate["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    assert!(
        options["explicit_http_config"]["http2_protocol_options"].is_object(),
        "gRPC needs HTTP/2"
    );
    let health_check = &tollgate["health_checks"][0];
    assert!(health_check["grpc_health_check"].is_object());
    // Envoy's default no_traffic_interval is 60 s: a draining replica would keep
    // getting calls for up to a minute on a quiet cluster.
    let quiet = duration_ms(&health_check["no_traffic_interval"]);
    assert!(
        quiet <= duration_ms(&health_check["interval"]),
        "no_traffic_interval {quiet} ms"
    );

    // Every domain Envoy sends is one config/ defines.
    let config = tollgate::config::load_path(&root().join("config"))
        .unwrap_or_else(|e| panic!("config/ must load: {e}"));
    let text = fs::read_to_string(envoy_yaml_path()).expect("envoy.yaml");
    let mut domains = BTreeSet::from([filter["domain"].as_str().expect("a domain").to_owned()]);
    for line in text.lines() {
        if let Some(domain) = line.trim().strip_prefix("domain: ") {
            domains.insert(domain.to_owned());
        }
    }
    assert_eq!(domains.len(), 4, "{domains:?}");
    for domain in &domains {
        assert!(
            config.domain(domain).is_some(),
            "config/ has no domain {domain}"
        );
    }
}

#[test]
fn dockerfile_is_multi_stage_non_root_and_exposes_the_default_ports() {
    let text = fs::read_to_string(root().join("Dockerfile")).expect("Dockerfile");
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let froms = lines.iter().filter(|l| l.starts_with("FROM ")).count();
    assert!(froms >= 2, "a builder stage and a runtime stage");
    let runtime: Vec<&str> = lines
        .iter()
        .rev()
        .take_while(|l| !l.starts_with("FROM "))
        .copied()
        .collect();
    let user = runtime
        .iter()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER in the runtime stage");
    assert!(
        !["root", "0", "0:0"].contains(&user.trim()),
        "runs as {user}"
    );
    let exposed = runtime
        .iter()
        .find_map(|l| l.strip_prefix("EXPOSE "))
        .expect("EXPOSE");
    for port in [grpc_port(), http_port()] {
        assert!(
            exposed.split_whitespace().any(|p| p == port.to_string()),
            "EXPOSE {exposed}"
        );
    }
    assert!(
        runtime
            .iter()
            .any(|l| l.starts_with("ENTRYPOINT") && l.contains("tollgate"))
    );
    let ignore = fs::read_to_string(root().join(".dockerignore")).expect(".dockerignore");
    assert!(
        ignore.lines().any(|l| l.trim() == "target/"),
        "the build context skips target/"
    );
}

/// The profiles the image is built with (the Dockerfile's default, compose's
/// argument) are Cargo.toml's, and their directory under target/ is their name (not
/// `dev`, whose directory is `debug`): a Docker build cannot be run here, so this is
/// what keeps it buildable.
#[test]
fn the_image_builds_with_profiles_cargo_defines() {
    let dockerfile = fs::read_to_string(root().join("Dockerfile")).expect("Dockerfile");
    let default = dockerfile
        .lines()
        .find_map(|l| l.trim().strip_prefix("ARG PROFILE="))
        .expect("ARG PROFILE=<default>");
    assert!(
        dockerfile.contains("cargo build --profile \"${PROFILE}\"")
            && dockerfile.contains("\"target/${PROFILE}/tollgate\""),
        "the build and the copy use ${{PROFILE}}"
    );
    let compose = compose();
    let args = &service(&compose, "tollgate-1")["build"]["args"];
    let composed = args["PROFILE"].as_str().expect("compose's PROFILE");
    let cargo = fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    for profile in [default, composed] {
        assert_ne!(
            profile, "dev",
            "target/dev does not exist: dev builds to target/debug"
        );
        assert!(
            profile == "release" || cargo.contains(&format!("[profile.{profile}]")),
            "Cargo.toml has no profile {profile}"
        );
    }
}
