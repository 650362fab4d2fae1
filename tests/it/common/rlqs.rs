//! An RLQS client as Envoy's `rate_limit_quota` filter talks (one stream per Envoy and
//! domain, reports of allowed and denied counts, actions back), for the RLQS suites
//! (`tests/it/rlqs*.rs`) and the RLQS measurement (`tests/e2e/rlqs_measure.rs`), and
//! an in-process server whose quota service the test builds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use tollgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use tollgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use tollgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use tollgate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tollgate::rlqs::{CLIENT_ID_HEADER, Rlqs};
use tollgate::server::{self, Listeners, ServeOptions};
use tollgate::store::memory::MemoryStore;

use super::server::config;

/// Domain `quota`: `name=api` at 600 per minute, `name=free` unlimited.
pub const YAML: &str = "domain: quota\ndescriptors:\n  - key: name\n    value: api\n    rate_limit: {unit: minute, requests_per_unit: 600}\n  - key: name\n    value: small\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: name\n    value: free\n    rate_limit: {unlimited: true}\n";

/// An in-process server; dropping it stops the server.
pub struct RlqsServer {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    _stop: oneshot::Sender<()>,
}

/// A server on port 0 serving [`YAML`], its quota service made by `make`.
pub async fn start(make: impl FnOnce(Arc<Limiter>) -> Rlqs) -> RlqsServer {
    let limiter = Arc::new(Limiter::new(
        config(YAML),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    ));
    let rlqs = Arc::new(make(limiter.clone()));
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let listeners = Listeners::bind(any, any).await.unwrap();
    let (grpc, http) = (listeners.grpc_addr(), listeners.http_addr());
    let (tx, rx) = oneshot::channel::<()>();
    let serve = ServeOptions {
        rlqs: Some(rlqs),
        ..ServeOptions::default()
    };
    tokio::spawn(server::run_with(listeners, limiter, serve, async move {
        let _ = rx.await;
    }));
    RlqsServer {
        grpc,
        http,
        _stop: tx,
    }
}

/// One HTTP/2 connection to `addr`, for many streams.
pub async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

/// What a bucket was assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// A token bucket of this many tokens per window.
    Tokens(u64),
    Denied,
    AllowAll,
    Abandoned,
}

impl Share {
    /// Tokens per window it allows (ALLOW_ALL: unbounded, as `u64::MAX`).
    pub fn tokens(self) -> u64 {
        match self {
            Share::Tokens(t) => t,
            Share::Denied | Share::Abandoned => 0,
            Share::AllowAll => u64::MAX,
        }
    }
}

/// An action's share, checking what every assignment must carry (a TTL).
pub fn share_of(action: &Action) -> Share {
    let a = match action {
        Action::QuotaAssignmentAction(a) => a,
        Action::AbandonAction(_) => return Share::Abandoned,
    };
    assert!(
        a.assignment_time_to_live.is_some_and(|t| t.seconds > 0),
        "an assignment without a TTL expires at once: {a:?}"
    );
    match a
        .rate_limit_strategy
        .as_ref()
        .and_then(|s| s.strategy.clone())
    {
        Some(Strategy::TokenBucket(b)) => {
            assert!(
                b.fill_interval
                    .is_some_and(|i| i.seconds >= 1 && i.nanos == 0)
            );
            Share::Tokens(u64::from(b.tokens_per_fill.expect("tokens per fill")))
        }
        Some(Strategy::BlanketRule(r)) if r == BlanketRule::DenyAll as i32 => Share::Denied,
        Some(Strategy::BlanketRule(r)) if r == BlanketRule::AllowAll as i32 => Share::AllowAll,
        other => panic!("unexpected strategy {other:?}"),
    }
}

/// One Envoy's stream: send reports, read actions.
pub struct Envoy {
    pub tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    pub rx: Streaming<RateLimitQuotaResponse>,
}

impl Envoy {
    /// A stream on its own connection.
    pub async fn open(addr: SocketAddr) -> Result<Self, tonic::Status> {
        Self::on(channel(addr).await, None).await
    }

    /// A stream on `channel`, presenting `client_id` if given.
    pub async fn on(channel: Channel, client_id: Option<&str>) -> Result<Self, tonic::Status> {
        let mut client = RateLimitQuotaServiceClient::new(channel);
        let (tx, reports) = mpsc::channel(8);
        let mut request = tonic::Request::new(ReceiverStream::new(reports));
        if let Some(id) = client_id {
            request
                .metadata_mut()
                .insert(CLIENT_ID_HEADER, id.parse().unwrap());
        }
        let rx = client.stream_rate_limit_quotas(request).await?.into_inner();
        Ok(Self { tx, rx })
    }

    /// Reports `name`'s bucket with `requests` (half allowed, half denied) over
    /// `elapsed` seconds; the share it is answered, if any.
    pub async fn report(
        &mut self,
        name: &str,
        requests: u64,
        elapsed: i64,
    ) -> Result<Option<Share>, tonic::Status> {
        let allowed = requests / 2;
        self.send(name, allowed, requests - allowed, elapsed).await;
        self.next().await
    }

    /// Sends one report without waiting for its answer.
    pub async fn send(&mut self, name: &str, allowed: u64, denied: u64, elapsed: i64) {
        self.tx
            .send(reports(
                "quota",
                bucket(&[("name", name)]),
                allowed,
                denied,
                elapsed,
            ))
            .await
            .expect("the stream takes reports");
    }

    /// The next answer's share (its first action's), or the stream's end.
    pub async fn next(&mut self) -> Result<Option<Share>, tonic::Status> {
        let answer = tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("an answer within 10 s")?;
        Ok(answer
            .and_then(|mut r| r.bucket_action.pop())
            .and_then(|a| a.bucket_action)
            .map(|a| share_of(&a)))
    }
}

pub fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

pub fn reports(
    domain: &str,
    id: BucketId,
    allowed: u64,
    denied: u64,
    elapsed: i64,
) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(id),
            time_elapsed: Some(prost_types::Duration {
                seconds: elapsed,
                nanos: 0,
            }),
            num_requests_allowed: allowed,
            num_requests_denied: denied,
            last_report: None,
        }],
    }
}

/// GET `path` on `addr` (the admin port): the status code and the body.
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    (status, body.to_owned())
}
