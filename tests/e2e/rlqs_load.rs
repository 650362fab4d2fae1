//! The RLQS load measurements (docs/rlqs.md, "Measured"), not run by CI: the
//! `rlqs_measure` test runs them as scenarios `scale` and `memory`
//! (`scripts/rlqs-measure scale memory ledger`), against one `tollgate serve` of the
//! test's own build on a Redis standalone server of its own. Figures are printed, not asserted (beyond what makes
//! them meaningful: every report answered).
//!
//! - `scale`: ShouldRateLimit latency on that Redis alone (400 requests a second from
//!   4 clients, 20 s), then with 2,000 RLQS streams on one bucket of 600 a minute
//!   (20 connections, all opening and reporting at once, then each every 5 s as Envoy
//!   does, at phases spread over the period as Envoys started apart are):
//!   when every stream had an assignment, the most the latest shares ever summed to,
//!   the ledger's calls and Redis CPU, the same latency again.
//! - `memory`: 150 streams each reporting the same 1,000 buckets (one per `user`):
//!   tollgate's RSS before and after, the RLQS state it charged, and `GET /rlqs`'s
//!   size and time.
//! - `ledger`: Redis's time per ledger call on a bucket of 20, 2,000 and 20,000 claims
//!   (`INFO commandstats`), 20,000 claims each, through the production ledger: the
//!   cost must not grow with the claims.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::proto::RateLimitServiceClient;
use tollgate::proto::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use tollgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;

use tollgate::rlqs::Ledger;
use tollgate::rlqs::claims::{Report, Timing};
use tollgate::rlqs::ledger::ClaimRequest;
use tollgate::rlqs::ledger::redis::RedisLedger;
use tollgate::store::breaker::BreakerOptions;
use tollgate::store::redis::connect::RedisTarget;

use crate::common::process::{Server, tollgate};
use crate::common::redis::custom::private_standalone;
use crate::common::redis::{info_field, redis_cli};
use crate::common::rlqs::{Envoy, bucket, channel, share_of};
use crate::common::server::{descriptor, request};
use crate::stack::{http, start};

const QUOTA: &str = "domain: quota\ndescriptors:\n  - key: name\n    value: api\n    rate_limit: {unit: minute, requests_per_unit: 600}\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
const RLS: &str = "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n";

/// `tollgate serve` on a Redis of its own (its ledger there too); its gRPC and HTTP
/// ports and the Redis port.
struct Rig {
    server: Server,
    _dir: tempfile::TempDir,
    grpc: u16,
    http: u16,
    redis: u16,
    _redis: crate::common::redis::RedisStandalone,
}

