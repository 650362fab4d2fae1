//! The budget stack (docs/budgets.md): a real Envoy on `deploy/budgets/envoy.yaml`
//! (rewritten for loopback: addresses only), the upstream whose cost is known only
//! when it answers (`tests/python/budget_upstream.py`: `x-tokens` from the request's
//! `x-cost`, slow by `x-sleep-ms`), and behind Envoy either one `tollgate serve` on
//! `deploy/budgets/limits/` (the harness's Redis Cluster, a key prefix of the
//! test's own) or a [`Capture`]: an in-process rate-limit service that answers OK (or
//! OVER_LIMIT for tenant `denied`) and keeps every `ShouldRateLimit` request Envoy
//! sent, so a test reads what Envoy puts on the wire.
//!
//! Every wait is a bounded condition; dropping a part kills its process.

pub mod capture;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::envoy::render::load_yaml;
use crate::common::process::root;
use crate::stack::guard::Guarded;
use crate::stack::http;
use crate::stack::start::{self, loopback};

pub use self::capture::{Capture, Sent};

const POLL: Duration = Duration::from_millis(50);

/// The budget upstream on a free port.
pub fn upstream(dir: &Path) -> (Guarded, u16) {
    start::python_upstream(dir, &root().join("tests/python/budget_upstream.py"))
}

/// One `tollgate serve` on `deploy/budgets/limits/`, the harness's cluster under
/// `prefix`; answering gRPC. The stack's replica, with the concurrency checks below.
pub use crate::stack::start::Replica as Tollgate;

pub fn tollgate_on_limits(prefix: &str) -> Tollgate {
    let config = root().join("deploy/budgets/limits");
    let nodes = crate::common::redis::cluster().nodes().join(",");
    start::replica_on(&config, &nodes, prefix, &[])
}

impl Tollgate {
    /// Whether `tenant` holds every slot of the concurrency limit, asked of tollgate
    /// directly as a check (descriptor hits_addend 0: takes no slot), so waiting for
    /// requests to be in flight does not itself race them for a slot.
    pub fn slots_full(&self, tenant: &str) -> bool {
        self.check_slots(tenant).0
    }

    /// How many of the tenant's slots are free, asked as a check as above.
    pub fn free_slots(&self, tenant: &str) -> u32 {
        self.check_slots(tenant).1
    }

    /// (over the limit, slots free) for `tenant`, as a check takes no slot.
    fn check_slots(&self, tenant: &str) -> (bool, u32) {
        // Any id: a check (hits_addend 0) takes no lease and counts every one held.
        let mut check =
            crate::common::server::descriptor(&[("tenant", tenant), ("request_id", "check")]);
        check.hits_addend = Some(0);
        let request = crate::common::server::request("concurrency", vec![check]);
        let url = format!("http://127.0.0.1:{}", self.grpc);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let mut client = tollgate::proto::RateLimitServiceClient::connect(url)
                .await
                .expect("connect to tollgate");
            let answer = client
                .should_rate_limit(request)
                .await
                .expect("an answer")
                .into_inner();
            let over =
                answer.overall_code == tollgate::proto::rate_limit_response::Code::OverLimit as i32;
            (
                over,
                answer.statuses.first().map_or(0, |s| s.limit_remaining),
            )
        })
    }
}

/// Envoy's ports.
pub struct EnvoyPorts {
    pub listener: u16,
    pub admin: u16,
}

/// `deploy/budgets/envoy.yaml` on loopback: the `tollgate` cluster at `rls`, the
/// `upstream` cluster at `upstream`; `edit` may change the rest (a test's extra
/// route).
pub fn render(
    ports: &EnvoyPorts,
    rls: u16,
    upstream: u16,
    edit: impl FnOnce(&mut Value),
) -> String {
    let mut config = load_yaml(&root().join("deploy/budgets/envoy.yaml"));
    let address = |port: u16| json!({ "address": "127.0.0.1", "port_value": port });
    config["admin"]["address"]["socket_address"] = address(ports.admin);
    config["static_resources"]["listeners"][0]["address"]["socket_address"] =
        address(ports.listener);
    for cluster in config["static_resources"]["clusters"]
        .as_array_mut()
        .expect("clusters")
    {
        let port = match cluster["name"].as_str() {
            Some("tollgate") => rls,
            Some("upstream") => upstream,
            other => panic!("unexpected cluster {other:?}"),
        };
        cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] =
            json!([{ "endpoint": { "address": { "socket_address": address(port) } } }]);
    }
    edit(&mut config);
    serde_json::to_string_pretty(&config).expect("JSON")
}

