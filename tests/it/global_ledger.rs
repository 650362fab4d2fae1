//! The global ledger on real Redis, standalone and cluster: a record is created only
//! where absent, replaced only from the value it was read as (a conflict answers
//! with what is there), expires with its TTL, and every record of a batch lives in
//! one slot, so a cluster takes the batch as one script call.

use std::time::Duration;

use tollgate::global::ledger::redis::RedisLedger;
use tollgate::global::ledger::{Ledger, Swap, Swapped};
use tollgate::store::redis::connect::{RedisOptions, RedisTarget, RedisTls};

use crate::common::redis::{self, unique_prefix};

fn options(target: RedisTarget) -> RedisOptions {
    RedisOptions {
        target,
        tls: RedisTls::default(),
        auth: None,
        key_prefix: String::new(),
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(5),
        state_layout: Default::default(),
    }
}

async fn compare_and_swap(ledger: &RedisLedger, prefix: &str) {
    let keys: Vec<String> = ["a", "b"]
        .iter()
        .map(|id| RedisLedger::key(prefix, id))
        .collect();
    assert_eq!(ledger.read(&keys).await.unwrap(), vec![None, None]);
    let create = |key: &String, new: &str| Swap {
        key: key.clone(),
        expected: None,
        new: new.to_owned(),
        ttl_ms: 60_000,
    };
    let done = ledger
        .swap(&[create(&keys[0], "1"), create(&keys[1], "x")])
        .await
        .unwrap();
    assert_eq!(done, vec![Swapped::Done, Swapped::Done]);
    // Created again where it exists: the swap answers with what is there.
    let again = ledger.swap(&[create(&keys[0], "2")]).await.unwrap();
    assert_eq!(again, vec![Swapped::Conflict(Some("1".into()))]);
    // Replaced from the value read; from a stale one, refused.
    let replace = |expected: &str, new: &str, ttl_ms| Swap {
        key: keys[0].clone(),
        expected: Some(expected.to_owned()),
        new: new.to_owned(),
        ttl_ms,
    };
    assert_eq!(
        ledger.swap(&[replace("1", "2", 300)]).await.unwrap(),
        vec![Swapped::Done]
    );
    assert_eq!(
        ledger.swap(&[replace("1", "3", 300)]).await.unwrap(),
        vec![Swapped::Conflict(Some("2".into()))]
    );
    assert_eq!(
        ledger.read(&keys).await.unwrap(),
        vec![Some("2".into()), Some("x".into())]
    );
    // Expected, but gone: answered as absent.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ledger.read(&keys[..1]).await.unwrap()[0].is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the TTL did not expire the record"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        ledger.swap(&[replace("2", "3", 300)]).await.unwrap(),
        vec![Swapped::Conflict(None)]
    );
}

#[tokio::test]
async fn records_swap_only_from_the_value_read_on_a_standalone_redis() {
    let target = RedisTarget::Standalone(redis::standalone().url());
    let ledger = RedisLedger::new(options(target), Duration::from_secs(2)).unwrap();
    compare_and_swap(&ledger, &unique_prefix("global-ledger")).await;
}

#[tokio::test]
async fn records_swap_only_from_the_value_read_on_a_cluster() {
    let target = RedisTarget::Cluster(redis::cluster().seed_urls());
    let ledger = RedisLedger::new(options(target), Duration::from_secs(2)).unwrap();
    compare_and_swap(&ledger, &unique_prefix("global-ledger")).await;
}

#[tokio::test]
async fn an_unreachable_ledger_is_an_error_not_a_wait() {
    let port = crate::common::ports::free_port();
    let target = RedisTarget::Standalone(format!("redis://127.0.0.1:{port}"));
    let ledger = RedisLedger::new(options(target), Duration::from_millis(500)).unwrap();
    let began = std::time::Instant::now();
    let keys = vec![RedisLedger::key("", "a")];
    assert!(ledger.read(&keys).await.is_err());
    assert!(
        began.elapsed() < Duration::from_secs(6),
        "{:?}",
        began.elapsed()
    );
}
