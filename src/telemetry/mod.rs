//! Logging and tracing setup: `tracing` events to stderr through a bounded queue that
//! drops rather than blocks ([`nonblocking`]), as text or JSON
//! (`LOG_FORMAT=json`, [`json`]), at the level `LOG_LEVEL` names (envoyproxy/ratelimit's
//! logrus names are accepted), coloured only on a terminal (`LOG_COLOR`); per-request
//! events rate-limited per cause ([`ratelimited`]); and, when traces are configured,
//! the request spans (target [`SPAN_TARGET`]) exported over OTLP ([`otlp`]). The spans
//! are for traces only: the log output never shows them, and with traces off they are
//! never built.

pub mod json;
pub mod nonblocking;
pub mod otlp;
pub mod propagation;
pub mod ratelimited;

use std::io::IsTerminal;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use self::json::Json;
pub use self::otlp::{OtlpProtocol, TelemetryError, TracingSettings};

/// The target of the spans that become OpenTelemetry spans (request, match, backend).
pub const SPAN_TARGET: &str = "tollgate::span";

/// The target of the per-request `decision` events (debug): why a request got its
/// answer. `LOG_LEVEL=debug` shows them, or `RUST_LOG=decision=debug` alone.
pub const DECISION_TARGET: &str = "decision";

/// Libraries whose debug output is protocol frames, not tollgate's story: kept at warn
/// whatever `LOG_LEVEL` says. A `RUST_LOG` filter replaces all of this.
const QUIET_LIBRARIES: &[&str] = &[
    "h2",
    "hyper",
    "hyper_util",
    "tower",
    "tonic",
    "redis",
    "rustls",
    "tokio_rustls",
    "notify",
    "opentelemetry",
    "opentelemetry_sdk",
    "opentelemetry_otlp",
    "reqwest",
];

/// When text logs are coloured (`LOG_COLOR`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogColor {
    /// On a terminal only, and not when `NO_COLOR` is set: files, pipes, `kubectl logs`
    /// and log shippers get plain text.
    #[default]
    Auto,
    Always,
    Never,
}

impl LogColor {
    /// `always`, `never` or `auto` (any case); unset or empty is `auto`.
    pub fn parse(value: Option<&str>) -> Result<Self, TelemetryError> {
        match value.map(str::trim).map(str::to_ascii_lowercase).as_deref() {
            None | Some("" | "auto") => Ok(LogColor::Auto),
            Some("always") => Ok(LogColor::Always),
            Some("never") => Ok(LogColor::Never),
            Some(_) => Err(TelemetryError::Color(value.unwrap_or_default().to_owned())),
        }
    }

    /// Whether ANSI colour goes into stderr.
    fn enabled(self) -> bool {
        match self {
            LogColor::Always => true,
            LogColor::Never => false,
            LogColor::Auto => {
                std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                    && std::io::stderr().is_terminal()
            }
        }
    }
}

/// How logs are written: `LOG_LEVEL`, `LOG_FORMAT`, `LOG_COLOR`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogSettings {
    pub level: Option<String>,
    pub json: bool,
    pub color: LogColor,
}

impl LogSettings {
    /// From the environment as `env` reads it; an unknown `LOG_COLOR` is an error.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Self, TelemetryError> {
        Ok(LogSettings {
            level: env("LOG_LEVEL"),
            json: env("LOG_FORMAT").is_some_and(|f| f.eq_ignore_ascii_case("json")),
            color: LogColor::parse(env("LOG_COLOR").as_deref())?,
        })
    }
}

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
pub fn init(logs: &LogSettings) {
    install(logs, None);
}

/// Installs the global subscriber, with span export when `tracing` is given. Must be
/// called inside a Tokio runtime (the gRPC exporter's channel lives there).
pub fn init_with_tracing(
    logs: &LogSettings,
    tracing: Option<&TracingSettings>,
) -> Result<Telemetry, TelemetryError> {
    let provider = tracing.map(otlp::provider).transpose()?;
    install(logs, provider.clone());
    Ok(Telemetry { provider })
}

fn install(settings: &LogSettings, provider: Option<SdkTracerProvider>) {
    let filter = log_filter(
        std::env::var("RUST_LOG").ok().as_deref(),
        settings.level.as_deref(),
    );
    // Never stderr itself: a stuck log reader would block every task that logs.
    let fmt = tracing_subscriber::fmt::layer().with_writer(nonblocking::stderr());
    let logs = if settings.json {
        fmt.event_format(json::JsonLines::default())
            .with_filter(filter)
            .boxed()
    } else {
        fmt.with_ansi(settings.color.enabled())
            .with_filter(filter)
            .boxed()
    };
    // A second init (tests) keeps the first subscriber; that is not an error.
    let registry = tracing_subscriber::registry().with(logs);
    match provider {
        Some(provider) => {
            let spans = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("tollgate"))
                // Our spans, and our events as span events (a shadow-mode hit, a fallback).
                .with_filter(Targets::new().with_target("tollgate", Level::INFO));
            let _ = registry.with(spans).try_init();
        }
        // No span layer at all, not an empty `Option` one: an absent `Option` layer
        // tells tracing it wants every callsite (`Interest::always`), so each request
        // built its spans (allocated, entered, exited, closed) for nobody.
        None => {
            let _ = registry.try_init();
        }
    }
}

/// `RUST_LOG` when set and valid (it wins); otherwise `level` with the libraries kept
/// quiet. Either way the trace spans never reach the log output.
fn log_filter(rust_log: Option<&str>, level: Option<&str>) -> EnvFilter {
    let mut filter = rust_log
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| {
            let mut directives = level_directive(level.unwrap_or("info")).to_owned();
            for library in QUIET_LIBRARIES {
                directives.push_str(&format!(",{library}=warn"));
            }
            EnvFilter::new(directives)
        });
    if let Ok(directive) = format!("{SPAN_TARGET}=off").parse() {
        filter = filter.add_directive(directive);
    }
    filter
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

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::metadata::LevelFilter;

    #[test]
    fn log_color_takes_three_words_and_refuses_others() {
        assert_eq!(LogColor::parse(None).unwrap(), LogColor::Auto);
        assert_eq!(LogColor::parse(Some("")).unwrap(), LogColor::Auto);
        assert_eq!(LogColor::parse(Some("Always")).unwrap(), LogColor::Always);
        assert_eq!(LogColor::parse(Some("never")).unwrap(), LogColor::Never);
        let error = LogColor::parse(Some("sometimes")).unwrap_err().to_string();
        assert!(
            error.contains("LOG_COLOR") && error.contains("sometimes"),
            "{error}"
        );
    }

    #[test]
    fn debug_keeps_libraries_at_warn_unless_rust_log_says_otherwise() {
        let filter = log_filter(None, Some("debug")).to_string();
        assert!(
            filter.contains("h2=warn") && filter.contains("tonic=warn"),
            "{filter}"
        );
        assert_eq!(
            log_filter(None, Some("debug")).max_level_hint(),
            Some(LevelFilter::DEBUG)
        );
        let own = log_filter(Some("h2=trace,decision=debug"), Some("info")).to_string();
        assert!(
            !own.contains("h2=warn") && own.contains("h2=trace"),
            "{own}"
        );
        assert!(own.contains("tollgate::span=off"), "{own}");
    }
}
