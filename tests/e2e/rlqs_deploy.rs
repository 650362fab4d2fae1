//! `deploy/rlqs/`, the RLQS guide's runnable files (docs/rlqs.md): a real Envoy on
//! `deploy/rlqs/envoy.yaml` as it is but for its ports, `tollgate serve` on
//! `deploy/rlqs/limits/` (counters in memory, as `scripts/demo rlqs` runs it) and the
//! echo upstream. Envoy allows all until its first report; once tollgate has
//! assigned it the bucket's share, a burst past the bucket gets Envoy's own 429s.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::envoy::render::load_yaml;
use crate::common::process::{Server, free_ports, root, tollgate};
use crate::stack::guard::PidRecord;
use crate::stack::{envoy_binary, http, start};

/// Envoy reports every 5 s; tollgate answers the report. Generous for a busy CI.
const ASSIGNED_WITHIN: Duration = Duration::from_secs(60);

/// The file with the test's ports: admin, listener, and the two clusters' endpoints.
fn render(admin: u16, listener: u16, grpc: u16, upstream: u16) -> String {
    let mut config = load_yaml(&root().join("deploy/rlqs/envoy.yaml"));
    let address = |port: u16| json!({ "address": "127.0.0.1", "port_value": port });
    config["admin"]["address"]["socket_address"] = address(admin);
    config["static_resources"]["listeners"][0]["address"]["socket_address"] = address(listener);
    for cluster in config["static_resources"]["clusters"]
        .as_array_mut()
        .expect("clusters")
    {
        let port = match cluster["name"].as_str() {
            Some("tollgate") => grpc,
            Some("upstream") => upstream,
            other => panic!("unexpected cluster {other:?}"),
        };
        let endpoint = &mut cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0];
        endpoint["endpoint"]["address"]["socket_address"] = address(port);
    }
    serde_json::to_string_pretty(&config).expect("JSON")
}

fn serve(limits: &Path) -> (Server, u16, PidRecord) {
    let (grpc, http) = free_ports();
    let mut command = tollgate();
    command
        .arg("serve")
        .arg("--config")
        .arg(limits)
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--drain-seconds", "0"]);
    let mut server = Server::spawn(command);
    let record = PidRecord::new(server.child.id(), env!("CARGO_BIN_EXE_tollgate"));
    server.wait_until_serving(grpc);
    (server, grpc, record)
}

#[test]
fn the_guides_envoy_file_limits_on_the_share_tollgate_assigns() {
    let dir = tempfile::Builder::new()
        .prefix("rlqs-deploy-")
        .tempdir_in(crate::stack::guard::run_dir())
        .expect("temp dir");
    let (_tollgate, grpc, _record) = serve(&root().join("deploy/rlqs/limits"));
    let (_upstream, upstream) = start::upstream(dir.path());
    let (envoy, _admin, listener) = start::envoy_on(
        &envoy_binary(),
        dir.path(),
        "envoy",
        "warning",
        |admin, listener| render(admin, listener, grpc, upstream),
    );
    let listener = start::loopback(listener);
    // The bucket {name: api} is 600 a minute: this one Envoy's token bucket holds 20
    // and refills 10 a second, so 40 at once cannot all pass once it is assigned.
    let burst = || http::send_all(listener, vec![http::Request::get("/"); 40]);
    let deadline = Instant::now() + ASSIGNED_WITHIN;
    let mut bursts = 0;
    let statuses: Vec<u16> = loop {
        let statuses: Vec<u16> = burst().iter().map(|r| r.status).collect();
        bursts += 1;
        assert!(
            statuses.iter().all(|s| [200, 429].contains(s)),
            "{statuses:?}"
        );
        if statuses.contains(&429) {
            break statuses;
        }
        assert!(
            Instant::now() < deadline,
            "no 429 after {bursts} bursts of 40 in {ASSIGNED_WITHIN:?}: no assignment?\n{}",
            envoy.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    assert!(admitted >= 1, "{statuses:?}");
    // Envoy's log names the API's status (docs/rlqs.md explains the line).
    let log = envoy.log_tail(200);
    assert!(log.contains("work-in-progress"), "{log}");
}
