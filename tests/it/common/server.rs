//! An in-process tollgate server for integration tests: [`TestServer::start`] binds
//! gRPC and HTTP on `127.0.0.1:0`, runs `tollgate::server::run` on a task and returns
//! once the gRPC port answers a real call. Any [`Store`] can back it, so the Redis
//! suites reuse it. Also small builders for configs and requests.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use tollgate::config::Config;
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::rate_limit_descriptor::Entry;
use tollgate::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient};
use tollgate::server::{self, Listeners};
use tollgate::store::Store;

/// How long starting or stopping a server may take before the test fails.
pub const STARTUP_DEADLINE: Duration = Duration::from_secs(10);
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(10);

/// A running server; dropping it without [`TestServer::stop`] still asks it to stop.
pub struct TestServer {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub limiter: Arc<Limiter>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), tollgate::Error>>>,
}

impl TestServer {
    /// Binds both ports on 127.0.0.1:0, serves, and waits until a gRPC health check
    /// succeeds (bounded by [`STARTUP_DEADLINE`]).
    pub async fn start(config: Config, store: Arc<dyn Store>, options: LimiterOptions) -> Self {
        Self::start_limiter(Arc::new(Limiter::new(config, store, options))).await
    }

    /// [`TestServer::start`] with a limiter built by the test (its own metrics, say).
    pub async fn start_limiter(limiter: Arc<Limiter>) -> Self {
        let any: SocketAddr = "127.0.0.1:0".parse().expect("valid address");
        let listeners = Listeners::bind(any, any).await.expect("bind 127.0.0.1:0");
        let grpc_addr = listeners.grpc_addr();
        let http_addr = listeners.http_addr();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server::run(listeners, limiter.clone(), async move {
            let _ = rx.await;
        }));
        let server = TestServer {
            grpc_addr,
            http_addr,
            limiter,
            shutdown: Some(tx),
            task: Some(task),
        };
        server.wait_until_serving().await;
        server
    }

    /// Retries a health check until it answers SERVING; a condition, not a delay.
    async fn wait_until_serving(&self) {
        let deadline = Instant::now() + STARTUP_DEADLINE;
        let mut last_error = String::from("no attempt made");
        while Instant::now() < deadline {
            match Channel::from_shared(self.url())
                .expect("valid url")
                .connect()
                .await
            {
                Ok(channel) => {
                    let request = HealthCheckRequest {
                        service: String::new(),
                    };
                    match HealthClient::new(channel).check(request).await {
                        Ok(_) => return,
                        Err(status) => last_error = format!("health check: {status}"),
                    }
                }
                Err(e) => last_error = format!("connect: {e}"),
            }
            // Back-off between attempts of a bounded retry loop.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "server on {} did not answer within {STARTUP_DEADLINE:?}: {last_error}",
            self.grpc_addr
        );
    }

    /// `http://127.0.0.1:PORT` of the gRPC port.
    pub fn url(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url())
            .expect("valid url")
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.grpc_addr))
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::new(self.channel().await)
    }

    /// Triggers graceful shutdown and waits for `server::run` to return Ok.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let task = self.task.take().expect("task present until stop");
        match tokio::time::timeout(SHUTDOWN_DEADLINE, task).await {
            Err(_) => panic!("server did not stop within {SHUTDOWN_DEADLINE:?}"),
            Ok(Err(join)) => panic!("server task panicked: {join}"),
            Ok(Ok(Err(e))) => panic!("server::run returned an error: {e}"),
            Ok(Ok(Ok(()))) => {}
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A config from inline YAML, as if read from `test.yaml`; panics listing the errors.
pub fn config(yaml: &str) -> Config {
    tollgate::config::load_sources(&[(Path::new("test.yaml"), yaml)])
        .unwrap_or_else(|errors| panic!("test config does not load: {errors}"))
}

/// A descriptor from `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
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

/// A request for `domain` with the given descriptors and no request-level hits_addend.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// Whether connections to `addr` are refused, polled for up to 2 s: a listener this
/// process has closed may accept a moment longer, because a child process that another
/// test of the binary is starting (redis-cli, a server) holds a copy of every
/// descriptor of this process until its `exec`.
pub fn refused_soon(addr: SocketAddr) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return true,
            _ if Instant::now() >= deadline => return false,
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}
