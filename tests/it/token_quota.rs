//! envoyproxy/ratelimit's token-quota integration scripts, ported black-box over gRPC
//! (its `integration-test/scripts/token-quota.sh` and `multiservice-tokenquota.sh`,
//! with the `quota_mode` descriptors of its `examples/ratelimit/config/example.yaml`
//! and the Envoy routes of its `examples/envoy/proxy.yaml`): each HTTP request is a
//! check on the request path (descriptor hits_addend 0; OVER_LIMIT is a 429) and, when
//! it was served, a debit of 1 on the descriptor of the service that served it when
//! the stream ends (`apply_on_stream_done`, its answer not enforced). Upstream's
//! expected answers, on memory, standalone Redis and the cluster. The scripts' last
//! step (wait a minute, the quota is back) is the fixed window's reset, not repeated.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::server::{TestServer, config, descriptor, request};
use tollgate::limiter::LimiterOptions;
use tollgate::proto::RateLimitDescriptor;
use tollgate::proto::rate_limit_response::Code;
use tollgate::store::Store;
use tollgate::store::memory::MemoryStore;

/// upstream's example.yaml, the quota part.
const EXAMPLE: &str = "domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
    metadata:
      service_with_quota:
        name: \"service_1\"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
    metadata:
      service_with_quota:
        name: \"service_2\"
";

fn service(name: &str, hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(hits),
        ..descriptor(&[("service", name)])
    }
}

/// Waits until at least 3 s remain in the current minute: the scripts run within one
/// minute window (a fixed window, as upstream's), and a boundary mid-run would reset it.
async fn clear_of_a_minute_boundary() {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch");
    let into = now.as_millis() % 60_000;
    if into > 57_000 {
        tokio::time::sleep(Duration::from_millis(60_000 - into as u64 + 50)).await;
    }
}

async fn serve(store: Arc<dyn Store>) -> TestServer {
    let options = LimiterOptions {
        response_dynamic_metadata: true,
        ..Default::default()
    };
    TestServer::start(config(EXAMPLE), store, options).await
}

/// One HTTP request through upstream's Envoy routes: `check` on the request path;
/// served (by the service the answer's metadata names, or `fixed`) unless OVER_LIMIT;
/// then the debit of 1 on the serving service when the stream ends. The status and
/// who served it.
async fn http(server: &TestServer, check: &[&str], fixed: Option<&str>) -> (u16, String) {
    let mut client = server.client().await;
    let descriptors = check.iter().map(|name| service(name, 0)).collect();
    let answer = client
        .should_rate_limit(request("rl", descriptors))
        .await
        .expect("check answered")
        .into_inner();
    if answer.overall_code == Code::OverLimit as i32 {
        return (429, String::new());
    }
    let served = match fixed {
        Some(name) => name.to_owned(),
        // proxy.yaml routes by %DYNAMIC_METADATA(...:metadata:service_with_quota:name)%.
        None => metadata_name(&answer).expect("the answer names a service with quota"),
    };
    client
        .should_rate_limit(request("rl", vec![service(&served, 1)]))
        .await
        .expect("debit answered");
    (200, served)
}

fn metadata_name(answer: &tollgate::proto::RateLimitResponse) -> Option<String> {
    use prost_types::value::Kind;
    let field = |s: &prost_types::Struct, name: &str| match &s.fields.get(name)?.kind {
        Some(Kind::StructValue(inner)) => Some(inner.clone()),
        _ => None,
    };
    let metadata = field(answer.dynamic_metadata.as_ref()?, "metadata")?;
    let quota = field(&metadata, "service_with_quota")?;
    match &quota.fields.get("name")?.kind {
        Some(Kind::StringValue(name)) => Some(name.clone()),
        _ => None,
    }
}

/// token-quota.sh: service_2 has 2 per minute, debited on the response path, so
/// three requests pass and the fourth is refused.
async fn token_quota(store: Arc<dyn Store>) {
    let server = serve(store).await;
    clear_of_a_minute_boundary().await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(http(&server, &["service_2"], Some("service_2")).await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    server.stop().await;
}

/// multiservice-tokenquota.sh: service_1 (1 per minute) serves twice, then service_2
/// (2 per minute) three times, then both are out of quota.
async fn multiservice_token_quota(store: Arc<dyn Store>) {
    let server = serve(store).await;
    clear_of_a_minute_boundary().await;
    let mut served = Vec::new();
    for _ in 0..6 {
        let (status, by) = http(&server, &["service_1", "service_2"], None).await;
        served.push(if status == 200 {
            by
        } else {
            status.to_string()
        });
    }
    assert_eq!(
        served,
        [
            "service_1",
            "service_1",
            "service_2",
            "service_2",
            "service_2",
            "429"
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn token_quota_on_memory() {
    token_quota(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn token_quota_on_redis() {
    token_quota(Arc::new(common::stores::standalone("token_quota").await)).await;
}

#[tokio::test]
async fn token_quota_on_the_cluster() {
    token_quota(Arc::new(common::stores::cluster("token_quota").await)).await;
}

#[tokio::test]
async fn multiservice_token_quota_on_memory() {
    multiservice_token_quota(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn multiservice_token_quota_on_redis() {
    let store = common::stores::standalone("multiservice_token_quota").await;
    multiservice_token_quota(Arc::new(store)).await;
}

#[tokio::test]
async fn multiservice_token_quota_on_the_cluster() {
    let store = common::stores::cluster("multiservice_token_quota").await;
    multiservice_token_quota(Arc::new(store)).await;
}
