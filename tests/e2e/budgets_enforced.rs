//! Budgets enforced end to end: a real Envoy on `deploy/budgets/envoy.yaml` in front
//! of `tollgate serve` on `deploy/budgets/limits.yaml` (the harness's Redis Cluster),
//! and the upstream that reports each answer's cost in `x-tokens`.
//!
//! - A tenant's token budget holds across requests whose cost is known only after the
//!   response: the check at request time (descriptor hits_addend 0) admits while the
//!   tenant is below its budget, the charge at stream done (overdraft) always counts,
//!   so the tenant overdraws by at most one response and is refused after it; another
//!   tenant is untouched.
//! - Concurrency: C slow requests admitted out of N at once, the next admitted as soon
//!   as one finishes; Envoy killed with -9 mid-request gives its slots back within the
//!   lease. These need the concurrency rule kind (`lease`), which this branch does not
//!   have yet: they are ignored, with that reason, until it is merged.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::budgets::{self, call};
use crate::stack::http;

/// The budget in deploy/budgets/limits.yaml.
const BUDGET: u64 = 100_000;

#[test]
fn a_token_budget_holds_when_the_cost_is_known_only_after_the_response() {
    let dir = tempfile::Builder::new()
        .prefix("budgets-tokens-")
        .tempdir_in(crate::stack::guard::run_dir())
        .expect("temp dir");
    let prefix = crate::common::redis::unique_prefix("budgets_tokens");
    let tollgate = budgets::tollgate_on_limits(dir.path(), &prefix);
    let (_upstream, upstream_port) = budgets::upstream(dir.path());
    let ports = budgets::envoy_ports();
    let config = budgets::render(&ports, tollgate.grpc, upstream_port, |_| {});
    let envoy = budgets::envoy(dir.path(), "envoy", &config, ports.admin);
    let listener = SocketAddr::from(([127, 0, 0, 1], ports.listener));
    let logs = || format!("{}\n{}", envoy.log_tail(30), tollgate.server.log());

    // Each answer costs 40% of the budget; the request does not say so, the
    // response does. Admitted at 0, 40,000 and 80,000 spent; the third charge
    // overdraws (120,000); the fourth is refused at the check and charges nothing.
    let cost = BUDGET * 2 / 5;
    let mut spent = 0;
    for i in 0..3 {
        let response = http::send(listener, call("/v1/chat", "acme", cost, 0));
        assert_eq!(
            response.status,
            200,
            "request {i}: {response:?}\n{}",
            logs()
        );
        spent += cost;
        // The charge is sent when the stream is done, after the client has its
        // answer: wait until tollgate counted it before the next check.
        let counted = || remaining(listener, "acme") == BUDGET.saturating_sub(spent);
        assert!(
            budgets::eventually(Duration::from_secs(10), counted),
            "charge {i} not counted: remaining {}\n{}",
            remaining(listener, "acme"),
            logs()
        );
    }
    for _ in 0..3 {
        let response = http::send(listener, call("/v1/chat", "acme", cost, 0));
        assert_eq!(response.status, 429, "the budget is spent: {response:?}");
    }
    assert!(
        spent <= BUDGET + cost,
        "at most one response past the budget: {spent}"
    );
    // Another tenant has its own budget.
    let response = http::send(listener, call("/v1/chat", "globex", 10, 0));
    assert_eq!(response.status, 200, "{response:?}");
}

/// What the tenant's budget admits now, as a check (descriptor hits_addend 0)
/// reports it: Envoy's `x-ratelimit-remaining` of a 200, or 0 for a 429.
fn remaining(listener: SocketAddr, tenant: &str) -> u64 {
    let response = http::send(listener, call("/v1/chat", tenant, 0, 0));
    match response.status {
        200 => response.number("x-ratelimit-remaining"),
        _ => 0,
    }
}

/// Slow requests of one tenant on the concurrency route, all at once.
fn slow(listener: SocketAddr, n: usize, sleep_ms: u64) -> Vec<http::Response> {
    let requests = (0..n)
        .map(|_| call("/v1/jobs", "acme", 0, sleep_ms))
        .collect();
    http::send_all(listener, requests)
}

