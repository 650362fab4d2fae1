//! The quota service (RLQS) over real gRPC streams: shares follow reported demand and
//! sum to the limit, on the memory ledger (one replica) and in Redis (standalone and
//! cluster: two replicas divide one limit); free buckets are allowed in full; a stream
//! that breaks a rule or a bound ends alone with a clear status.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use tollgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use tollgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use tollgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use tollgate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tollgate::rlqs::ledger::memory::MemoryLedger;
use tollgate::rlqs::ledger::redis::RedisLedger;
use tollgate::rlqs::{Ledger, Rlqs, RlqsOptions};
use tollgate::server::{self, Listeners, ServeOptions};
use tollgate::store::memory::MemoryStore;

use crate::common::server::config;
use crate::common::stores::{cluster_target, options, standalone_target};

const YAML: &str = "domain: quota\ndescriptors:\n  - key: name\n    value: api\n    rate_limit: {unit: minute, requests_per_unit: 600}\n  - key: name\n    value: free\n    rate_limit: {unlimited: true}\n";

/// A server on port 0 whose quota service uses `ledger`; dropping the sender stops it.
async fn start(
    ledger: Arc<dyn Ledger>,
    options: RlqsOptions,
    prefix: &str,
) -> (SocketAddr, oneshot::Sender<()>) {
    let (grpc, _http, stop) = start_http(ledger, options, prefix).await;
    (grpc, stop)
}

/// [`start`], also returning the HTTP port.
async fn start_http(
    ledger: Arc<dyn Ledger>,
    options: RlqsOptions,
    prefix: &str,
) -> (SocketAddr, SocketAddr, oneshot::Sender<()>) {
    let limiter = Arc::new(Limiter::new(
        config(YAML),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    ));
    let rlqs = Arc::new(Rlqs::new(limiter.clone(), ledger, options, prefix));
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let listeners = Listeners::bind(any, any).await.unwrap();
    let addr = listeners.grpc_addr();
    let http = listeners.http_addr();
    let (tx, rx) = oneshot::channel::<()>();
    let serve = ServeOptions {
        rlqs: Some(rlqs),
        ..ServeOptions::default()
    };
    tokio::spawn(server::run_with(listeners, limiter, serve, async move {
        let _ = rx.await;
    }));
    (addr, http, tx)
}

/// One Envoy's stream: send reports, read actions.
struct Envoy {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: Streaming<RateLimitQuotaResponse>,
}

impl Envoy {
    async fn open(addr: SocketAddr) -> Result<Self, tonic::Status> {
        let mut client = RateLimitQuotaServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let (tx, reports) = mpsc::channel(8);
        let rx = client
            .stream_rate_limit_quotas(ReceiverStream::new(reports))
            .await?
            .into_inner();
        Ok(Self { tx, rx })
    }

    /// Reports `name`'s bucket with `requests` over `elapsed` seconds; the answer.
    async fn report(
        &mut self,
        name: &str,
        requests: u64,
        elapsed: i64,
    ) -> Result<Option<Action>, tonic::Status> {
        self.tx
            .send(reports(
                "quota",
                bucket(&[("name", name)]),
                requests,
                elapsed,
            ))
            .await
            .unwrap();
        self.next().await
    }

    async fn next(&mut self) -> Result<Option<Action>, tonic::Status> {
        let answer = tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("an answer within 10 s")?;
        Ok(answer
            .and_then(|mut r| r.bucket_action.pop())
            .and_then(|a| a.bucket_action))
    }
}

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

fn reports(domain: &str, id: BucketId, requests: u64, elapsed: i64) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(id),
            time_elapsed: Some(prost_types::Duration {
                seconds: elapsed,
                nanos: 0,
            }),
            num_requests_allowed: requests / 2,
            num_requests_denied: requests - requests / 2,
            last_report: None,
        }],
    }
}

