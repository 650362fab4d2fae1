//! Several `tollgate serve` processes sharing one Redis Cluster, configured the way
//! operators do it: with `--redis-cluster`, and with envoyproxy/ratelimit's variables
//! alone (`REDIS_TYPE=cluster`, `REDIS_URL`, `CACHE_KEY_PREFIX`). Together they admit
//! exactly the limit, and every key they wrote carries the prefix, a hash tag and a TTL.

use crate::common;

use std::fs;

use common::process::{Server, check, free_ports, row, tollgate};

const CONFIG: &str = "domain: shared\ndescriptors:\n  - key: client\n    rate_limit: {unit: year, requests_per_unit: 4}\n";

#[test]
fn processes_configured_by_flags_and_by_environment_share_one_count() {
    let cluster = common::redis::cluster();
    let prefix = common::redis::unique_prefix("cli_redis");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("root/rl/config");
    fs::create_dir_all(&config).unwrap();
    fs::write(config.join("shared.yaml"), CONFIG).unwrap();

    let mut servers = Vec::new();
    for by_environment in [false, true, true] {
        let (grpc, http) = free_ports();
        let mut command = tollgate();
        command.arg("serve");
        if by_environment {
            command
                .env("RUNTIME_ROOT", dir.path().join("root"))
                .env("RUNTIME_SUBDIRECTORY", "rl")
                .env("GRPC_HOST", "127.0.0.1")
                .env("GRPC_PORT", grpc.to_string())
                .env("HOST", "127.0.0.1")
                .env("PORT", http.to_string())
                .env("REDIS_TYPE", "cluster")
                .env("REDIS_URL", cluster.nodes().join(","))
                .env("CACHE_KEY_PREFIX", &prefix);
        } else {
            command
                .arg("--config")
                .arg(&config)
                .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
                .args(["--http-addr", &format!("127.0.0.1:{http}")])
                .args(["--redis-cluster", &cluster.nodes().join(",")])
                .args(["--key-prefix", &prefix]);
        }
        let mut server = Server::spawn(command);
        server.wait_until_serving(grpc);
        servers.push((server, grpc));
    }

    // Two calls to each of the three processes on one counter of limit 4.
    let mut codes = Vec::new();
    for _round in 0..2 {
        for (server, grpc) in &servers {
            let table = check(server, *grpc, "shared", "client=c");
            codes.push(row(&table, "client=c")[1].clone());
        }
    }
    assert_eq!(
        codes,
        ["OK", "OK", "OK", "OK", "OVER_LIMIT", "OVER_LIMIT"],
        "one count across processes"
    );

    let keys = common::redis::scan_keys(&cluster.nodes(), &format!("{prefix}*"));
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(
        keys[0].starts_with(&format!("{prefix}{{shared|client=c}}")),
        "{keys:?}"
    );
    assert!(common::redis::pttl(&cluster.nodes(), &keys[0]) > 0);

    for (server, _) in servers {
        assert_eq!(server.terminate().code(), Some(0));
    }
}
