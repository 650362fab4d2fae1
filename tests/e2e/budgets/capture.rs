//! A rate-limit service that keeps what Envoy sends: every `ShouldRateLimit` request,
//! decoded with tollgate's own protos (`is_negative_hits` included), answered OK, or
//! OVER_LIMIT when a descriptor names tenant `denied`. It runs on a runtime of its own
//! (the end-to-end tests are plain threads) and stops when dropped.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;
use tollgate::proto::rate_limit_response::Code;
use tollgate::proto::{
    RateLimitRequest, RateLimitResponse, RateLimitService, RateLimitServiceServer,
};
use tonic::{Request, Response, Status};

/// One descriptor as Envoy sent it: its entries, its own hits_addend (`None`: not
/// set), and whether its hits are given back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub domain: String,
    pub entries: Vec<(String, String)>,
    pub hits_addend: Option<u64>,
    pub is_negative_hits: bool,
    /// The request-level hits_addend of the call it came in.
    pub request_hits: u32,
}

#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Vec<Vec<Sent>>>>,
}

#[tonic::async_trait]
impl RateLimitService for Recorder {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        let sent: Vec<Sent> = request
            .descriptors
            .iter()
            .map(|d| Sent {
                domain: request.domain.clone(),
                entries: d
                    .entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.clone()))
                    .collect(),
                hits_addend: d.hits_addend,
                is_negative_hits: d.is_negative_hits,
                request_hits: request.hits_addend,
            })
            .collect();
        let denied = sent
            .iter()
            .any(|s| s.entries.iter().any(|(_, v)| v == "denied"));
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(sent);
        let code = if denied { Code::OverLimit } else { Code::Ok };
        Ok(Response::new(RateLimitResponse {
            overall_code: code as i32,
            ..RateLimitResponse::default()
        }))
    }
}

/// The running service.
pub struct Capture {
    pub port: u16,
    recorder: Recorder,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Capture {
    pub fn start() -> Capture {
        let recorder = Recorder::default();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("bound").port();
        let (stop, stopped) = oneshot::channel::<()>();
        let service = recorder.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                tonic::transport::Server::builder()
                    .add_service(RateLimitServiceServer::new(service))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("capture serves");
            });
        });
        Capture {
            port,
            recorder,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Every call so far, each its descriptors.
    pub fn calls(&self) -> Vec<Vec<Sent>> {
        self.recorder
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The descriptors of every call whose entries include `(key, value)`.
    pub fn with_entry(&self, key: &str, value: &str) -> Vec<Sent> {
        self.calls()
            .into_iter()
            .flatten()
            .filter(|s| s.entries.iter().any(|(k, v)| k == key && v == value))
            .collect()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