impl Rig {
    /// With `memory`, tollgate keeps its counters and its ledger in memory (the Redis
    /// is started all the same, and unused).
    fn start(memory: bool) -> Rig {
        let redis = private_standalone("rlqs-load").expect("a Redis of its own");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("quota.yaml"), QUOTA).unwrap();
        std::fs::write(dir.path().join("rl.yaml"), RLS).unwrap();
        let ports = start::free_ports(2);
        let mut command = tollgate();
        command
            .args(["serve", "--no-watch", "--drain-seconds", "0", "--config"])
            .arg(dir.path())
            .args(["--grpc-addr", &format!("127.0.0.1:{}", ports[0])])
            .args(["--http-addr", &format!("127.0.0.1:{}", ports[1])])
            .env("LOG_LEVEL", "warn");
        if !memory {
            command.args(["--redis-url", &redis.url()]);
        }
        let mut server = Server::spawn(command);
        server.wait_until_serving(ports[0]);
        Rig {
            server,
            _dir: dir,
            grpc: ports[0],
            http: ports[1],
            redis: redis.port(),
            _redis: redis,
        }
    }

    fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.server.child.id()))
            .unwrap_or_default();
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        kib / 1024.0
    }

    fn metric(&self, name: &str) -> f64 {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.http));
        let body = http::probe(addr, "/metrics").map_or_else(|_| String::new(), |r| r.body);
        body.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, |a, b| a + b)
    }

    /// Redis's CPU seconds so far, and its script calls and microseconds.
    fn redis_cpu(&self) -> (f64, u64, u64) {
        let cpu = redis_cli(self.redis, &["INFO", "cpu"]);
        let seconds = ["used_cpu_user", "used_cpu_sys"]
            .iter()
            .filter_map(|f| info_field(&cpu, f)?.parse::<f64>().ok())
            .sum();
        let stats = redis_cli(self.redis, &["INFO", "commandstats"]);
        let (mut calls, mut usec) = (0, 0);
        for line in stats.lines().filter(|l| l.starts_with("cmdstat_evalsha:")) {
            for part in line.trim_start_matches("cmdstat_evalsha:").split(',') {
                match part.split_once('=') {
                    Some(("calls", v)) => calls = v.parse().unwrap_or(0),
                    Some(("usec", v)) => usec = v.parse().unwrap_or(0),
                    _ => {}
                }
            }
        }
        (seconds, calls, usec)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// ShouldRateLimit at 400 a second (4 clients) for `seconds`: p50 and p99 in ms.
async fn rls_latency(grpc: u16, seconds: u64) -> (f64, f64, usize) {
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut clients = Vec::new();
    for c in 0..4 {
        clients.push(tokio::spawn(async move {
            let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
                .await
                .expect("connect");
            let mut took = Vec::new();
            let mut next = Instant::now();
            let mut i = c;
            while Instant::now() < end {
                tokio::time::sleep_until(next.into()).await;
                next += Duration::from_millis(10);
                let user = format!("u{}", i % 1_000);
                i += 4;
                let call = request("rl", vec![descriptor(&[("user", &user)])]);
                let began = Instant::now();
                client.should_rate_limit(call).await.expect("answer");
                took.push(began.elapsed());
            }
            took
        }));
    }
    let mut all = Vec::new();
    for c in clients {
        all.extend(c.await.unwrap());
    }
    all.sort();
    let at = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)].as_secs_f64() * 1e3;
    (at(0.5), at(0.99), all.len())
}

