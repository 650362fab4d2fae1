//! The quota service (RLQS) over real gRPC streams: shares follow reported demand and
//! never sum past the limit, on the memory ledger (one replica) and in Redis
//! (standalone and cluster: two replicas divide one limit); free buckets are allowed
//! in full; a stream that breaks a rule or a bound (streams, streams per connection,
//! buckets, the byte budget, silence) ends alone with a clear status; `/rlqs` is a
//! summary with pages. Many streams, shared ids and liars: `rlqs_scale.rs`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tollgate::rlqs::budget::STREAM_BYTES;
use tollgate::rlqs::ledger::redis::RedisLedger;
use tollgate::rlqs::{Rlqs, RlqsOptions};
use tollgate::store::breaker::BreakerOptions;

use crate::common::rlqs::{Envoy, Share, bucket, channel, get, reports, start};
use crate::common::stores::{cluster_target, options, standalone_target};

/// Three streams: the first gets the whole limit, the next two nothing until the
/// first gives some back; once they report demand 10:1:1 (the busy one's counted up
/// to the limit's rate) the shares follow it; when the busy one goes quiet, its
/// share goes to the others. At no answer do the latest shares sum past the limit.
async fn shares_follow_demand(addrs: [SocketAddr; 3]) {
    let mut envoys = Vec::new();
    for addr in addrs {
        envoys.push(Envoy::open(addr).await.unwrap());
    }
    let mut shares = [0u64; 3];
    let mut record = |i: usize, share: Option<Share>| {
        shares[i] = share.expect("an answer").tokens();
        let sum: u64 = shares.iter().sum();
        assert!(sum <= 600, "shares {shares:?} sum past the limit");
        shares
    };
    let first = record(0, envoys[0].report("api", 1, 0).await.unwrap());
    assert_eq!(first[0], 600, "alone, the whole limit");
    for i in [1, 2] {
        let share = envoys[i].report("api", 1, 0).await.unwrap();
        assert_eq!(share, Some(Share::Denied), "nothing unassigned yet");
        record(i, share);
    }
    // Rounds more than 2 s apart (tokens given back are reusable 2 s later): about
    // 20, 2 and 2 requests per second against a limit of 10.
    let mut last = [0u64; 3];
    for _round in 0..3 {
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        for (i, requests) in [42, 4, 4].into_iter().enumerate() {
            last = record(i, envoys[i].report("api", requests, 2).await.unwrap());
        }
    }
    let sum: u64 = last.iter().sum();
    assert!((590..=600).contains(&sum), "shares {last:?} use the limit");
    assert!(last[0] >= 400, "the busy stream gets most: {last:?}");
    assert!(last[1] >= 60 && last[2] >= 60, "{last:?}");
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    record(0, envoys[0].report("api", 0, 2).await.unwrap());
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    // Still about 2 a second each, over the two periods since their last report.
    for i in [1, 2] {
        last = record(i, envoys[i].report("api", 8, 4).await.unwrap());
    }
    assert!(
        last[1] >= 250 && last[2] >= 250,
        "the quiet streams got the busy one's share: {last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_follow_demand_on_one_replica() {
    let server = start(Rlqs::in_memory).await;
    shares_follow_demand([server.grpc; 3]).await;
}

async fn two_replicas(target: tollgate::store::redis::connect::RedisTarget, test: &str) {
    let redis = options(target, test);
    let make = |limiter| {
        let ledger = RedisLedger::new(&redis, BreakerOptions::default()).unwrap();
        Rlqs::new(
            limiter,
            Arc::new(ledger),
            RlqsOptions::default(),
            &redis.key_prefix,
        )
    };
    let a = start(make).await;
    let b = start(make).await;
    shares_follow_demand([a.grpc, b.grpc, a.grpc]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_divide_one_limit() {
    two_replicas(standalone_target(), "rlqs_standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_cluster_divide_one_limit() {
    two_replicas(cluster_target(), "rlqs_cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_buckets_are_allowed_in_full() {
    let server = start(Rlqs::in_memory).await;
    let mut envoy = Envoy::open(server.grpc).await.unwrap();
    for name in ["free", "nothing-matches"] {
        let share = envoy.report(name, 3, 0).await.unwrap();
        assert_eq!(share, Some(Share::AllowAll), "{name}");
    }
}

/// A stream that breaks a rule ends with INVALID_ARGUMENT naming it; another stream on
/// the same server keeps its answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_ends_only_its_own_stream() {
    let options = RlqsOptions {
        max_bucket_id_bytes: 64,
        ..RlqsOptions::default()
    };
    let server = start(|limiter| Rlqs::memory(limiter, options)).await;
    let addr = server.grpc;
    let mut good = Envoy::open(addr).await.unwrap();
    assert_eq!(
        good.report("api", 1, 0).await.unwrap(),
        Some(Share::Tokens(600))
    );
    let cases = [
        (reports("quota", bucket(&[]), 1, 0, 0), "no entries"),
        (reports("quota", bucket(&[("name", "")]), 1, 0, 0), "empty"),
        (
            reports("quota", bucket(&[("name", &"x".repeat(100))]), 1, 0, 0),
            "--rlqs-max-bucket-id-bytes",
        ),
        (
            reports("", bucket(&[("name", "api")]), 1, 0, 0),
            "no domain",
        ),
    ];
    for (message, says) in cases {
        let mut bad = Envoy::open(addr).await.unwrap();
        bad.tx.send(message).await.unwrap();
        let status = bad.next().await.expect_err("the stream ends");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(says), "{status:?}");
    }
    let mut changer = Envoy::open(addr).await.unwrap();
    assert!(changer.report("api", 1, 0).await.unwrap().is_some());
    changer
        .tx
        .send(reports("other", bucket(&[("name", "api")]), 1, 0, 0))
        .await
        .unwrap();
    assert_eq!(
        changer.next().await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    assert_eq!(
        good.report("api", 1, 0).await.unwrap(),
        Some(Share::Tokens(600)),
        "the good stream still answered"
    );
}

/// The status a stream ends with after one report of `name`.
async fn refused(envoy: &mut Envoy, name: &str) -> tonic::Status {
    envoy.send(name, 1, 0, 0).await;
    envoy.next().await.expect_err("the stream ends")
}

fn assert_exhausted(status: &tonic::Status, flag: &str) {
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains(flag), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_buckets_are_bounded() {
    let options = RlqsOptions {
        max_streams: 1,
        max_buckets_per_stream: 1,
        ..RlqsOptions::default()
    };
    let server = start(|limiter| Rlqs::memory(limiter, options)).await;
    let mut one = Envoy::open(server.grpc).await.unwrap();
    assert!(one.report("api", 1, 0).await.unwrap().is_some());
    let second = Envoy::open(server.grpc).await;
    assert_exhausted(&second.err().expect("refused"), "--rlqs-max-streams");
    assert_exhausted(
        &refused(&mut one, "free").await,
        "--rlqs-max-buckets-per-stream",
    );
}

/// One connection opens at most `--rlqs-max-streams-per-peer` streams (10,000 silent
/// streams of one client cannot take every slot); another connection still can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_per_connection_are_bounded() {
    let options = RlqsOptions {
        max_streams_per_peer: 3,
        ..RlqsOptions::default()
    };
    let server = start(|limiter| Rlqs::memory(limiter, options)).await;
    let one = channel(server.grpc).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(Envoy::on(one.clone(), None).await.unwrap());
    }
    let fourth = Envoy::on(one.clone(), Some("envoy-4")).await;
    assert_exhausted(
        &fourth.err().expect("refused"),
        "--rlqs-max-streams-per-peer",
    );
    let mut other = Envoy::open(server.grpc).await.expect("another connection");
    assert!(other.report("api", 1, 0).await.unwrap().is_some());
    // A slot is free again once a stream ends.
    drop(open.pop());
    let mut again = None;
    for _ in 0..50 {
        if let Ok(envoy) = Envoy::on(one.clone(), None).await {
            again = Some(envoy);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(again.is_some(), "the ended stream's slot came back");
}

/// Past `--rlqs-max-bytes` a new bucket, and a new stream, are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_budget_refuses_what_does_not_fit() {
    let options = RlqsOptions {
        max_bytes: STREAM_BYTES + 1_500,
        ..RlqsOptions::default()
    };
    let server = start(|limiter| Rlqs::memory(limiter, options)).await;
    let mut envoy = Envoy::open(server.grpc).await.unwrap();
    assert!(envoy.report("api", 1, 0).await.unwrap().is_some());
    assert_exhausted(&refused(&mut envoy, "small").await, "--rlqs-max-bytes");
    // The refused stream's charge comes back as its task ends.
    let mut first = None;
    for _ in 0..100 {
        if let Ok(envoy) = Envoy::open(server.grpc).await {
            first = Some(envoy);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _first = first.expect("a stream fits again");
    let second = Envoy::open(server.grpc).await;
    assert_exhausted(&second.err().expect("refused"), "--rlqs-max-bytes");
}

/// A stream that sends nothing is closed after `--rlqs-idle-stream-secs`; one that
/// reports stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_streams_are_closed() {
    let options = RlqsOptions {
        report_period: Duration::from_secs(1),
        stale_after: Duration::from_secs(2),
        assignment_ttl: Duration::from_secs(2),
        idle_after: Duration::from_secs(2),
        ..RlqsOptions::default()
    };
    options.check().unwrap();
    let server = start(|limiter| Rlqs::memory(limiter, options)).await;
    let mut silent = Envoy::open(server.grpc).await.unwrap();
    let mut talking = Envoy::open(server.grpc).await.unwrap();
    let began = std::time::Instant::now();
    while began.elapsed() < Duration::from_secs(3) {
        assert!(talking.report("api", 1, 0).await.unwrap().is_some());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let status = silent.next().await.expect_err("closed");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("--rlqs-idle-stream-secs"),
        "{status:?}"
    );
    assert!(talking.report("api", 1, 0).await.unwrap().is_some());
}

/// `/rlqs` is a summary with a page of streams, one line each; `?stream=` shows one
/// stream's buckets and shares; `/metrics` the streams, buckets, assigned rate, what
/// Envoy reported and the state's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_is_paged_and_metrics_show_buckets_and_shares() {
    let server = start(Rlqs::in_memory).await;
    let mut envoy = Envoy::open(server.grpc).await.unwrap();
    assert_eq!(
        envoy.report("api", 4, 0).await.unwrap(),
        Some(Share::Tokens(600))
    );
    envoy.report("free", 2, 0).await.unwrap();
    let mut others = Vec::new();
    for _ in 0..2 {
        others.push(Envoy::open(server.grpc).await.unwrap());
    }
    let json = |body: &str| -> serde_json::Value { serde_json::from_str(body).expect("JSON") };
    let (status, body) = get(server.http, "/rlqs?limit=2").await;
    assert_eq!(status, 200, "{body}");
    let view = json(&body);
    assert_eq!(
        (view["streams"].as_u64(), view["buckets"].as_u64()),
        (Some(3), Some(2))
    );
    assert!(view["state_bytes"].as_u64().unwrap() > 0, "{view}");
    let page = view["page"].as_array().unwrap();
    assert_eq!(page.len(), 2, "{view}");
    assert_eq!(page[0]["buckets"], 2, "{view}");
    let id = page[0]["id"].as_u64().unwrap();
    let next = view["next"].as_u64().expect("a next page");
    let (_, body) = get(server.http, &format!("/rlqs?after={next}&limit=2")).await;
    let rest = json(&body);
    assert_eq!(rest["page"].as_array().unwrap().len(), 1, "{rest}");
    assert!(rest["next"].is_null(), "{rest}");
    let (_, body) = get(server.http, &format!("/rlqs?stream={id}")).await;
    let stream = json(&body);
    let api = stream["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["bucket"]["name"] == "api")
        .expect("the api bucket");
    assert_eq!(api["share_tokens"], 600, "{stream}");
    assert_eq!(api["rule"], "name_api", "{stream}");
    assert_eq!(get(server.http, "/rlqs?stream=999999").await.0, 404);
    assert_eq!(get(server.http, "/rlqs?everything=1").await.0, 400);
    let (_, metrics) = get(server.http, "/metrics").await;
    for line in [
        "tollgate_rlqs_streams 3",
        "tollgate_rlqs_buckets{domain=\"quota\",rule=\"name_api\"} 1",
        "tollgate_rlqs_assigned_rate{domain=\"quota\",rule=\"name_api\"} 10.0",
        "tollgate_rlqs_reported_requests_total{domain=\"quota\",rule=\"name_api\",outcome=\"allowed\"} 2",
        "tollgate_rlqs_allowed_in_full_total{domain=\"quota\",rule=\"name_free\",reason=\"unlimited\"} 1",
        "tollgate_rlqs_state_bytes ",
        "tollgate_rlqs_ledger_duration_seconds_count ",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
}
