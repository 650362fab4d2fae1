//! What the process is and what happened to its config: `tollgate_build_info` (always
//! 1, labelled with the version and commit) and the timestamps of the last config
//! reload that swapped and of the last one refused. An alert compares the two: a
//! failure newer than the last success means a broken config is waiting on disk.

use std::sync::atomic::AtomicU64;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

/// The version `tollgate_build_info` reports (Cargo's).
pub const BUILD_VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit `tollgate_build_info` reports: `git rev-parse --short HEAD` at build
/// time, or `unknown` when built without git (see build.rs).
pub const BUILD_COMMIT: &str = env!("TOLLGATE_COMMIT");

pub(super) struct Lifecycle {
    /// Unix seconds of the last reload that swapped; the start-up load counts, as in
    /// Prometheus' own `prometheus_config_last_reload_success_timestamp_seconds`.
    success_at: Gauge<f64, AtomicU64>,
    /// Unix seconds of the last reload refused; 0 until one is.
    failure_at: Gauge<f64, AtomicU64>,
}

impl Lifecycle {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let build_info = Family::<[(&'static str, &'static str); 2], Gauge>::default();
        registry.register(
            "tollgate_build_info",
            "Always 1; the labels say which build is running",
            build_info.clone(),
        );
        build_info
            .get_or_create(&[("version", BUILD_VERSION), ("commit", BUILD_COMMIT)])
            .set(1);
        let success_at = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "tollgate_config_last_reload_success_timestamp",
            "When the served config was last swapped in (start-up included), as Unix time",
            Unit::Seconds,
            success_at.clone(),
        );
        let failure_at = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "tollgate_config_last_reload_failure_timestamp",
            "When a config reload was last refused (the old config kept), as Unix time; 0 if never",
            Unit::Seconds,
            failure_at.clone(),
        );
        success_at.set(unix_now());
        Self {
            success_at,
            failure_at,
        }
    }

    pub(super) fn reload(&self, success: bool) {
        let at = if success {
            &self.success_at
        } else {
            &self.failure_at
        };
        at.set(unix_now());
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}
