//! The latency probe of a region: a global rule and a local one, alternately, on one
//! connection, and their p99s compared.

use std::time::{Duration, Instant};

use tollgate::proto::RateLimitServiceClient;
use tollgate::proto::rate_limit_response::Code;
use tonic::transport::Channel;

use crate::common::server::{descriptor, request};

/// Alternates a global rule and a local one on one region, in order, for `span`:
/// each call's latency, after the global counter has its first share (the first
/// calls meet a counter without one, denied at once without asking Redis, which
/// would flatter the global rule). Also how many global calls were not admitted.
async fn probe_latency(grpc: u16, span: Duration) -> (Vec<Duration>, Vec<Duration>, usize) {
    let channel = Channel::from_shared(format!("http://127.0.0.1:{grpc}"))
        .expect("a URL")
        .connect()
        .await
        .expect("connect the probe");
    let mut client = RateLimitServiceClient::new(channel);
    let global = || request("regions", vec![descriptor(&[("probe", "p")])]);
    let local = || request("regions", vec![descriptor(&[("local", "l")])]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = client
            .should_rate_limit(global())
            .await
            .expect("probe")
            .into_inner();
        if answer.overall_code == Code::Ok as i32 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the probe's counter got no share in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mut g, mut l, mut denied) = (Vec::new(), Vec::new(), 0);
    let began = Instant::now();
    while began.elapsed() < span {
        let t = Instant::now();
        let answer = client
            .should_rate_limit(global())
            .await
            .expect("probe")
            .into_inner();
        g.push(t.elapsed());
        if answer.overall_code != Code::Ok as i32 {
            denied += 1;
        }
        let t = Instant::now();
        client.should_rate_limit(local()).await.expect("probe");
        l.push(t.elapsed());
    }
    (g, l, denied)
}

/// Rounds of [`probe_latency`] until one shows a global rule's p99 within 1 ms of a
/// local rule's, three at most; every round's figures. On a loaded machine the p99
/// of one round moves by milliseconds between two identical distributions, so one
/// round is not a verdict; a global rule that waited for the ledger (200 ms a round
/// trip here) would fail every round.
pub(super) async fn latency_rounds(grpc: u16) -> Vec<(Duration, Duration, usize, usize)> {
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let (g, l, denied) = probe_latency(grpc, Duration::from_secs(14)).await;
        let n = g.len();
        let (pg, pl) = (p99(g), p99(l));
        rounds.push((pg, pl, n, denied));
        if pg <= pl + Duration::from_millis(1) {
            break;
        }
    }
    rounds
}

fn p99(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[(samples.len() * 99 / 100).min(samples.len() - 1)]
}
