//! How far a token budget (`overdraft: true`) is overdrawn when many requests of one
//! tenant run at once (docs/budgets.md, "How far a budget is overdrawn"): [`FLOWS`]
//! clients each repeat "check (descriptor hits_addend 0); if admitted, the upstream
//! answers (a few ms); charge the cost", spread over two `tollgate serve` replicas on
//! one Redis, until their check is refused.
//!
//! The bound: a check passes only while the tenant's count is below the budget, and a
//! charge always counts, so the charges that land after the last passing check are
//! those of requests in flight at that moment (between a passing check and their
//! charge), that one included. With at most C in flight, the count ends below the
//! budget plus C charges. The test asserts it against C as measured on the client
//! side (a request counts as in flight from before its check is sent until its
//! charge is answered: that span holds the span the server sees), that the budget
//! was spent, and that no charge was lost (Redis holds exactly the charges sent).
//!
//! The figures in docs/budgets.md come from this test:
//! `cargo test --release --test it budget_overdraw -- --nocapture`.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tonic::transport::Channel;

use common::process::{Server, serve_config};
use common::server::{descriptor, request};
use tollgate::proto::rate_limit_response::Code;
use tollgate::proto::{RateLimitDescriptor, RateLimitServiceClient};

const BUDGET: u64 = 10_000;
const COST: u64 = 100;
/// Concurrent check-then-charge flows, over two replicas.
const FLOWS: usize = 64;
const ROUNDS: usize = 5;
/// The upstream's answer takes up to this long (uniformly at random), between the
/// check and the charge.
const UPSTREAM_MS: u64 = 10;
/// A flow stops after this many admitted requests whatever the check says: a check
/// that kept passing would otherwise never end the round.
const MOST_PER_FLOW: u64 = 4 * BUDGET / COST;

/// `failure_mode: error`: a charge the store did not count must fail the test, not
/// pass as counted (a fail-open answer would read as a charge Redis never saw).
fn config() -> String {
    format!(
        "domain: budgets\nfailure_mode: error\ndescriptors:\n  - key: tenant\n    \
         overdraft: true\n    rate_limit: {{unit: year, requests_per_unit: {BUDGET}}}\n"
    )
}

fn tenant(name: &str, hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(hits),
        ..descriptor(&[("tenant", name)])
    }
}

/// What one round measured.
#[derive(Debug)]
struct Round {
    /// The tenant's count in Redis at the end.
    counted: u64,
    /// The charges sent (each of [`COST`]).
    charges: u64,
    /// The most flows in flight at once.
    in_flight: usize,
}

impl Round {
    fn overdrawn_charges(&self) -> f64 {
        (self.counted as f64 - BUDGET as f64) / COST as f64
    }
}

#[test]
fn concurrent_charges_overdraw_by_less_than_the_requests_in_flight() {
    let redis = common::redis::standalone();
    let prefix = common::redis::unique_prefix("budget_overdraw");
    let replica = || -> (Server, tempfile::TempDir, u16, u16) {
        // Generous: a loaded machine must not turn a call into a timeout, after which
        // the script may still have run (a charge counted but reported failed).
        let args = [
            "--redis-url",
            &redis.url(),
            "--key-prefix",
            &prefix,
            "--redis-timeout-ms",
            "10000",
        ];
        serve_config("budgets.yaml", &config(), &args, &[])
    };
    let (first, _first_dir, first_grpc, _) = replica();
    let (second, _second_dir, second_grpc, _) = replica();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let name = format!("t{round}");
        let measured = runtime.block_on(flows(&name, [first_grpc, second_grpc]));
        let pattern = format!("{prefix}*tenant={name}*");
        let keys = common::redis::scan_keys(redis, &pattern);
        assert_eq!(keys.len(), 1, "one counter for {name}: {keys:?}");
        let stored = redis.cli(&["GET", &keys[0]]);
        let round = Round {
            counted: common::redis::fixed_window_count(&stored),
            charges: measured.0,
            in_flight: measured.1,
        };
        eprintln!(
            "round {}: {} counted of a budget of {BUDGET}: overdrawn by {:.0} charges of \
             {COST}, {} flows in flight at most",
            rounds.len(),
            round.counted,
            round.overdrawn_charges(),
            round.in_flight
        );
        rounds.push(round);
    }
    for (i, round) in rounds.iter().enumerate() {
        assert_eq!(
            round.counted,
            round.charges * COST,
            "round {i}: Redis holds every charge sent, and only those: {round:?}"
        );
        assert!(
            round.counted >= BUDGET,
            "round {i}: the budget was spent: {round:?}"
        );
        assert!(
            round.counted < BUDGET + round.in_flight as u64 * COST,
            "round {i}: overdrawn by {} charges with at most {} in flight: {round:?}",
            round.overdrawn_charges(),
            round.in_flight
        );
    }
    let overdraws: Vec<f64> = rounds.iter().map(Round::overdrawn_charges).collect();
    eprintln!(
        "{FLOWS} flows over 2 replicas, {ROUNDS} rounds: overdrawn by {overdraws:?} \
         charges of {COST} on a budget of {BUDGET}"
    );
    assert!(first.terminate().success());
    assert!(second.terminate().success());
}

/// One round on tenant `name`: [`FLOWS`] flows, alternately on the two replicas at
/// `ports`, until each one's check is refused. The charges sent, and the most flows
/// in flight at once.
async fn flows(name: &str, ports: [u16; 2]) -> (u64, usize) {
    let mut clients = Vec::new();
    for port in ports {
        let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("a url")
            .connect()
            .await
            .expect("connect to a replica");
        clients.push(RateLimitServiceClient::new(channel));
    }
    let charges = Arc::new(AtomicU64::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..FLOWS)
        .map(|i| {
            let mut client = clients[i % 2].clone();
            let who = name.to_owned();
            let (charges, in_flight, most) = (charges.clone(), in_flight.clone(), most.clone());
            tokio::spawn(async move {
                for _ in 0..MOST_PER_FLOW {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let check = client
                        .should_rate_limit(request("budgets", vec![tenant(&who, 0)]))
                        .await
                        .expect("a check answered")
                        .into_inner();
                    if check.overall_code != Code::Ok as i32 {
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        return;
                    }
                    let upstream = fastrand::u64(0..=UPSTREAM_MS);
                    tokio::time::sleep(Duration::from_millis(upstream)).await;
                    // Its answer is not enforced: the tokens were spent.
                    client
                        .should_rate_limit(request("budgets", vec![tenant(&who, COST)]))
                        .await
                        .expect("a charge answered");
                    charges.fetch_add(1, Ordering::SeqCst);
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("a flow");
    }
    (charges.load(Ordering::SeqCst), most.load(Ordering::SeqCst))
}
