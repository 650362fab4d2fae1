//! tollgate run the way Envoy Gateway runs envoyproxy/ratelimit: its binary named
//! `/bin/ratelimit` started with no arguments, the exact environment of Envoy
//! Gateway's generated ratelimit Deployment (only addresses and file locations moved
//! into a temporary directory), as uid 65534 (when the test runs as root), mTLS on the
//! gRPC port with certificates from one CA, Redis from the harness, and the limits
//! served over xDS with mTLS by our own control plane (`tests/python/ads_server.py`,
//! answering only node `envoy-ratelimit`, as Envoy Gateway's does). Checked: the
//! Deployment's startup, readiness and liveness probes pass within their timeouts, a client without a certificate is refused,
//! ShouldRateLimit counts on Envoy-Gateway-shaped domains and keys, the metrics
//! listener (`PROMETHEUS_ADDR`) serves the series Envoy Gateway's dashboard queries,
//! `/rlconfig` answers on the debug port (where `egctl` reads it), and nothing is
//! open for writing (the Deployment's root filesystem is read-only).

mod support;

use crate::common;
use crate::common::prometheus::value;
use crate::common::tls_certs::{TestCa, write};
use crate::xds_plane::ControlPlane;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::process::{DEADLINE, Server};
use support::{call, files_open_for_writing, four_free_ports, get, probe};
use tollgate::proto::rate_limit_response::Code;

/// The container's `env`, in order, as Envoy Gateway generates it
/// (envoyproxy/gateway internal/infrastructure/kubernetes/ratelimit/testdata/
/// deployments/default.yaml, commit d32f282; `resource.go` builds it).
const DEPLOYMENT_ENV: &[(&str, &str)] = &[
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("LOG_LEVEL", "info"),
    ("USE_STATSD", "false"),
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
    ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
    ("GRPC_SERVER_USE_TLS", "true"),
    ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
    ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis.redis.svc:6379"),
    ("USE_PROMETHEUS", "true"),
    ("PROMETHEUS_ADDR", ":19001"),
    ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
];

/// The Deployment's `runAsUser` and `runAsGroup`.
const NOBODY: u32 = 65534;

/// One `httpGet` probe of the Deployment: every one asks `GET /healthcheck` on 8080.
struct Probe {
    name: &'static str,
    period: Duration,
    timeout: Duration,
    failure_threshold: u32,
}

/// The Deployment's probes, as generated (same file).
const PROBES: [Probe; 3] = [
    Probe {
        name: "startupProbe",
        period: Duration::from_secs(10),
        timeout: Duration::from_secs(1),
        failure_threshold: 30,
    },
    Probe {
        name: "readinessProbe",
        period: Duration::from_secs(5),
        timeout: Duration::from_secs(1),
        failure_threshold: 1,
    },
    Probe {
        name: "livenessProbe",
        period: Duration::from_secs(10),
        timeout: Duration::from_secs(1),
        failure_threshold: 3,
    },
];
const PROBE_PATH: &str = "/healthcheck";

/// A domain and keys as Envoy Gateway's translator names them (listener, route rule,
/// match), and the metric labels upstream's mapper gives them.
const DOMAIN: &str = "default/eg/http";
const ROUTE: &str = "httproute/default/backend/rule/0";
const MATCH: &str = "rule-0-match-0";
const LIMIT: u32 = 3;

/// The limits Envoy Gateway serves for one rule, as `RateLimitConfig` resources; a
/// year's window, so the three OKs and the denial after them fall in one window.
fn limits_resources() -> serde_json::Value {
    serde_json::json!([{
        "name": DOMAIN,
        "domain": DOMAIN,
        "descriptors": [{
            "key": ROUTE,
            "value": ROUTE,
            "descriptors": [{
                "key": MATCH,
                "value": MATCH,
                "rate_limit": {"unit": "YEAR", "requests_per_unit": LIMIT},
            }],
        }],
    }])
}

