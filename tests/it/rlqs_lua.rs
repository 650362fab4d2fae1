//! The Lua twin of the RLQS division (`lua/rlqs.lua`) against the Rust model
//! (`rlqs::share`): random claims (unknown, zero and random demands, streams
//! reporting again), each claim sent to the script on the harness's Redis and its share
//! compared with the model's on the same claims. Zero disagreements.

use std::collections::BTreeMap;
use std::time::Duration;

use tollgate::rlqs::Ledger;
use tollgate::rlqs::ledger::ClaimRequest;
use tollgate::rlqs::ledger::redis::RedisLedger;
use tollgate::rlqs::share::{Claim, share_of};

use crate::common::stores::{options, standalone_target};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lua_ledger_divides_as_the_rust_model() {
    let options = options(standalone_target(), "rlqs_lua");
    let ledger = RedisLedger::new(options.clone()).unwrap();
    let mut rng = fastrand::Rng::with_seed(26);
    let mut compared = 0;
    for round in 0..150 {
        let key = format!("{}{{rlqs-diff-{round}}}", options.key_prefix);
        let tokens = rng.u64(1..5_000);
        let streams = rng.usize(1..8);
        let mut claims: BTreeMap<String, Option<f64>> = BTreeMap::new();
        for _ in 0..streams * 2 {
            let stream = format!("s{}", rng.usize(0..streams));
            let demand = match rng.u8(0..4) {
                0 => None,
                1 => Some(0.0),
                _ => Some(rng.f64() * 1_000.0),
            };
            claims.insert(stream.clone(), demand);
            let request = ClaimRequest {
                key: &key,
                stream: &stream,
                demand,
                tokens,
                stale_after: Duration::from_secs(60),
            };
            let granted = ledger.claim(request).await.expect("the script answers");
            let model: Vec<Claim> = claims
                .iter()
                .map(|(s, d)| Claim {
                    stream: s.clone(),
                    demand: *d,
                })
                .collect();
            let me = model.iter().position(|c| c.stream == stream).unwrap();
            assert_eq!(
                (granted.tokens, granted.streams),
                (share_of(&model, me, tokens), model.len()),
                "round {round}: {stream} of {model:?}, {tokens} tokens"
            );
            compared += 1;
        }
    }
    assert!(compared > 500, "{compared} shares compared");
}