#[test]
#[ignore = "needs the concurrency rule kind with `lease` (the charges branch, not merged yet)"]
fn c_concurrent_slow_requests_are_admitted_and_the_next_when_one_finishes() {
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("budgets-concurrency-")
        .tempdir_in(crate::stack::guard::run_dir())
        .expect("temp dir");
    let prefix = crate::common::redis::unique_prefix("budgets_concurrency");
    let tollgate = budgets::tollgate_on_limits(dir.path(), &prefix);
    let (_upstream, upstream_port) = budgets::upstream(dir.path());
    let ports = budgets::envoy_ports();
    let config = budgets::render(&ports, tollgate.grpc, upstream_port, |_| {});
    let _envoy = budgets::envoy(dir.path(), "envoy", &config, ports.admin);
    let listener = SocketAddr::from(([127, 0, 0, 1], ports.listener));
    // 3 in flight per tenant (limits.yaml); 8 requests of 3 s at once.
    let responses = slow(listener, 8, 3_000);
    let ok = responses.iter().filter(|r| r.status == 200).count();
    assert_eq!(
        ok,
        3,
        "{:?}",
        responses.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    // All finished: the slots are free again, and the 429s did not free any early.
    let responses = slow(listener, 4, 0);
    let ok = responses.iter().filter(|r| r.status == 200).count();
    assert!(ok >= 3, "{ok} of 4 after the first finished");
    // One held slot finishing lets the next in: 3 slow, then one short one waits for
    // none of them to finish but is refused until one does.
    let held = std::thread::spawn(move || slow(listener, 3, 4_000));
    let full = budgets::eventually(Duration::from_secs(3), || {
        http::send(listener, call("/v1/jobs", "acme", 0, 0)).status == 429
    });
    assert!(full, "three held slots refuse a fourth");
    let freed = budgets::eventually(Duration::from_secs(15), || {
        http::send(listener, call("/v1/jobs", "acme", 0, 0)).status == 200
    });
    assert!(freed, "a slot comes back when its request finishes");
    assert!(held.join().expect("held").iter().all(|r| r.status == 200));
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[test]
#[ignore = "needs the concurrency rule kind with `lease` (the charges branch, not merged yet)"]
fn an_envoy_killed_mid_request_gives_its_slots_back_within_the_lease() {
    let dir = tempfile::Builder::new()
        .prefix("budgets-kill-")
        .tempdir_in(crate::stack::guard::run_dir())
        .expect("temp dir");
    let prefix = crate::common::redis::unique_prefix("budgets_kill");
    let tollgate = budgets::tollgate_on_limits(dir.path(), &prefix);
    let (_upstream, upstream_port) = budgets::upstream(dir.path());
    let ports = budgets::envoy_ports();
    let config = budgets::render(&ports, tollgate.grpc, upstream_port, |_| {});
    let envoy = budgets::envoy(dir.path(), "envoy", &config, ports.admin);
    let listener = SocketAddr::from(([127, 0, 0, 1], ports.listener));
    // Three requests that hold their slots for a minute, then Envoy dies (-9): no
    // stream ends, no release is ever sent.
    let held = std::thread::spawn(move || {
        let requests = (0..3)
            .map(|_| call("/v1/jobs", "acme", 0, 60_000))
            .collect();
        std::panic::catch_unwind(|| http::send_all(listener, requests)).ok()
    });
    let acquired = budgets::eventually(Duration::from_secs(10), || {
        http::send(listener, call("/v1/jobs", "acme", 0, 0)).status == 429
    });
    assert!(acquired, "three slow requests hold the three slots");
    let killed_at = Instant::now();
    drop(envoy); // SIGKILL (the guard's drop), as kill -9
    drop(held);
    // A new Envoy: still refused while the dead one's leases run.
    let ports = budgets::envoy_ports();
    let config = budgets::render(&ports, tollgate.grpc, upstream_port, |_| {});
    let _envoy = budgets::envoy(dir.path(), "envoy2", &config, ports.admin);
    let listener = SocketAddr::from(([127, 0, 0, 1], ports.listener));
    let back = budgets::eventually(Duration::from_secs(30), || {
        http::send(listener, call("/v1/jobs", "acme", 0, 0)).status == 200
    });
    let after = killed_at.elapsed();
    assert!(back, "the slots never came back");
    // The lease in limits.yaml is 10 s: not before it (minus the time to start the
    // new Envoy), and soon after.
    assert!(
        after >= Duration::from_secs(5),
        "back after {after:?}: before the lease"
    );
    assert!(after <= Duration::from_secs(20), "back after {after:?}");
}
