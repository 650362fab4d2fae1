//! Logging and tracing setup: `tracing` events to stderr, as text or JSON
//! (`LOG_FORMAT=json`), at the level `LOG_LEVEL` names (envoyproxy/ratelimit's logrus
//! names are accepted); and, when traces are configured, the request spans (target
//! [`SPAN_TARGET`]) exported over OTLP ([`otlp`]). The spans are for traces only:
//! the log output never shows them, and with traces off they are never built.

pub mod otlp;
pub mod propagation;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use self::otlp::{OtlpProtocol, TelemetryError, TracingSettings};

/// The target of the spans that become OpenTelemetry spans (request, match, backend).
pub const SPAN_TARGET: &str = "tollgate::span";

/// What must outlive serving: the span exporter, flushed by [`Telemetry::shutdown`].
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn tracing(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the spans still buffered and stops the exporter (it blocks on the
    /// export, so it runs on a blocking thread).
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        let outcome = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(error)) = outcome {
            tracing::warn!(%error, "span exporter did not shut down cleanly");
        }
    }
}

/// Installs the global subscriber, logs only. `RUST_LOG`, when set, gives a full
/// filter and wins.
pub fn init(level: Option<&str>, json: bool) {
    install(level, json, None);
}

/// Installs the global subscriber, with span export when `tracing` is given. Must be
/// called inside a Tokio runtime (the gRPC exporter's channel lives there).
pub fn init_with_tracing(
    level: Option<&str>,
    json: bool,
    tracing: Option<&TracingSettings>,
) -> Result<Telemetry, TelemetryError> {
    let provider = tracing.map(otlp::provider).transpose()?;
    install(level, json, provider.clone());
    Ok(Telemetry { provider })
}

fn install(level: Option<&str>, json: bool, provider: Option<SdkTracerProvider>) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(level_directive(level.unwrap_or("info"))));
    // The trace spans never reach the log output, whatever the filter says.
    let filter = match format!("{SPAN_TARGET}=off").parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = if json {
        fmt.json().flatten_event(true).with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    let spans = provider.map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("tollgate"))
            // Our spans, and our events as span events (a shadow-mode hit, a fallback).
            .with_filter(Targets::new().with_target("tollgate", Level::INFO))
    });
    // A second init (tests) keeps the first subscriber; that is not an error.
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(spans)
        .try_init();
}

/// Maps logrus level names (`WARN`, `warning`, `fatal`, `panic`) to tracing's.
fn level_directive(level: &str) -> &'static str {
    match level.trim().to_ascii_lowercase().as_str() {
        "trace" => "trace",
        "debug" => "debug",
        "warn" | "warning" => "warn",
        "error" | "fatal" | "panic" => "error",
        _ => "info",
    }
}
