//! criterion benchmarks of the hot path, innermost first: matching a descriptor
//! against the compiled tree, encoding a counter's Redis key (and its batch-script
//! command), a memory-store decision, and a whole in-process call
//! (`Limiter::should_rate_limit` on a `MemoryStore`) for 1, 3 and 10 descriptors.
//!
//! `cargo bench --bench hot_path` measures; `cargo test --all-targets` runs each once.
//! The config is `benches/config/bench.yaml`, the one `scripts/bench` serves.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

use tollgate::config::Config;
use tollgate::config::matcher;
use tollgate::limiter::{Limiter, LimiterOptions, plan};
use tollgate::proto::rate_limit_descriptor::Entry;
use tollgate::proto::{RateLimitDescriptor, RateLimitRequest};
use tollgate::store::memory::MemoryStore;
use tollgate::store::redis::{keys, scripts};
use tollgate::store::{CounterKey, CounterOp};

const CONFIG: &str = include_str!("config/bench.yaml");

fn config() -> Config {
    tollgate::config::load_sources(&[(Path::new("bench.yaml"), CONFIG)])
        .unwrap_or_else(|errors| panic!("benches/config/bench.yaml does not load: {errors}"))
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

/// `n` descriptors `key=v<i>` (what `tollgate bench -d n` sends).
fn request(n: usize, salt: usize) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: (0..n)
            .map(|i| descriptor(&[("key", &format!("v{}", salt * 16 + i))]))
            .collect(),
        hits_addend: 0,
    }
}

fn matching(c: &mut Criterion) {
    let config = config();
    let domain = config.domain("bench").expect("domain bench");
    let cases: [(&str, &[(&str, &str)]); 5] = [
        ("key_only", &[("key", "v12345")]),
        ("exact", &[("remote_address", "10.0.0.1")]),
        ("wildcard", &[("path", "/api/users/v2")]),
        ("nested", &[("tenant_id", "acme"), ("api_key", "k-42")]),
        ("no_match", &[("unknown", "x")]),
    ];
    let mut group = c.benchmark_group("matching");
    for (name, entries) in cases {
        group.bench_function(name, |b| {
            b.iter(|| matcher::find(domain, black_box(entries).iter().copied()))
        });
    }
    group.finish();
}

fn counter_ops(config: &Config, request: &RateLimitRequest) -> Vec<CounterOp> {
    let domain = config.domain(&request.domain).expect("domain bench");
    request
        .descriptors
        .iter()
        .enumerate()
        .flat_map(
            |(i, d)| match plan::resolve(domain, i, d).expect("resolves") {
                plan::Plan::Limited {
                    limits,
                    rule,
                    shared,
                    ..
                } => limits
                    .as_slice()
                    .iter()
                    .map(|limit| CounterOp {
                        key: plan::counter_key(&domain.name, rule, d, shared, limit),
                        params: limit.params(),
                        cost: 1,
                        vetoes: true,
                        mode: tollgate::algorithm::Mode::Limit,
                        lease: None,
                    })
                    .collect::<Vec<_>>(),
                _ => Vec::new(),
            },
        )
        .collect()
}

fn key_encoding(c: &mut Criterion) {
    let config = config();
    let ops = counter_ops(&config, &request(1, 7));
    let key: &CounterKey = &ops[0].key;
    let nested = counter_ops(
        &config,
        &RateLimitRequest {
            domain: "bench".into(),
            descriptors: vec![descriptor(&[("tenant_id", "acme"), ("api_key", "k-42")])],
            hits_addend: 0,
        },
    );
    let mut group = c.benchmark_group("keys");
    group.bench_function("encode_one_entry", |b| {
        b.iter(|| keys::encode(black_box("rl:"), black_box(key)))
    });
    group.bench_function("encode_nested", |b| {
        b.iter(|| keys::encode(black_box("rl:"), black_box(&nested[0].key)))
    });
    group.bench_function("counter_key", |b| {
        let domain = config.domain("bench").expect("domain bench");
        let d = descriptor(&[("key", "v12345")]);
        let found = plan::resolve(domain, 0, &d).expect("resolves");
        let plan::Plan::Limited {
            limits,
            rule,
            shared,
            ..
        } = found
        else {
            panic!("key=v12345 is limited");
        };
        let limit = &limits.as_slice()[0];
        b.iter(|| plan::counter_key(&domain.name, rule, black_box(&d), shared, limit))
    });
    for n in [1usize, 10] {
        let ops = counter_ops(&config, &request(n, 3));
        let encoded: Vec<String> = ops.iter().map(|op| keys::encode("", &op.key)).collect();
        let wire: Vec<scripts::WireOp> = ops.iter().map(scripts::WireOp::new).collect();
        // The command the store sends: one request as one segment of an EVALSHA.
        group.bench_with_input(BenchmarkId::new("batch_cmd", n), &n, |b, _| {
            b.iter(|| {
                let segment = scripts::Segment {
                    keys: black_box(&encoded),
                    ops: &wire,
                    dry_run: false,
                };
                scripts::batch_cmd(&[segment], None)
            })
        });
    }
    group.finish();
}

fn memory_store(c: &mut Criterion) {
    let config = config();
    let store = MemoryStore::new();
    let mut group = c.benchmark_group("memory_store");
    for n in [1usize, 3, 10] {
        // A pool of distinct requests, cycled, so the map holds more than one counter.
        let pool: Vec<Vec<CounterOp>> = (0..256)
            .map(|salt| counter_ops(&config, &request(n, salt)))
            .collect();
        let mut next = 0;
        group.bench_with_input(BenchmarkId::new("decide", n), &n, |b, _| {
            b.iter(|| {
                next = (next + 1) % pool.len();
                store.decide_now(black_box(&pool[next]))
            })
        });
    }
    group.finish();
}

fn service_call(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let limiter = Limiter::new(
        config(),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    );
    let mut group = c.benchmark_group("should_rate_limit");
    for n in [1usize, 3, 10] {
        let pool: Vec<RateLimitRequest> = (0..256).map(|salt| request(n, salt)).collect();
        let mut next = 0;
        group.bench_with_input(BenchmarkId::new("memory", n), &n, |b, _| {
            b.iter(|| {
                next = (next + 1) % pool.len();
                runtime
                    .block_on(limiter.should_rate_limit(black_box(&pool[next])))
                    .expect("decides")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, matching, key_encoding, memory_store, service_call);
criterion_main!(benches);
