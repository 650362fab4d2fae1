//! The ADS state-of-the-world stream: subscribe to every `RateLimitConfig`, compile
//! each response as a whole set, ACK it (serving it) or NACK it with the errors
//! (serving the old set), and reconnect when the stream breaks.
//!
//! Protocol, as Envoy's xDS clients and upstream's go-control-plane client speak it:
//! the first request of a stream carries the node, the type URL, no resource names (a
//! wildcard) and the version last ACKed (empty at first), so a control plane that
//! restarted learns what we serve. Every response is answered: an ACK names its
//! version and nonce; a NACK names the nonce, keeps the last ACKed version and sets
//! `error_detail` (INVALID_ARGUMENT with the errors, one per line: the first ones up
//! to [`MAX_NACK_BYTES`], then how many more, so the NACK always fits the control
//! plane's message limit: 10,000 bad resources would make a NACK over gRPC's default
//! 4 MiB, which the control plane drops, and the two would loop reconnecting).

use std::path::Path;
use std::sync::Arc;

use prost_types::{Struct, Value, value::Kind};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::XdsError;
use super::backoff::{Retry, spread};
use super::connect::Dialer;
use super::translate::{RATE_LIMIT_CONFIG_TYPE, compile};
use crate::config::{ConfigError, ConfigErrors};
use crate::metrics::source::SourceMetrics;
use crate::proto::envoy::config::core::v3::{Node, node::UserAgentVersionType};
use crate::proto::envoy::service::discovery::v3::{
    DiscoveryRequest, DiscoveryResponse,
    aggregated_discovery_service_client::AggregatedDiscoveryServiceClient,
};
use crate::proto::google::rpc::Status as RpcStatus;
use crate::server::reload::{ReloadError, Reloader};
use crate::settings::xds::XdsSettings;
use crate::telemetry::ratelimited;

/// google.rpc.Code INVALID_ARGUMENT: what a NACK's error detail says of a bad config.
const INVALID_ARGUMENT: i32 = 3;

/// Bound on a NACK's error message: a few KiB say what is wrong, and a control plane
/// needs no more to log it (the whole list is in our own log at debug).
pub const MAX_NACK_BYTES: usize = 4096;
/// Bound on one error line of it: a resource name or a value comes from the control
/// plane, and one huge line must not crowd out the others.
const MAX_NACK_LINE: usize = 512;

/// One control plane, one limiter: the state that outlives reconnects.
pub struct XdsClient {
    settings: XdsSettings,
    dialer: Dialer,
    reloader: Arc<Reloader>,
    metrics: SourceMetrics,
    /// The version last ACKed, sent again on a new stream.
    acked: String,
}

impl XdsClient {
    /// Checks the URL, headers and certificate files (see [`Dialer::new`]).
    pub fn new(
        settings: XdsSettings,
        reloader: Arc<Reloader>,
        metrics: SourceMetrics,
    ) -> Result<Self, XdsError> {
        Ok(Self {
            dialer: Dialer::new(&settings)?,
            settings,
            reloader,
            metrics,
            acked: String::new(),
        })
    }

    /// Streams until the task is dropped: dial, subscribe, apply, and on any failure
    /// wait (connect retry interval, or backoff after a broken stream) and start over.
    pub async fn run(mut self) {
        let mut retry = Retry::new(self.settings.backoff);
        loop {
            let channel = match self.dialer.connect().await {
                Ok(channel) => channel,
                Err(error) => {
                    let wait = spread(self.settings.connect_retry_interval, 0.5);
                    warn_failure("xds_connect_failed", &error, wait, self.dialer.url());
                    tokio::time::sleep(wait).await;
                    continue;
                }
            };
            let ended = self.stream(channel, &mut retry).await;
            self.metrics.xds_connected(false);
            let wait = retry.next_delay();
            let error = ended.err().unwrap_or(XdsError::Closed);
            warn_failure("xds_stream_broken", &error, wait, self.dialer.url());
            tokio::time::sleep(wait).await;
        }
    }

    /// One stream, until it breaks.
    async fn stream(
        &mut self,
        channel: tonic::transport::Channel,
        retry: &mut Retry,
    ) -> Result<(), XdsError> {
        let (requests, outgoing) = mpsc::channel(4);
        let first = self.request(self.acked.clone(), String::new(), None, true);
        // The receiver is alive until the call below consumes it; this cannot fail.
        let _ = requests.send(first).await;
        let mut call = tonic::Request::new(ReceiverStream::new(outgoing));
        *call.metadata_mut() = self.dialer.headers().clone();
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        if let Some(max) = self.dialer.max_message_bytes {
            client = client.max_decoding_message_size(max);
        }
        let mut responses = client
            .stream_aggregated_resources(call)
            .await
            .map_err(|s| XdsError::Stream(s.to_string()))?
            .into_inner();
        self.metrics.xds_connected(true);
        tracing::info!(
            event = "xds_connected",
            server = self.dialer.url(),
            node_id = %self.settings.node_id,
            version = %self.acked,
            "subscribed to RateLimitConfig resources"
        );
        while let Some(response) = responses
            .message()
            .await
            .map_err(|s| XdsError::Stream(s.to_string()))?
        {
            retry.reset();
            let answer = self.apply(response).await;
            if requests.send(answer).await.is_err() {
                return Err(XdsError::Closed);
            }
        }
        Ok(())
    }

