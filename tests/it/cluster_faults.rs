//! Redis Cluster faults under load, on clusters of their own (so no other test sees
//! them): a master is killed (its replica is promoted and serves the function
//! library it got by replication; its script cache, flushed, gets the refund
//! script when a refund first needs it), and slots are resharded between masters while traffic runs
//! (MOVED and ASK followed by the cluster client). Errors and wrong decisions are
//! counted before, during and after each fault; after recovery there must be none.
//! Each test prints its figures (`--nocapture`) for the README.

use crate::common;
use crate::common::fault_load;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis::custom::{kill_server, private_cluster, wait_for};
use common::redis::{RedisCluster, cluster_nodes, info_field, redis_cli, try_redis_cli};
use common::server::{TestServer, config};
use fault_load::{Tally, keys, run_for};
use tollgate::limiter::LimiterOptions;
use tollgate::store::redis::RedisStore;
use tollgate::store::redis::connect::{RedisOptions, RedisTarget};

const DOMAIN: &str = "faults";
const LIMIT: u32 = 3;
const KEYS: usize = 100;
const WORKERS: usize = 8;

async fn serve(cluster: &RedisCluster) -> TestServer {
    let options = RedisOptions {
        target: RedisTarget::Cluster(cluster.seed_urls()),
        auth: None,
        key_prefix: common::redis::unique_prefix("faults"),
        // Generous: a loaded CI machine must not turn slowness into "errors after recovery".
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(5),
        tls: Default::default(),
        state_layout: Default::default(),
    };
    let store = RedisStore::connect(&options).await.expect("connect");
    TestServer::start(
        config(&fault_load::yaml(DOMAIN, LIMIT)),
        Arc::new(store),
        LimiterOptions::default(),
    )
    .await
}

fn port(addr: &str) -> u16 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

fn clean(phase: &str, tally: &Tally) {
    eprintln!("FIGURES {phase}: {}", tally.summary());
    assert!(
        tally.requests > 100,
        "{phase}: too little traffic: {tally:?}"
    );
    assert_eq!(tally.errors, 0, "{phase}: {:?}", tally.error_kinds);
    assert_eq!(tally.wrong(), 0, "{phase}: {tally:?}");
}