pub(crate) fn scale() {
    let rig = Rig::start(false);
    let runtime = runtime();
    println!("scenario scale (2,000 streams on one bucket of 600/min, Redis ledger)");
    let (p50, p99, n) = runtime.block_on(rls_latency(rig.grpc, 20));
    println!("  ShouldRateLimit without RLQS: {n} calls, p50 {p50:.2} ms, p99 {p99:.2} ms");
    let (cpu0, calls0, usec0) = rig.redis_cpu();
    let streams = 2_000;
    let shares = Arc::new(Mutex::new(vec![0u64; streams]));
    let most = Arc::new(AtomicU64::new(0));
    let assigned_at: Arc<Mutex<Vec<Option<Duration>>>> = Arc::new(Mutex::new(vec![None; streams]));
    let opened = Instant::now();
    let tasks = runtime.block_on(async {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], rig.grpc));
        let mut tasks = Vec::new();
        let mut connection = None;
        for i in 0..streams {
            if i % 100 == 0 {
                connection = Some(channel(addr).await);
            }
            let channel = connection.clone().unwrap();
            let (shares, most, assigned_at) = (shares.clone(), most.clone(), assigned_at.clone());
            tasks.push(tokio::spawn(async move {
                let mut envoy = Envoy::on(channel, Some(&format!("envoy-{i}")))
                    .await
                    .expect("a stream");
                let mut elapsed = 0;
                loop {
                    // About one request a second each: 2,000 a second offered in all.
                    let (allowed, denied) = if elapsed == 0 { (1, 0) } else { (2, 3) };
                    envoy.send("api", allowed, denied, elapsed).await;
                    // A report may go unanswered (the ledger did not answer).
                    let answer = tokio::time::timeout(Duration::from_secs(4), envoy.rx.message());
                    if let Ok(Ok(Some(mut answer))) = answer.await
                        && let Some(action) =
                            answer.bucket_action.pop().and_then(|a| a.bucket_action)
                    {
                        let mut shares = shares.lock().unwrap();
                        shares[i] = share_of(&action).tokens();
                        most.fetch_max(shares.iter().sum(), Ordering::Relaxed);
                        assigned_at.lock().unwrap()[i].get_or_insert(opened.elapsed());
                    }
                    // Envoys started at different times report at different
                    // moments of the period: after the first report, each stream's
                    // comes at its own phase.
                    let wait = if elapsed == 0 {
                        Duration::from_millis(fastrand::u64(0..5_000))
                    } else {
                        Duration::from_secs(5)
                    };
                    elapsed = 5;
                    tokio::time::sleep(wait).await;
                }
            }));
        }
        tasks
    });
    runtime.block_on(async { tokio::time::sleep(Duration::from_secs(10)).await });
    let assigned = assigned_at.lock().unwrap().clone();
    let answered = assigned.iter().filter(|a| a.is_some()).count();
    let last = assigned.iter().flatten().max().copied().unwrap_or_default();
    println!(
        "  streams assigned within 10 s of opening: {answered} of {streams}, the last after {last:.1?}"
    );
    let calls_before = rig.metric("tollgate_rlqs_ledger_duration_seconds_count");
    let time_before = rig.metric("tollgate_rlqs_ledger_duration_seconds_sum");
    let (p50, p99, n) = runtime.block_on(rls_latency(rig.grpc, 20));
    println!(
        "  ShouldRateLimit with 2,000 RLQS streams: {n} calls, p50 {p50:.2} ms, p99 {p99:.2} ms"
    );
    let (cpu1, calls1, usec1) = rig.redis_cpu();
    let held: Vec<u64> = shares.lock().unwrap().clone();
    let holding = held.iter().filter(|&&t| t > 0).count();
    println!(
        "  shares now: {} tokens over {holding} streams; the most the latest shares ever summed to: {} (limit 600)",
        held.iter().sum::<u64>(),
        most.load(Ordering::Relaxed)
    );
    println!(
        "  Redis over the 30 s with streams: {:.2} CPU-s, {} script calls at {:.1} us each; ledger errors {}",
        cpu1 - cpu0,
        calls1 - calls0,
        (usec1 - usec0) as f64 / (calls1 - calls0).max(1) as f64,
        rig.metric("tollgate_rlqs_ledger_errors_total")
    );
    let count = rig.metric("tollgate_rlqs_ledger_duration_seconds_count") - calls_before;
    let sum = rig.metric("tollgate_rlqs_ledger_duration_seconds_sum") - time_before;
    println!(
        "  ledger calls over those 20 s, as tollgate timed them: {count:.0}, {:.2} ms each on average; tollgate RSS {:.0} MiB",
        sum * 1e3 / count.max(1.0),
        rig.rss_mib()
    );
    for task in tasks {
        task.abort();
    }
}

/// One report of `users` buckets `{user: u<j>}`.
fn many(users: usize, elapsed: i64) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "quota".into(),
        bucket_quota_usages: (0..users)
            .map(|j| BucketQuotaUsage {
                bucket_id: Some(bucket(&[("user", &format!("u{j}"))])),
                time_elapsed: Some(prost_types::Duration {
                    seconds: elapsed,
                    nanos: 0,
                }),
                num_requests_allowed: 1,
                num_requests_denied: 0,
                last_report: None,
            })
            .collect(),
    }
}

pub(crate) fn memory() {
    for ledger in ["redis", "memory"] {
        memory_on(ledger == "memory");
    }
}