/// The tokens per window of a token-bucket assignment (and its TTL and interval).
fn tokens(action: &Option<Action>) -> u64 {
    let Some(Action::QuotaAssignmentAction(a)) = action else {
        panic!("expected an assignment, got {action:?}");
    };
    assert_eq!(a.assignment_time_to_live.unwrap().seconds, 30);
    match a
        .rate_limit_strategy
        .as_ref()
        .and_then(|s| s.strategy.clone())
    {
        Some(Strategy::TokenBucket(b)) => {
            assert_eq!(
                b.fill_interval.unwrap().seconds,
                60,
                "the rule's window, whole seconds"
            );
            u64::from(b.tokens_per_fill.unwrap())
        }
        other => panic!("expected a token bucket, got {other:?}"),
    }
}

/// Three streams: each new one gets a fair provisional share; once they report
/// demand 10:1:1, the shares follow it and sum to the limit; when the busy one goes
/// quiet, its share goes to the others at their next report.
async fn shares_follow_demand(addrs: [SocketAddr; 3]) {
    let mut envoys = Vec::new();
    for addr in addrs {
        envoys.push(Envoy::open(addr).await.unwrap());
    }
    let first = tokens(&envoys[0].report("api", 1, 0).await.unwrap());
    assert_eq!(first, 600, "alone, the whole limit");
    tokens(&envoys[1].report("api", 1, 0).await.unwrap());
    assert_eq!(
        tokens(&envoys[2].report("api", 1, 0).await.unwrap()),
        200,
        "a fair provisional share"
    );
    // Demand is measured over at least a second between reports (tollgate's clock;
    // counts of a report sooner than that carry over to the next).
    let mut shares = [0u64; 3];
    for _round in 0..2 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        for (i, demand) in [1000, 100, 100].into_iter().enumerate() {
            shares[i] = tokens(&envoys[i].report("api", demand, 1).await.unwrap());
        }
    }
    let sum: u64 = shares.iter().sum();
    assert!(
        (590..=610).contains(&sum),
        "shares {shares:?} sum to the limit"
    );
    assert!(shares[0] >= 450, "the busy stream gets most: {shares:?}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    tokens(&envoys[0].report("api", 0, 1).await.unwrap());
    let quiet = [
        tokens(&envoys[1].report("api", 100, 1).await.unwrap()),
        tokens(&envoys[2].report("api", 100, 1).await.unwrap()),
    ];
    assert!(
        quiet.iter().all(|&t| t >= 250),
        "the quiet stream's share moved: {quiet:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_follow_demand_on_one_replica() {
    let (addr, _stop) = start(Arc::new(MemoryLedger::new(100)), RlqsOptions::default(), "").await;
    shares_follow_demand([addr, addr, addr]).await;
}

async fn two_replicas(target: tollgate::store::redis::connect::RedisTarget, test: &str) {
    let redis = options(target, test);
    let ledger = || -> Arc<dyn Ledger> { Arc::new(RedisLedger::new(redis.clone()).unwrap()) };
    let (a, _stop_a) = start(ledger(), RlqsOptions::default(), &redis.key_prefix).await;
    let (b, _stop_b) = start(ledger(), RlqsOptions::default(), &redis.key_prefix).await;
    shares_follow_demand([a, b, a]).await;
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
    let (addr, _stop) = start(Arc::new(MemoryLedger::new(100)), RlqsOptions::default(), "").await;
    let mut envoy = Envoy::open(addr).await.unwrap();
    for name in ["free", "nothing-matches"] {
        match envoy.report(name, 3, 0).await.unwrap() {
            Some(Action::QuotaAssignmentAction(a)) => {
                let strategy = a.rate_limit_strategy.and_then(|s| s.strategy);
                assert_eq!(
                    strategy,
                    Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32)),
                    "{name}"
                );
                assert!(
                    a.assignment_time_to_live.unwrap().seconds > 0,
                    "a TTL, or Envoy expires it at once"
                );
            }
            other => panic!("{name}: {other:?}"),
        }
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
    let (addr, _stop) = start(Arc::new(MemoryLedger::new(100)), options, "").await;
    let mut good = Envoy::open(addr).await.unwrap();
    tokens(&good.report("api", 1, 0).await.unwrap());
    let cases: [(RateLimitQuotaUsageReports, &str); 4] = [
        (reports("quota", bucket(&[]), 1, 0), "no entries"),
        (reports("quota", bucket(&[("name", "")]), 1, 0), "empty"),
        (
            reports("quota", bucket(&[("name", &"x".repeat(100))]), 1, 0),
            "--rlqs-max-bucket-id-bytes",
        ),
        (reports("", bucket(&[("name", "api")]), 1, 0), "no domain"),
    ];
    for (message, says) in cases {
        let mut bad = Envoy::open(addr).await.unwrap();
        bad.tx.send(message).await.unwrap();
        let status = bad.next().await.expect_err("the stream ends");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(says), "{status:?}");
    }
    let mut changer = Envoy::open(addr).await.unwrap();
    tokens(&changer.report("api", 1, 0).await.unwrap());
    changer
        .tx
        .send(reports("other", bucket(&[("name", "api")]), 1, 0))
        .await
        .unwrap();
    assert_eq!(
        changer.next().await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    assert!(
        tokens(&good.report("api", 1, 0).await.unwrap()) > 0,
        "the good stream still answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_buckets_are_bounded() {
    let options = RlqsOptions {
        max_streams: 1,
        max_buckets_per_stream: 1,
        ..RlqsOptions::default()
    };
    let (addr, _stop) = start(Arc::new(MemoryLedger::new(100)), options, "").await;
    let mut one = Envoy::open(addr).await.unwrap();
    tokens(&one.report("api", 1, 0).await.unwrap());
    let refused = Envoy::open(addr)
        .await
        .err()
        .expect("a second stream is refused");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("--rlqs-max-streams"),
        "{refused:?}"
    );
    one.tx
        .send(reports("quota", bucket(&[("name", "free")]), 1, 0))
        .await
        .unwrap();
    let status = one.next().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(
        status.message().contains("--rlqs-max-buckets-per-stream"),
        "{status:?}"
    );
}

