//! Redis Sentinel with real `redis-sentinel`s (`redis-server --sentinel`): tollgate
//! reads envoyproxy/ratelimit's `REDIS_TYPE=sentinel` and `REDIS_URL=name,host:port,...`,
//! asks the sentinels for the master and counts there; when the master is killed
//! under load, the sentinels promote the replica and tollgate follows it. Errors and
//! wrong decisions are counted during the failover (printed for the README); after
//! it there must be none.

use crate::common;
use crate::common::fault_load;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis::custom::{kill_server, sentinel_group, wait_for};
use common::server::{TestServer, config};
use fault_load::{keys, run_for};
use tollgate::limiter::LimiterOptions;
use tollgate::settings::{ServeFlags, ServeSettings};
use tollgate::store::redis::RedisStore;
use tollgate::store::redis::connect::RedisTarget;

const DOMAIN: &str = "sentinel";
const LIMIT: u32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_the_master_through_a_failover() {
    let group = tokio::task::spawn_blocking(|| sentinel_group("tollgate", 1000))
        .await
        .unwrap()
        .expect("sentinel group");
    let env = [
        ("REDIS_TYPE", "sentinel".to_owned()),
        ("REDIS_URL", group.url()),
    ];
    let settings = ServeSettings::resolve(&ServeFlags::default(), &|name| {
        env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
    })
    .expect("settings");
    let mut options = settings.backend.redis().cloned().expect("redis configured");
    assert!(matches!(options.target, RedisTarget::Sentinel { .. }));
    options.key_prefix = common::redis::unique_prefix("sentinel");
    options.timeout = Duration::from_secs(1);
    let store = RedisStore::connect(&options)
        .await
        .expect("connect via sentinel");
    let server = TestServer::start(
        config(&fault_load::yaml(DOMAIN, LIMIT)),
        Arc::new(store),
        LimiterOptions::default(),
    )
    .await;
    let addr = server.grpc_addr;
    let before = run_for(
        addr,
        DOMAIN,
        keys("before", 100),
        LIMIT,
        8,
        Duration::from_secs(2),
    )
    .await;
    eprintln!("FIGURES sentinel before: {}", before.summary());
    assert_eq!((before.errors, before.wrong()), (0, 0), "{before:?}");
    let stored = common::redis::redis_cli(group.master.port, &["DBSIZE"]);
    assert_eq!(stored.trim(), "100", "the counters are on the master");

    let load = fault_load::start(addr, DOMAIN, keys("during", 100), LIMIT, 8).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = Instant::now();
    let old = group.master.port;
    let new_master = group.replica.addr();
    let group = tokio::task::spawn_blocking(move || {
        kill_server(old).expect("kill the master");
        wait_for("the sentinels' failover", Duration::from_secs(30), || {
            (group.current_master().as_deref() == Some(new_master.as_str()))
                .then_some(())
                .ok_or_else(|| format!("master is {:?}", group.current_master()))
        })
        .expect("failover");
        group
    })
    .await
    .unwrap();
    let failover = killed.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = load.stop().await;
    eprintln!(
        "FIGURES sentinel during: failover (kill to new master named) {:.1} s; {}; errors {:?}",
        failover.as_secs_f64(),
        during.summary(),
        during.error_kinds
    );

    let after = run_for(
        addr,
        DOMAIN,
        keys("after", 100),
        LIMIT,
        8,
        Duration::from_secs(3),
    )
    .await;
    eprintln!("FIGURES sentinel after: {}", after.summary());
    assert_eq!(after.errors, 0, "{:?}", after.error_kinds);
    assert_eq!(after.wrong(), 0, "{after:?}");
    let on_new = common::redis::redis_cli(group.replica.port, &["DBSIZE"]);
    assert!(
        on_new.trim().parse::<u64>().unwrap() >= 300,
        "the new master holds before, during and after: {on_new}"
    );
    server.stop().await;
}