fn memory_on(memory: bool) {
    let rig = Rig::start(memory);
    let runtime = runtime();
    let (streams, buckets) = (150, 1_000);
    let ledger = if memory { "memory" } else { "Redis" };
    println!("scenario memory ({streams} streams x {buckets} buckets, {ledger} ledger)");
    let before = rig.rss_mib();
    let envoys = runtime.block_on(async {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], rig.grpc));
        let mut envoys = Vec::new();
        let mut connection = None;
        for i in 0..streams {
            if i % 50 == 0 {
                connection = Some(channel(addr).await);
            }
            let mut envoy = Envoy::on(connection.clone().unwrap(), None)
                .await
                .expect("a stream");
            envoy.tx.send(many(buckets, 0)).await.unwrap();
            let answer = envoy.rx.message().await.expect("an answer");
            assert!(answer.is_some_and(|a| a.bucket_action.len() == buckets));
            envoys.push(envoy);
        }
        envoys
    });
    let after = rig.rss_mib();
    let charged = rig.metric("tollgate_rlqs_state_bytes");
    let all = (streams * buckets) as f64;
    println!(
        "  RSS {before:.0} -> {after:.0} MiB: {:.0} bytes per bucket ({all} buckets); RLQS state charged {:.0} MiB, {:.0} bytes per bucket",
        (after - before) * 1024.0 * 1024.0 / all,
        charged / 1024.0 / 1024.0,
        charged / all
    );
    for path in ["/rlqs", "/rlqs?stream=1", "/rlqs?limit=1000"] {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], rig.http));
        let began = Instant::now();
        let body = http::probe(addr, path).expect("/rlqs").body;
        println!(
            "  GET {path}: {} KiB in {:.1?}; RSS after {:.0} MiB",
            body.len() / 1024,
            began.elapsed(),
            rig.rss_mib()
        );
    }
    drop(envoys);
}

pub(crate) fn ledger() {
    println!("scenario ledger (Redis time per claim, by claims on the bucket)");
    let runtime = runtime();
    for claims in [20usize, 2_000, 20_000] {
        let redis = private_standalone("rlqs-ledger").expect("a Redis of its own");
        let mut options =
            crate::common::stores::options(RedisTarget::Standalone(redis.url()), "rlqs_ledger");
        options.timeout = Duration::from_secs(5);
        let ledger = RedisLedger::new(&options, BreakerOptions::default()).unwrap();
        // Long enough that no claim goes stale while the bucket fills.
        let timing = Timing {
            stale_ms: 600_000,
            hold_ms: 900_000,
            grace_ms: 2_000,
        };
        let key = format!("{}{{ledger}}:rlqs", options.key_prefix);
        let claim = |i: usize, weight: u64| {
            let name = format!("stream:measure-{i}");
            let ledger = &ledger;
            let key = &key;
            async move {
                let report = Report {
                    name: &name,
                    alias: &name,
                    owner: &name,
                    weight: Some(weight),
                    resumed: false,
                    tokens: 600,
                };
                let request = ClaimRequest {
                    key,
                    report,
                    timing,
                };
                ledger.claim(request).await.expect("the ledger answers");
            }
        };
        runtime.block_on(async {
            for i in 0..claims {
                claim(i, 500_000).await;
            }
        });
        redis_cli(redis.port(), &["CONFIG", "RESETSTAT"]);
        let began = Instant::now();
        runtime.block_on(async {
            for _ in 0..20_000 {
                claim(fastrand::usize(0..claims), fastrand::u64(0..=1_000_000)).await;
            }
        });
        let took = began.elapsed();
        let stats = redis_cli(redis.port(), &["INFO", "commandstats"]);
        let per_call = stats
            .lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .and_then(|l| l.split(',').find_map(|p| p.strip_prefix("usec_per_call=")))
            .unwrap_or("?")
            .to_owned();
        println!(
            "  {claims} claims on the bucket: {per_call} us of Redis per call; 20,000 calls in {took:.1?} one at a time"
        );
    }
}
