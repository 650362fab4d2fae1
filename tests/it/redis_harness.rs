//! Self-test of the Redis test harness (`common::redis`): real servers start,
//! the cluster has the promised shape, helpers agree with Redis, start-up happens once
//! per binary, and the watchdog removes everything when the test process ends.

use crate::common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use common::redis::{
    self, KeyTarget, cli, cluster, cluster_nodes, info_field, keyslot, pttl, redis_cli,
    redis_cli_cluster, scan_keys, standalone, try_redis_cli, unique_prefix,
};

#[test]
fn standalone_answers_ping_and_set_get() {
    let server = standalone();
    eprintln!("standalone start-up took {:?}", server.startup_time());
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert_eq!(redis_cli(server.port(), &["PING"]), "PONG");

    let prefix = unique_prefix("standalone_answers_ping_and_set_get");
    let key = format!("{prefix}greeting");
    assert_eq!(server.cli(&["SET", &key, "hello world"]), "OK");
    assert_eq!(redis_cli(server.port(), &["GET", &key]), "hello world");
    assert_eq!(
        redis_cli(server.port(), &["GET", &format!("{prefix}missing")]),
        ""
    );

    assert_eq!(pttl(server, &key), -1);
    assert_eq!(pttl(server, &format!("{prefix}missing")), -2);
    let expiring = format!("{prefix}expiring");
    cli(server, &["SET", &expiring, "1", "PX", "60000"]);
    let left = pttl(server, &expiring);
    assert!((1..=60_000).contains(&left), "PTTL {left}");

    assert_eq!(
        scan_keys(server, &format!("{prefix}*")),
        vec![expiring, key]
    );
    assert_eq!(
        scan_keys(&server.port(), &format!("{prefix}nothing*")),
        Vec::<String>::new()
    );
}

#[test]
fn error_replies_fail_the_cli_helper() {
    let server = standalone();
    let message = try_redis_cli(server.port(), &["NO-SUCH-COMMAND"]).unwrap_err();
    assert!(message.contains("unknown command"), "{message}");
    let key = format!("{}list", unique_prefix("error_replies_fail_the_cli_helper"));
    server.cli(&["RPUSH", &key, "x"]);
    let message = try_redis_cli(server.port(), &["GET", &key]).unwrap_err();
    assert!(message.contains("WRONGTYPE"), "{message}");
}

#[test]
fn cluster_has_three_masters_with_one_replica_each() {
    let cluster = cluster();
    eprintln!("cluster start-up took {:?}", cluster.startup_time());

    let nodes = cluster.nodes();
    assert_eq!(nodes.len(), 6);
    assert_eq!(nodes.iter().collect::<BTreeSet<_>>().len(), 6);
    assert_eq!(cluster.seeds(), nodes);
    assert_eq!(
        cluster.seed_urls(),
        nodes
            .iter()
            .map(|addr| format!("redis://{addr}/"))
            .collect::<Vec<_>>()
    );

    for port in cluster.ports() {
        let info = redis_cli(port, &["CLUSTER", "INFO"]);
        assert_eq!(
            info_field(&info, "cluster_state"),
            Some("ok"),
            "node {port}"
        );
        assert_eq!(
            info_field(&info, "cluster_slots_assigned"),
            Some("16384"),
            "node {port}"
        );
        assert_eq!(
            info_field(&info, "cluster_known_nodes"),
            Some("6"),
            "node {port}"
        );
    }

    let view = cluster_nodes(cluster.ports()[0]);
    let masters: Vec<_> = view.iter().filter(|node| node.is_master()).collect();
    let replicas: Vec<_> = view.iter().filter(|node| node.is_replica()).collect();
    assert_eq!(masters.len(), 3, "{view:#?}");
    assert_eq!(replicas.len(), 3, "{view:#?}");
    assert_eq!(masters.iter().map(|m| m.slot_count()).sum::<u32>(), 16384);
    for master in &masters {
        let own: Vec<_> = replicas
            .iter()
            .filter(|replica| replica.master_id.as_deref() == Some(master.id.as_str()))
            .collect();
        assert_eq!(own.len(), 1, "replicas of {}: {view:#?}", master.addr);
    }
    let live_masters: BTreeSet<String> = masters.iter().map(|m| m.addr.clone()).collect();
    assert_eq!(
        cluster.masters().into_iter().collect::<BTreeSet<_>>(),
        live_masters
    );
    assert_eq!(cluster.replicas().len(), 3);
    let all: BTreeSet<String> = cluster
        .masters()
        .into_iter()
        .chain(cluster.replicas())
        .collect();
    assert_eq!(all, nodes.into_iter().collect());
    for replica in cluster.replicas() {
        let info = redis_cli(port_of(&replica), &["INFO", "replication"]);
        assert_eq!(
            info_field(&info, "master_link_status"),
            Some("up"),
            "{replica}"
        );
    }
}