/// GET `path` on `addr` (the admin port), the body.
async fn get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text
}

/// `/rlqs` shows the live stream, its bucket and share; `/metrics` the stream, the
/// bucket, the assigned rate and what Envoy reported, labelled by domain and rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_and_metrics_show_buckets_and_shares() {
    let (addr, http, _stop) =
        start_http(Arc::new(MemoryLedger::new(100)), RlqsOptions::default(), "").await;
    let mut envoy = Envoy::open(addr).await.unwrap();
    assert_eq!(tokens(&envoy.report("api", 4, 0).await.unwrap()), 600);
    envoy.report("free", 2, 0).await.unwrap();
    let page = get(http, "/rlqs").await;
    let body = &page[page.find("\r\n\r\n").expect("a body") + 4..];
    let view: serde_json::Value = serde_json::from_str(body).expect("JSON");
    let buckets = &view["streams"][0]["buckets"];
    let api = buckets
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["bucket"]["name"] == "api")
        .expect("the api bucket");
    assert_eq!(api["share_tokens"], 600, "{view}");
    assert_eq!(api["rule"], "name_api", "{view}");
    let metrics = get(http, "/metrics").await;
    for line in [
        "tollgate_rlqs_streams 1",
        "tollgate_rlqs_buckets{domain=\"quota\",rule=\"name_api\"} 1",
        "tollgate_rlqs_assigned_rate{domain=\"quota\",rule=\"name_api\"} 10.0",
        "tollgate_rlqs_reported_requests_total{domain=\"quota\",rule=\"name_api\",outcome=\"allowed\"} 2",
        "tollgate_rlqs_allowed_in_full_total{domain=\"quota\",rule=\"name_free\",reason=\"unlimited\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
}