    /// Serves or refuses one response; returns its ACK or NACK.
    async fn apply(&mut self, response: DiscoveryResponse) -> DiscoveryRequest {
        let DiscoveryResponse {
            version_info,
            resources,
            type_url,
            nonce,
            ..
        } = response;
        let count = resources.len();
        let compiled = if type_url == RATE_LIMIT_CONFIG_TYPE {
            tokio::task::spawn_blocking(move || compile(&resources))
                .await
                .map_err(|e| ReloadError::Task(e.to_string()))
                .and_then(|r| r.map_err(ReloadError::Invalid))
        } else {
            // Refused like an invalid config (NACKed, counted, kept as the last
            // failure). The NACK keeps our type_url: in ADS a request's type_url is a
            // subscription, so naming the stray type would subscribe us to it; the
            // nonce says which response is refused and the message names its type.
            let message = format!(
                "unexpected type '{type_url}': only {RATE_LIMIT_CONFIG_TYPE} is subscribed"
            );
            let error = ConfigError::new(Path::new("response"), None, message);
            Err(ReloadError::Invalid(ConfigErrors(vec![error])))
        };
        match compiled {
            Ok(config) => {
                let generation = self.reloader.install(config, &version_info).await;
                tracing::debug!(
                    event = "xds_ack",
                    version = %version_info,
                    resources = count,
                    generation,
                    "xDS response served"
                );
                self.metrics.xds_update(true);
                self.acked = version_info.clone();
                self.request(version_info, nonce, None, false)
            }
            Err(error) => {
                self.reloader.refuse(&error).await;
                self.metrics.xds_update(false);
                let messages = error.messages();
                let detail = RpcStatus {
                    code: INVALID_ARGUMENT,
                    message: nack_message(&messages),
                    details: Vec::new(),
                };
                tracing::warn!(
                    event = "xds_nack",
                    version = %version_info,
                    served_version = %self.acked,
                    errors = messages.len(),
                    "xDS response refused; the served config stays"
                );
                self.request(self.acked.clone(), nonce, Some(detail), false)
            }
        }
    }

    /// A request of this stream; the node goes on the first only (as Envoy does).
    fn request(
        &self,
        version_info: String,
        response_nonce: String,
        error_detail: Option<RpcStatus>,
        first: bool,
    ) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info,
            node: first.then(|| node(&self.settings)),
            resource_names: Vec::new(),
            type_url: RATE_LIMIT_CONFIG_TYPE.to_owned(),
            response_nonce,
            error_detail,
        }
    }
}

/// Who we are to the control plane: the node id it serves by and the metadata given.
fn node(settings: &XdsSettings) -> Node {
    let fields = settings
        .node_metadata
        .iter()
        .map(|(k, v)| {
            let value = Value {
                kind: Some(Kind::StringValue(v.clone())),
            };
            (k.clone(), value)
        })
        .collect();
    Node {
        id: settings.node_id.clone(),
        metadata: Some(Struct { fields }),
        user_agent_name: "tollgate".to_owned(),
        user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
            env!("CARGO_PKG_VERSION").to_owned(),
        )),
        ..Node::default()
    }
}

/// One warn line a second at most: a control plane that is away fails every attempt.
fn warn_failure(event: &'static str, error: &XdsError, wait: std::time::Duration, url: &str) {
    if let Some(suppressed) = ratelimited::admit(&[event]) {
        tracing::warn!(
            event,
            suppressed,
            server = url,
            error = %error,
            retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            "xDS control plane unavailable; retrying, the served config stays"
        );
    }
}

/// The NACK's message: the errors one per line, each cut to [`MAX_NACK_LINE`] bytes,
/// as many as fit in [`MAX_NACK_BYTES`], then `... and N more errors`.
fn nack_message(messages: &[String]) -> String {
    // Room kept for the last line, so the whole never passes the bound.
    const TAIL: usize = 48;
    let mut text = String::new();
    for (shown, message) in messages.iter().enumerate() {
        let line = truncate(message, MAX_NACK_LINE);
        let needed = line.len() + usize::from(!text.is_empty());
        let rest = messages.len() - shown;
        let room = if rest > 1 {
            MAX_NACK_BYTES - TAIL
        } else {
            MAX_NACK_BYTES
        };
        if text.len() + needed > room {
            text.push_str(&format!("\n... and {rest} more errors"));
            return text;
        }
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(line);
    }
    text
}

/// `text` cut to at most `max` bytes at a character boundary.
fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nack_keeps_the_first_errors_and_counts_the_rest() {
        let messages: Vec<String> = (0..10_000)
            .map(|i| format!("resource-{i}: descriptor 'k': unknown key 'x'"))
            .collect();
        let text = nack_message(&messages);
        assert!(text.len() <= MAX_NACK_BYTES, "{}", text.len());
        assert!(text.starts_with("resource-0: descriptor 'k'"), "{text}");
        let shown = text.lines().count() - 1;
        let last = text.lines().last().unwrap();
        assert_eq!(last, format!("... and {} more errors", 10_000 - shown));
        assert!(shown > 50, "{shown}");
    }

    #[test]
    fn few_errors_go_whole_and_a_huge_one_is_cut_at_a_character() {
        let two = ["a: one".to_owned(), "b: two".to_owned()];
        assert_eq!(nack_message(&two), "a: one\nb: two");
        let huge = format!("{}: too long", "é".repeat(10_000));
        let text = nack_message(&[huge]);
        assert!(
            text.len() <= MAX_NACK_LINE && text.starts_with('é'),
            "{text}"
        );
    }
}