/// Moves `slots` slots from the master of node id `from` to `to` with redis-cli
/// (asking `seed`), once the nodes agree on the topology; how many it moved.
pub fn reshard(seed: &str, from: &str, to: &str, slots: usize) -> usize {
    // redis-cli refuses to start while the nodes' views still differ.
    wait_for("the nodes to agree", Duration::from_secs(20), || {
        let check = std::process::Command::new("redis-cli")
            .args(["--cluster", "check", seed])
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&check.stdout).into_owned();
        (check.status.success() && !text.contains("[ERR]"))
            .then_some(())
            .ok_or(text)
    })
    .expect("cluster check");
    let output = std::process::Command::new("redis-cli")
        .args(["--cluster", "reshard", seed])
        .args(["--cluster-from", from, "--cluster-to", to])
        .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
        .args(["--cluster-pipeline", "10"])
        .output()
        .expect("redis-cli --cluster reshard");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "reshard failed: {stdout}");
    // redis-cli names each slot twice: in its plan and when moving it.
    stdout.matches("Moving slot").count() / 2
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_master_under_load() {
    let cluster = blocking(|| private_cluster().expect("private cluster")).await;
    let server = serve(&cluster).await;
    let addr = server.grpc_addr;
    let before = run_for(
        addr,
        DOMAIN,
        keys("before", KEYS),
        LIMIT,
        WORKERS,
        Duration::from_secs(2),
    )
    .await;
    clean("kill-master before", &before);

    let victim = port(&cluster.masters()[0]);
    let heir = port(&cluster.replicas()[0]);
    // The heir starts without our scripts, as a replica restarted from scratch would.
    redis_cli(heir, &["SCRIPT", "FLUSH"]);
    let load = fault_load::start(addr, DOMAIN, keys("during", KEYS), LIMIT, WORKERS).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = Instant::now();
    blocking(move || kill_server(victim).expect("kill the master")).await;
    blocking(move || {
        wait_for("the replica's promotion", Duration::from_secs(30), || {
            let info = try_redis_cli(heir, &["CLUSTER", "INFO"])?;
            let promoted = cluster_nodes(heir)
                .iter()
                .any(|n| n.port() == heir && n.is_master() && n.slot_count() > 0);
            (promoted && info_field(&info, "cluster_state") == Some("ok"))
                .then_some(())
                .ok_or_else(|| "not yet".to_owned())
        })
        .expect("failover")
    })
    .await;
    let failover = killed.elapsed();
    // Give the client a moment to learn the new topology, then stop.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = load.stop().await;
    eprintln!(
        "FIGURES kill-master during: failover (kill to cluster_state ok) {:.1} s; {}; errors {:?}",
        failover.as_secs_f64(),
        during.summary(),
        during.error_kinds
    );

    let after = run_for(
        addr,
        DOMAIN,
        keys("after", KEYS),
        LIMIT,
        WORKERS,
        Duration::from_secs(3),
    )
    .await;
    clean("kill-master after", &after);
    // The function library came with the data (functions replicate), so the new
    // master served batch calls without a load; the refund script, an EVALSHA whose
    // cache the flush emptied, is loaded there when a refund first needs it.
    let commandstats = redis_cli(heir, &["INFO", "commandstats"]);
    let fcalls = info_field(&commandstats, "cmdstat_fcall")
        .and_then(|stats| stats.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        fcalls > 0,
        "the new master served no batch call: {commandstats}"
    );
    let errorstats = redis_cli(heir, &["INFO", "errorstats"]);
    eprintln!(
        "FIGURES kill-master on the new master: {fcalls} FCALL, errors {}",
        errorstats.lines().skip(1).collect::<Vec<_>>().join(" ")
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_under_load() {
    let cluster = blocking(|| private_cluster().expect("private cluster")).await;
    let server = serve(&cluster).await;
    let addr = server.grpc_addr;
    let before = run_for(
        addr,
        DOMAIN,
        keys("before", KEYS),
        LIMIT,
        WORKERS,
        Duration::from_secs(2),
    )
    .await;
    clean("reshard before", &before);

    let masters = cluster.masters();
    let view = cluster_nodes(port(&masters[0]));
    let id = |addr: &str| {
        view.iter()
            .find(|n| n.addr == addr)
            .map(|n| n.id.clone())
            .expect("node id")
    };
    let (from, to) = (id(&masters[0]), id(&masters[1]));
    let seed = masters[2].clone();
    let load = fault_load::start(addr, DOMAIN, keys("during", KEYS), LIMIT, WORKERS).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let began = Instant::now();
    let moved = blocking(move || {
        // There and back: keys written during the first move migrate again.
        reshard(&seed, &from, &to, 1500) + reshard(&seed, &to, &from, 1500)
    })
    .await;
    let resharding = began.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = load.stop().await;
    eprintln!(
        "FIGURES reshard during: 2 x 1500 slots moved in {:.1} s; {}; errors {:?}",
        resharding.as_secs_f64(),
        during.summary(),
        during.error_kinds
    );
    assert_eq!(moved, 3000, "slots moved");

    let after = run_for(
        addr,
        DOMAIN,
        keys("after", KEYS),
        LIMIT,
        WORKERS,
        Duration::from_secs(3),
    )
    .await;
    clean("reshard after", &after);
    // Counters moved with their slots: every "during" key reached its limit then, so
    // each must still be over it (a lost count would answer OK).
    let again = run_for(
        addr,
        DOMAIN,
        keys("during", KEYS),
        LIMIT,
        WORKERS,
        Duration::from_secs(1),
    )
    .await;
    eprintln!(
        "FIGURES reshard re-check of the migrated counters: {} OK of {} (must be 0)",
        again.ok, again.requests
    );
    assert_eq!(again.errors, 0, "{:?}", again.error_kinds);
    assert_eq!(again.ok, 0, "a migrated counter lost its count");
    server.stop().await;
}
