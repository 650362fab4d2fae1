//! The Lua twin of a bucket's claims (`lua/rlqs.lua`) against the Rust model
//! (`rlqs::claims`): random reports (unknown, zero, liar and random weights; client
//! ids shared by several streams, resumed or not, so aliases, takeovers and ids marked
//! shared; limits from 1 to
//! thousands), releases and waits long enough for claims to go stale, holds to run out
//! and tokens given back to come free, sent to the script on the harness's Redis and
//! applied to the model at the script's own clock. Every grant, live count, age and
//! flag, and the bucket's running totals after every call, must agree: zero
//! disagreements.
//!
//! The script's clock: a claim writes it as the claim's last report, read back after
//! the call; a release (which writes no time) is run on the model at the Redis times
//! read just before and just after it, and must agree with Redis's totals at one.

use std::time::Duration;

use tollgate::rlqs::Ledger;
use tollgate::rlqs::claims::{Claims, Grant, Report, Timing};
use tollgate::rlqs::ledger::redis::RedisLedger;
use tollgate::rlqs::ledger::{ClaimRequest, Granted};
use tollgate::rlqs::share::SCALE;
use tollgate::store::breaker::BreakerOptions;

use crate::common::stores::{options, standalone_target};

/// Short enough that a run sees claims go stale, holds end and tokens come free.
const TIMING: Timing = Timing {
    stale_ms: 150,
    hold_ms: 300,
    grace_ms: 60,
};

type Con = redis::aio::MultiplexedConnection;

async fn redis_ms(con: &mut Con) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(con).await.unwrap();
    secs * 1000 + micros / 1000
}

/// The bucket's totals as Redis keeps them; `None`: the bucket is gone.
async fn totals(con: &mut Con, key: &str) -> Option<[u64; 7]> {
    let fields: Vec<Option<u64>> = redis::cmd("HMGET")
        .arg(key)
        .arg(&["w", "kw", "k", "l", "a", "s", "n"])
        .query_async(con)
        .await
        .unwrap();
    fields
        .iter()
        .all(Option::is_some)
        .then(|| std::array::from_fn(|i| fields[i].unwrap_or(0)))
}

/// When the script ran a claim: the claim's last report, as it wrote it.
async fn claimed_at(con: &mut Con, key: &str, claim: &str) -> u64 {
    let record: String = redis::cmd("HGET")
        .arg(key)
        .arg(format!("c:{claim}"))
        .query_async(con)
        .await
        .unwrap();
    record.split(' ').nth(3).unwrap().parse().unwrap()
}

fn same(granted: &Granted, grant: &Grant) -> bool {
    (
        granted.tokens,
        granted.streams as u64,
        granted.on_alias,
        granted.partial,
    ) == (grant.tokens, grant.streams, grant.on_alias, grant.partial)
        && granted.age.as_millis() as u64 == grant.age_ms
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lua_ledger_keeps_claims_as_the_rust_model() {
    let options = options(standalone_target(), "rlqs_lua");
    let ledger = RedisLedger::new(&options, BreakerOptions::default()).unwrap();
    let url = crate::common::redis::standalone().url();
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut rng = fastrand::Rng::with_seed(26);
    let (mut claims_compared, mut releases_compared) = (0, 0);
    for round in 0..12 {
        let key = format!("{}{{rlqs-diff-{round}}}:rlqs", options.key_prefix);
        let tokens = [1, 3, 10, 600, rng.u64(1..5_000)][rng.usize(0..5)];
        let mut model: Option<Claims> = None;
        for call in 0..40 {
            let stream = rng.usize(0..6);
            let own = format!("s{stream}");
            // Streams 0-2 share one client id, 3 has its own, 4-5 none.
            let name = match stream {
                0..=2 => "client:fleet".to_owned(),
                3 => "client:solo".to_owned(),
                _ => own.clone(),
            };
            let weight = match rng.u8(0..5) {
                0 => None,
                1 => Some(0),
                2 => Some(SCALE),
                _ => Some(rng.u64(0..=SCALE)),
            };
            let resumed = rng.bool();
            tokio::time::sleep(Duration::from_millis(rng.u64(0..70))).await;
            let context =
                format!("round {round} call {call}: {own} as {name}, {weight:?} of {tokens}");
            if rng.u8(0..8) == 0 {
                let before = redis_ms(&mut con).await;
                ledger
                    .release(&key, &name, &own, &own, TIMING)
                    .await
                    .expect("the script answers");
                let after = redis_ms(&mut con).await;
                let redis = totals(&mut con, &key).await;
                let at = |now: u64| {
                    let mut claims = model.clone()?;
                    claims.release(&name, &own, &own, &TIMING, now);
                    (!claims.is_empty()).then_some(claims)
                };
                let candidates = [at(before), at(after)];
                let agreeing = candidates
                    .into_iter()
                    .find(|m| m.as_ref().map(Claims::totals) == redis);
                assert!(
                    agreeing.is_some(),
                    "{context}: release left Redis at {redis:?}, the model at {:?} or {:?}",
                    at(before).map(|m| m.totals()),
                    at(after).map(|m| m.totals()),
                );
                model = agreeing.flatten();
                releases_compared += 1;
                continue;
            }
            let report = Report {
                name: &name,
                alias: &own,
                owner: &own,
                weight,
                resumed,
                tokens,
            };
            let request = ClaimRequest {
                key: &key,
                report,
                timing: TIMING,
            };
            let granted = ledger.claim(request).await.expect("the script answers");
            let claim = if granted.on_alias { &own } else { &name };
            let now = claimed_at(&mut con, &key, claim).await;
            let before = model.clone();
            let mut claims = model.take().unwrap_or_else(|| Claims::new(now));
            let grant = claims.claim(&report, &TIMING, now);
            if !same(&granted, &grant) {
                let hash: Vec<String> = redis::cmd("HGETALL")
                    .arg(&key)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                panic!(
                    "{context} at {now} ms: Redis {granted:?}, model {grant:?}\nRedis now: {hash:?}\nmodel before: {before:?}"
                );
            }
            let redis = totals(&mut con, &key).await;
            assert_eq!(redis, Some(claims.totals()), "{context}: totals");
            model = Some(claims);
            claims_compared += 1;
        }
    }
    assert!(claims_compared >= 400, "{claims_compared} claims compared");
    assert!(
        releases_compared >= 20,
        "{releases_compared} releases compared"
    );
}
