//! Logging setup: `tracing` to stderr, as text or JSON (`LOG_FORMAT=json`), at the
//! level `LOG_LEVEL` names (envoyproxy/ratelimit's logrus names are accepted).

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `RUST_LOG`, when set, gives a full filter and wins.
pub fn init(level: Option<&str>, json: bool) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(level_directive(level.unwrap_or("info"))));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests) keeps the first subscriber; that is not an error.
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
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
