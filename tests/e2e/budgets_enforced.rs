//! Budgets enforced end to end: a real Envoy on `deploy/budgets/envoy.yaml` in front
//! of `tollgate serve` on `deploy/budgets/limits/` (the harness's Redis Cluster),
//! and the upstream that reports each answer's cost in `x-tokens`.
//!
//! - A tenant's token budget holds across requests whose cost is known only after the
//!   response: the check at request time (descriptor hits_addend 0) admits while the
//!   tenant is below its budget, the charge at stream done (overdraft) always counts,
//!   so a tenant with one request at a time overdraws by less than one response and
//!   is refused after it; another tenant is untouched. (Many requests at once overdraw
//!   by less than one charge each: `tests/it/budget_overdraw.rs`.)
//! - Concurrency: C slow requests admitted out of N at once, the next admitted as soon
//!   as one finishes; Envoy killed with -9 mid-request gives its slots back when the
//!   lease ends (`algorithm: concurrency`, its lease 15 s, named by the request's
//!   x-request-id: `lease_key`), also while the tenant keeps retrying.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::budgets::{self, call};
use crate::stack::http;

/// The budget in deploy/budgets/limits/tokens.yaml.
const BUDGET: u64 = 100_000;

#[test]
fn a_token_budget_holds_when_the_cost_is_known_only_after_the_response() {
    let stack = budgets::stack("budgets_tokens");
    let listener = stack.listener;
    let logs = || {
        format!(
            "{}\n{}",
            stack.envoy_log_tail(30),
            stack.tollgate.server.log()
        )
    };

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
    // What tollgate counted, read from Redis: the three charges and nothing of the
    // refused requests (a 429 has no x-tokens, so Envoy charges nothing), which is
    // less than one response past the budget. The refused requests' stream-done
    // calls come after their answers: a moment to let them land before reading.
    let charged_more = budgets::eventually(Duration::from_secs(2), || stack.spent("acme") != spent);
    let counted = stack.spent("acme");
    assert!(
        !charged_more && counted == spent,
        "tollgate counted {counted}; the three charges sent were {spent}\n{}",
        logs()
    );
    assert!(
        counted - cost < BUDGET,
        "less than one response past the budget: {counted}"
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
fn c_concurrent_slow_requests_are_admitted_and_the_next_when_one_finishes() {
    let started = Instant::now();
    let stack = budgets::stack("budgets_concurrency");
    let (listener, tollgate) = (stack.listener, &stack.tollgate);
    // 3 in flight per tenant (limits/concurrency.yaml); 8 requests of 3 s at once.
    let responses = slow(listener, 8, 3_000);
    let ok = responses.iter().filter(|r| r.status == 200).count();
    assert_eq!(
        ok,
        3,
        "{:?}",
        responses.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    // All finished (their releases are sent after the answers: wait for them): the
    // slots are free again, and the 429s' releases did not free any early.
    let free = budgets::eventually(Duration::from_secs(10), || tollgate.free_slots("acme") == 3);
    assert!(free, "the releases of the first three arrived");
    // Four at once, slow enough to be in flight together: three slots, three
    // admitted (the fourth would be refused until one of them finishes).
    let responses = slow(listener, 4, 3_000);
    let ok = responses.iter().filter(|r| r.status == 200).count();
    assert_eq!(ok, 3, "{ok} of 4 at once after the first finished");
    // Every release names its request (x-request-id), so one of these four arriving
    // late frees its own lease, never one of the held requests' below; waited for
    // all the same, so the slots are known free before they are taken.
    let free = budgets::eventually(Duration::from_secs(10), || tollgate.free_slots("acme") == 3);
    assert!(free, "the releases of the four arrived");
    // Three slow requests in flight hold every slot: a fourth is refused until one
    // of them finishes, and admitted then. They hold for 8 s (the route's timeout is
    // 10 s), so a slow machine has seconds between seeing them held and the fourth.
    let held = std::thread::spawn(move || slow(listener, 3, 8_000));
    let full = budgets::eventually(Duration::from_secs(5), || tollgate.slots_full("acme"));
    assert!(full, "three slow requests in flight hold the three slots");
    let refused = http::send(listener, call("/v1/jobs", "acme", 0, 0));
    assert_eq!(refused.status, 429, "three held slots refuse a fourth");
    let freed = budgets::eventually(Duration::from_secs(15), || {
        http::send(listener, call("/v1/jobs", "acme", 0, 0)).status == 200
    });
    assert!(freed, "a slot comes back when its request finishes");
    assert!(held.join().expect("held").iter().all(|r| r.status == 200));
    assert!(started.elapsed() < Duration::from_secs(90));
}

/// The lease in limits/concurrency.yaml.
const LEASE: Duration = Duration::from_secs(15);

/// What a slot's return may take past its lease's end here: the 50 ms poll, a call
/// through Envoy, and a loaded 2-core machine's scheduling.
const SLACK: Duration = Duration::from_secs(3);

/// Envoy killed with -9 while three slow requests hold the tenant's three slots; a
/// new Envoy in front of the same tollgate, waiting with `wait` (true: a slot is
/// free). The leases were taken between the requests' sending and the slots being
/// seen full, so they end in that span moved by the lease: the slot must come back
/// no sooner than the first, and within [`SLACK`] of the last.
fn slots_back_after_a_kill(name: &str, wait: impl Fn(&budgets::Tollgate, SocketAddr) -> bool) {
    let mut stack = budgets::stack(name);
    let listener = stack.listener;
    // Three requests that would hold their slots for a minute; then Envoy dies (-9):
    // no stream ends, no release is ever sent.
    let sent_at = Instant::now();
    let held = std::thread::spawn(move || {
        let requests = (0..3)
            .map(|_| call("/v1/jobs", "acme", 0, 60_000))
            .collect();
        std::panic::catch_unwind(|| http::send_all(listener, requests)).ok()
    });
    let acquired = budgets::eventually(Duration::from_secs(10), || {
        stack.tollgate.slots_full("acme")
    });
    assert!(acquired, "three slow requests hold the three slots");
    let full_at = Instant::now();
    stack.kill_envoy();
    drop(held);
    let (_envoy, listener) = stack.another_envoy("envoy2");
    let tollgate = &stack.tollgate;
    let refused = http::send(listener, call("/v1/jobs", "acme", 0, 0));
    assert_eq!(refused.status, 429, "the dead Envoy's slots are still held");
    let back = budgets::eventually(LEASE + SLACK + Duration::from_secs(10), || {
        wait(tollgate, listener)
    });
    let back_at = Instant::now();
    assert!(back, "the slots never came back");
    assert!(
        back_at >= sent_at + LEASE,
        "back {:?} after the requests were sent: before the lease",
        back_at - sent_at
    );
    assert!(
        back_at <= full_at + LEASE + SLACK,
        "back {:?} after the slots were seen held: more than the lease and {SLACK:?}",
        back_at - full_at
    );
    let admitted = http::send(listener, call("/v1/jobs", "acme", 0, 0));
    assert_eq!(admitted.status, 200, "admitted once the leases ended");
}

#[test]
fn an_envoy_killed_mid_request_gives_its_slots_back_within_the_lease() {
    // Waiting with checks (descriptor hits_addend 0), which take no slot.
    slots_back_after_a_kill("budgets_kill", |tollgate, _| !tollgate.slots_full("acme"));
}

/// Retrying as a client would: each retry acquires, is refused and releases when its
/// stream ends. Each names its own request (x-request-id), so its release frees its
/// own marker and never touches the dead Envoy's leases, which end on time. (Without
/// the id, a release could not tell whose lease it ends: docs/budgets.md, "Anonymous
/// leases", says what that costs.)
#[test]
fn a_tenant_retrying_through_envoy_gets_its_slots_back_within_the_lease() {
    // Waiting as a client would: retrying through Envoy (each retry acquires, is
    // refused, and releases when its stream ends).
    slots_back_after_a_kill("budgets_kill_retry", |_, listener| {
        http::send(listener, call("/v1/jobs", "acme", 0, 0)).status == 200
    });
}