#[test]
fn tollgate_runs_as_envoy_gateways_ratelimit_deployment() {
    let redis = common::redis::standalone();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // The Deployment's uid and gid (runAsUser/runAsGroup 65534), taken when the test
    // runs as root; any other test user is not root either.
    let as_root = fs::metadata("/proc/self").unwrap().uid() == 0;
    // A Secret mounted with defaultMode 420 is readable by that uid; so is this tree.
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();

    // The image's /bin/ratelimit: this build under that name.
    let bin = root.join("bin");
    fs::create_dir(&bin).unwrap();
    let ratelimit = bin.join("ratelimit");
    symlink(env!("CARGO_BIN_EXE_tollgate"), &ratelimit).unwrap();

    // The `certs` Secret mount: one CA signs the server's and Envoy's certificates.
    let ca = TestCa::new("envoy-gateway test CA");
    let certs = root.join("certs");
    fs::create_dir(&certs).unwrap();
    let server = ca.server();
    let cert = write(&certs, "tls.crt", &server.cert_pem);
    let key = write(&certs, "tls.key", &server.key_pem);
    let ca_file = write(&certs, "ca.crt", &ca.cert_pem());
    let envoy = ca.client(&["envoy"]);
    // Envoy Gateway's tls.crt serves both as the gRPC server's certificate and as the
    // xDS client's (its certgen gives it both usages); the harness's CA makes one usage
    // per leaf, so the xDS client gets a leaf of its own from the same CA.
    let xds_client = ca.client(&["envoy-ratelimit"]);
    let xds_cert = write(&certs, "xds-client.crt", &xds_client.cert_pem);
    let xds_key = write(&certs, "xds-client.key", &xds_client.key_pem);

    // Envoy Gateway's xDS server: TLS with a certificate from the same CA, client
    // certificates required, only node `envoy-ratelimit` answered.
    let plane_cert = write(&certs, "plane.crt", &server.cert_pem);
    let plane_key = write(&certs, "plane.key", &server.key_pem);
    let path = |p: &Path| p.display().to_string();
    let (plane_cert, plane_key, ca_arg) = (path(&plane_cert), path(&plane_key), path(&ca_file));
    let mut plane = ControlPlane::start(
        0,
        &[
            "--node-id",
            "envoy-ratelimit",
            "--cert",
            &plane_cert,
            "--key",
            &plane_key,
            "--client-ca",
            &ca_arg,
        ],
    );
    plane.set("1", limits_resources());

    // The working directory stands in for the read-only root filesystem.
    let workdir = root.join("workdir");
    fs::create_dir(&workdir).unwrap();
    fs::set_permissions(&workdir, fs::Permissions::from_mode(0o555)).unwrap();

    let [grpc, http, debug, metrics] = four_free_ports();
    let prefix = common::redis::unique_prefix("envoy_gateway");
    // What this test changes in DEPLOYMENT_ENV, and why; every other variable is as
    // generated. Free ports instead of 8081/8080/6070/19001 (tests run in parallel),
    // the temporary directory instead of the Secret mount under /certs, the harness's
    // Redis, a key prefix (tests isolate by prefix), and the control plane's address
    // for `envoy-gateway:18001`.
    let overrides: Vec<(&str, String)> = vec![
        (
            "CONFIG_GRPC_XDS_SERVER_URL",
            format!("127.0.0.1:{}", plane.port),
        ),
        ("GRPC_SERVER_TLS_CERT", path(&cert)),
        ("GRPC_SERVER_TLS_KEY", path(&key)),
        ("GRPC_SERVER_TLS_CA_CERT", path(&ca_file)),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", path(&xds_cert)),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", path(&xds_key)),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", path(&ca_file)),
        ("REDIS_URL", redis.addr()),
        ("PROMETHEUS_ADDR", format!(":{metrics}")),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", grpc.to_string()),
        ("HOST", "127.0.0.1".into()),
        ("PORT", http.to_string()),
        ("DEBUG_HOST", "127.0.0.1".into()),
        ("DEBUG_PORT", debug.to_string()),
        ("CACHE_KEY_PREFIX", prefix),
    ];
    let mut command = Command::new(&ratelimit);
    command.env_clear().current_dir(&workdir);
    if as_root {
        command.uid(NOBODY).gid(NOBODY);
    }
    for (name, value) in DEPLOYMENT_ENV {
        match overrides.iter().find(|(n, _)| n == name) {
            Some((_, moved)) => command.env(name, moved),
            None => command.env(name, value),
        };
    }
    for (name, value) in &overrides {
        if !DEPLOYMENT_ENV.iter().any(|(n, _)| n == name) {
            command.env(name, value);
        }
    }
    let mut server = Server::spawn(command);

    // startupProbe: the pod may take failureThreshold x period; tollgate must be far
    // quicker (bounded by the harness's deadline).
    let startup = &PROBES[0];
    assert!(startup.period * startup.failure_threshold >= DEADLINE);
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            panic!("ratelimit exited with {status}:\n{}", server.log());
        }
        match probe(http, startup) {
            Ok(()) => break,
            Err(e) if Instant::now() > deadline => panic!("{e}\n{}", server.log()),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }

    // The limits are served before anything is counted (egctl's view of them, on the
    // debug port and not on the probed one).
    let deadline = Instant::now() + DEADLINE;
    let rlconfig = loop {
        let (code, body) = get(debug, "/rlconfig", Duration::from_secs(5)).unwrap();
        if code == 200 && body.contains(DOMAIN) {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "{code}: {body}\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(rlconfig.contains(MATCH), "{rlconfig}");
    assert_eq!(
        get(http, "/rlconfig", Duration::from_secs(5)).unwrap().0,
        404
    );

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let refused = runtime.block_on(call(grpc, &ca, None));
    assert!(
        refused.is_err(),
        "mTLS: a client without a certificate was served: {refused:?}"
    );
    // Readiness (failureThreshold 1) and liveness must pass between every call.
    let mut codes = Vec::new();
    for _ in 0..=LIMIT {
        let code = runtime.block_on(call(grpc, &ca, Some(&envoy)));
        codes.push(code.unwrap_or_else(|e| panic!("{e}\n{}", server.log())));
        for p in &PROBES[1..] {
            probe(http, p).unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
        }
    }
    let mut expected = vec![Code::Ok; LIMIT as usize];
    expected.push(Code::OverLimit);
    assert_eq!(codes, expected);

    // The metrics port Envoy Gateway scrapes and its dashboard's series.
    let (code, text) = get(metrics, "/metrics", Duration::from_secs(5)).unwrap();
    assert_eq!(code, 200, "{text}");
    let labels =
        format!("{{domain=\"{DOMAIN}\",key1=\"{ROUTE}_{ROUTE}\",key2=\"{MATCH}_{MATCH}\"}}");
    let series = |stat: &str| {
        value(
            &text,
            &format!("ratelimit_service_rate_limit_{stat}{labels}"),
        )
    };
    assert_eq!(series("total_hits"), f64::from(LIMIT + 1), "{text}");
    assert_eq!(series("within_limit"), f64::from(LIMIT), "{text}");
    assert_eq!(series("over_limit"), 1.0, "{text}");
    assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");
    assert_eq!(
        get(metrics, "/rlconfig", Duration::from_secs(5)).unwrap().0,
        404
    );

    let pid = server.child.id();
    let uid = fs::metadata(format!("/proc/{pid}")).unwrap().uid();
    assert_ne!(uid, 0, "runs as root");
    if as_root {
        assert_eq!(uid, NOBODY);
    }
    let writing = files_open_for_writing(pid);
    assert!(writing.is_empty(), "files open for writing: {writing:?}");
    assert_eq!(fs::read_dir(&workdir).unwrap().count(), 0);

    let status = server.terminate();
    assert!(status.success(), "exit after SIGTERM: {status}");
}

/// The image's side of the contract, read from the Dockerfile (no image is built
/// here): the runtime stage links `/bin/ratelimit` to the binary its ENTRYPOINT runs,
/// runs as a non-root user, and writes nothing at run time (no VOLUME to fill).
#[test]
fn the_image_runs_tollgate_as_bin_ratelimit() {
    let text = fs::read_to_string(common::process::root().join("Dockerfile")).unwrap();
    let runtime: Vec<&str> = text
        .lines()
        .map(str::trim)
        .skip_while(|l| !l.starts_with("FROM debian"))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let entrypoint = runtime
        .iter()
        .find_map(|l| l.strip_prefix("ENTRYPOINT [\""))
        .and_then(|l| l.split('"').next())
        .expect("an ENTRYPOINT in exec form");
    let link = format!("RUN ln -s {entrypoint} /bin/ratelimit");
    assert!(
        runtime.contains(&link.as_str()),
        "{link} missing:\n{runtime:#?}"
    );
    let user = runtime
        .iter()
        .find_map(|l| l.strip_prefix("USER "))
        .unwrap();
    assert!(
        !user.starts_with('0') && !user.starts_with("root"),
        "{user}"
    );
    assert!(!runtime.iter().any(|l| l.starts_with("VOLUME")));
}