/// Envoy named `name` on the config `render` gives for its ports (see [`render`]),
/// ready; and its ports.
pub fn envoy(
    dir: &Path,
    name: &str,
    render: impl Fn(&EnvoyPorts) -> String,
) -> (Guarded, EnvoyPorts) {
    let binary = crate::stack::envoy_binary();
    let (envoy, admin, listener) =
        start::envoy_on(&binary, dir, name, "warning", |admin, listener| {
            render(&EnvoyPorts { listener, admin })
        });
    (envoy, EnvoyPorts { listener, admin })
}

/// A request of tenant `tenant` to `path`, with the upstream's cost and delay.
pub fn call(path: &str, tenant: &str, cost: u64, sleep_ms: u64) -> http::Request {
    http::Request::get(path)
        .header("x-tenant", tenant)
        .header("x-cost", &cost.to_string())
        .header("x-sleep-ms", &sleep_ms.to_string())
}

/// Waits until `done` holds, for at most `within`; false if it never did.
pub fn eventually(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// One test's stack on `deploy/budgets/`: tollgate (keys under a prefix named for the
/// test), the budget upstream, and an Envoy in front, in a run directory of its own.
/// Fields drop in order: Envoy first, the directory last.
pub struct Stack {
    envoy: Option<Guarded>,
    /// Envoy's listener.
    pub listener: SocketAddr,
    pub tollgate: Tollgate,
    /// The prefix of tollgate's keys.
    prefix: String,
    upstream_port: u16,
    _upstream: Guarded,
    dir: tempfile::TempDir,
}

pub fn stack(name: &str) -> Stack {
    let dir = tempfile::Builder::new()
        .prefix(&format!("{name}-"))
        .tempdir_in(crate::stack::guard::run_dir())
        .expect("temp dir");
    let prefix = crate::common::redis::unique_prefix(name);
    let tollgate = tollgate_on_limits(&prefix);
    let (upstream, upstream_port) = upstream(dir.path());
    let (envoy, listener) = another_envoy(&dir, &tollgate, upstream_port, "envoy");
    Stack {
        envoy: Some(envoy),
        listener,
        tollgate,
        prefix,
        upstream_port,
        _upstream: upstream,
        dir,
    }
}

impl Stack {
    /// The last `lines` of Envoy's log (empty once it was killed).
    pub fn envoy_log_tail(&self, lines: usize) -> String {
        self.envoy
            .as_ref()
            .map_or_else(String::new, |e| e.log_tail(lines))
    }

    /// What `tenant`'s token budget has counted this period, as Redis holds it
    /// (`tollgate inspect` on the same limits and keys: it consumes nothing).
    pub fn spent(&self, tenant: &str) -> u64 {
        let nodes = crate::common::redis::cluster().nodes().join(",");
        let out = crate::common::process::run(
            crate::common::process::tollgate()
                .arg("inspect")
                .arg("--config")
                .arg(root().join("deploy/budgets/limits"))
                .args(["--redis-cluster", &nodes, "--key-prefix", &self.prefix])
                .args(["--domain", "budgets", "--descriptor"])
                .arg(format!("tenant={tenant}")),
        );
        let text = crate::common::process::text(&out.stdout);
        let state = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("state"))
            .map(str::trim);
        match state {
            Some(state) if state.starts_with("no key") => 0,
            Some(state) => state
                .strip_prefix("count ")
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no count in inspect's state: {text}")),
            None => panic!(
                "inspect said no state:\n{text}{}",
                crate::common::process::text(&out.stderr)
            ),
        }
    }

    /// Kills Envoy with SIGKILL (the guard's drop), as `kill -9`.
    pub fn kill_envoy(&mut self) {
        self.envoy = None;
    }

    /// A second Envoy in front of the same tollgate and upstream (the first one
    /// killed), on fresh ports.
    pub fn another_envoy(&self, name: &str) -> (Guarded, SocketAddr) {
        another_envoy(&self.dir, &self.tollgate, self.upstream_port, name)
    }
}

fn another_envoy(
    dir: &tempfile::TempDir,
    tollgate: &Tollgate,
    upstream_port: u16,
    name: &str,
) -> (Guarded, SocketAddr) {
    let render = |ports: &EnvoyPorts| render(ports, tollgate.grpc, upstream_port, |_| {});
    let (envoy, ports) = envoy(dir.path(), name, render);
    (envoy, loopback(ports.listener))
}