#[test]
fn cluster_keys_are_routed_to_their_masters() {
    let cluster = cluster();
    let prefix = unique_prefix("cluster_keys_are_routed_to_their_masters");
    let keys: Vec<String> = (0..24).map(|i| format!("{prefix}key{i}")).collect();
    let mut owners = BTreeSet::new();
    for (i, key) in keys.iter().enumerate() {
        // `redis-cli -c` follows MOVED to the owner. With a TTL, like every key on the
        // shared cluster (`redis_concurrency::every_key_in_the_keyspace_has_a_ttl`).
        assert_eq!(
            cluster.cli(&["SET", key, &i.to_string(), "PX", "600000"]),
            "OK"
        );
        assert_eq!(cli(cluster, &["GET", key]), i.to_string());
        // The value is on the master serving the key's slot, without redirection.
        let master = cluster.master_for_key(key);
        assert_eq!(
            redis_cli(port_of(&master), &["GET", key]),
            i.to_string(),
            "{key} on {master}"
        );
        owners.insert(master);
    }
    assert_eq!(
        owners.len(),
        3,
        "24 keys should spread over all masters: {owners:?}"
    );
    assert_eq!(scan_keys(cluster, &format!("{prefix}*")), {
        let mut sorted = keys.clone();
        sorted.sort();
        sorted
    });

    // The node list works as a target too.
    assert_eq!(
        scan_keys(&cluster.nodes(), &format!("{prefix}*")).len(),
        keys.len()
    );
    assert_eq!(redis_cli_cluster(cluster, &["GET", &keys[5]]), "5");

    let expiring = format!("{prefix}expiring");
    cluster.cli(&["SET", &expiring, "1", "PX", "30000"]);
    let left = pttl(cluster, &expiring);
    assert!((1..=30_000).contains(&left), "PTTL {left}");
    assert!((1..=30_000).contains(&pttl(&cluster.nodes(), &expiring)));
    assert_eq!(pttl(cluster, &format!("{prefix}missing")), -2);

    // A key reaches the replica of its master (SCAN is not redirected by a replica).
    let key = &keys[0];
    let master = cluster.master_for_key(key);
    let view = cluster.topology();
    let master_id = &view.iter().find(|node| node.addr == master).unwrap().id;
    let replica = view
        .iter()
        .find(|node| node.master_id.as_ref() == Some(master_id))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while scan_keys(&replica.port(), key) != vec![key.clone()] {
        assert!(
            Instant::now() < deadline,
            "{key} not replicated to {}",
            replica.addr
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn keyslot_agrees_for_keys_sharing_a_hash_tag() {
    let cluster = cluster();
    let prefix = unique_prefix("keyslot_agrees_for_keys_sharing_a_hash_tag");
    assert!(!prefix.contains('{') && !prefix.contains('}'));
    let a = keyslot(cluster, &format!("{prefix}{{user42}}:minute"));
    let b = keyslot(cluster, &format!("{prefix}{{user42}}:hour"));
    assert_eq!(a, b);
    assert_eq!(a, keyslot(cluster, "user42"), "only the tag is hashed");
    // Values from the Redis Cluster specification / documentation.
    assert_eq!(keyslot(cluster, "foo"), 12182);
    assert_eq!(keyslot(cluster, "somekey"), 11058);
    assert_eq!(keyslot(cluster, "{foo}bar"), 12182);
    // An empty tag does not count: the whole key is hashed.
    assert_ne!(keyslot(cluster, "{}foo"), keyslot(cluster, "{}bar"));
    // A tag in the test name cannot hijack the slot.
    let odd = unique_prefix("name {with} tag");
    assert!(
        !odd.contains('{') && !odd.contains('}') && !odd.contains(' '),
        "{odd}"
    );
    assert_eq!(keyslot(cluster, &format!("{odd}{{user42}}")), a);
}

#[test]
fn unique_prefixes_differ() {
    let a = unique_prefix("same");
    let b = unique_prefix("same");
    assert_ne!(a, b);
    assert!(a.starts_with("same:") && a.ends_with(':'), "{a}");
    assert!(a.contains(&std::process::id().to_string()), "{a}");
}

#[test]
fn concurrent_callers_share_one_instance() {
    let barrier = Barrier::new(4);
    let (clusters, standalones): (Vec<_>, Vec<_>) = thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    (
                        cluster() as *const _ as usize,
                        standalone() as *const _ as usize,
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).unzip()
    });
    assert!(clusters.iter().all(|&c| c == clusters[0]), "{clusters:?}");
    assert!(
        standalones.iter().all(|&s| s == standalones[0]),
        "{standalones:?}"
    );
    assert!(std::ptr::eq(cluster(), cluster()));
    assert_eq!(redis::cluster_launches(), 1);
    assert_eq!(redis::standalone_launches(), 1);
    // The target impls route the same way for a reference.
    assert_eq!(cluster().entry(), (&cluster()).entry());
}

/// Run by `watchdog_removes_servers_when_the_test_process_ends` in a child process
/// (ignored otherwise): starts the standalone server, reports it, then exits or hangs.
#[test]
#[ignore = "helper process for watchdog_removes_servers_when_the_test_process_ends"]
fn harness_child_process() {
    let Ok(mode) = std::env::var("TOLLGATE_REDIS_HARNESS_CHILD") else {
        return;
    };
    let server = standalone();
    println!(
        "HARNESS-CHILD pid={} port={} dir={}",
        server.pid(),
        server.port(),
        server.dir().display()
    );
    if mode == "hang" {
        // Killed by the parent; ends anyway if the parent vanished.
        thread::sleep(Duration::from_secs(60));
    }
}

#[test]
fn watchdog_removes_servers_when_the_test_process_ends() {
    for mode in ["exit", "hang"] {
        // This test's own binary, filtered to the helper by its full test name.
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "redis_harness::harness_child_process",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env("TOLLGATE_REDIS_HARNESS_CHILD", mode)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let report = stdout
            .by_ref()
            .map(Result::unwrap)
            .find(|line| line.starts_with("HARNESS-CHILD "))
            .unwrap_or_else(|| panic!("child ({mode}) reported no server"));
        let field = |name: &str| {
            report
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .unwrap()
                .to_owned()
        };
        let (pid, port, dir) = (field("pid"), field("port"), field("dir"));
        // An exiting child may already have cleaned up by now (its atexit hook runs
        // right after the report), so only the hanging one is sure to still serve.
        if mode == "hang" {
            assert!(
                is_redis_server(&pid),
                "child ({mode}): redis-server {pid} not running"
            );
            child.kill().unwrap(); // SIGKILL: no destructor, no atexit, nothing runs.
        }
        // Read to EOF: closing the pipe early would make the child's prints fail.
        stdout.for_each(drop);
        let status = child.wait().unwrap();
        assert!(
            mode == "hang" || status.success(),
            "child ({mode}) failed: {status}"
        );

        let run_root = Path::new(&dir).parent().unwrap().to_owned();
        let deadline = Instant::now() + Duration::from_secs(10);
        while is_redis_server(&pid) || run_root.exists() {
            assert!(
                Instant::now() < deadline,
                "child ({mode}): redis-server {pid} (port {port}) or {} still there",
                run_root.display()
            );
            thread::sleep(Duration::from_millis(20));
        }
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).is_err(),
            "child ({mode}): port {port} still accepts connections"
        );
    }
}

fn is_redis_server(pid: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains("redis-server"))
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}
