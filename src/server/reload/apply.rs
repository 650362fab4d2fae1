//! What every reload outcome does to the served state, whichever source produced it:
//! swap the set into the limiter, update [`ReloadState`], health and metrics, and log.
//! The file path reaches it through [`Reloader::reload`]; the xDS client through
//! [`Reloader::install`] and [`Reloader::refuse`].

use std::time::SystemTime;

use super::{ReloadError, ReloadState, Reloader, Trigger, config_counts};
use crate::config::Config;
use crate::limiter::Limiter;
use crate::telemetry::{Json, ratelimited};

/// Shows the served set in the metrics: generation, files' hash, source and version.
pub(super) fn publish(limiter: &Limiter, state: &ReloadState) {
    let metrics = limiter.metrics();
    metrics.config_served(state.generation, state.hash.as_deref());
    let version = state.version.as_deref().or(state.hash.as_deref());
    metrics
        .source()
        .served(state.source.as_str(), version.unwrap_or_default());
}

impl Reloader {
    /// Serves `config`, a whole set from an external source (xDS), as `version`.
    /// Returns the new generation.
    pub async fn install(&self, config: Config, version: &str) -> u64 {
        let _serial = self.serial.lock().await;
        self.swapped(config, None, Some(version.to_owned()), self.pushed())
    }

    /// Records a set from an external source that was refused; the served set stays.
    pub async fn refuse(&self, error: &ReloadError) {
        let _serial = self.serial.lock().await;
        self.failed(error, self.pushed());
    }

    /// What triggered a set the source pushed: the source itself, by name, so a new
    /// pushing source is not logged as xDS.
    fn pushed(&self) -> Trigger {
        Trigger::Pushed(self.source.name)
    }

    /// The files are those already served.
    pub(super) fn unchanged(&self, trigger: Trigger) {
        let (generation, recovered) = {
            let mut state = self.status.lock();
            state.last_success = Some(SystemTime::now());
            (state.generation, state.last_error.take())
        };
        // A broken set put back as it was served: the failure is over too.
        if let Some(errors) = recovered {
            self.log_recovered(trigger, generation, &errors);
        }
        tracing::debug!(
            event = "config_reload_unchanged",
            path = %self.path.display(),
            trigger = trigger.as_str(),
            generation,
            "config files unchanged; nothing to reload"
        );
    }

    /// Swaps `config` in; `hash` for files, `version` for xDS.
    pub(super) fn swapped(
        &self,
        config: Config,
        hash: Option<String>,
        version: Option<String>,
        trigger: Trigger,
    ) -> u64 {
        let now = SystemTime::now();
        let domains = config.domains().len();
        self.limiter.swap_config(config);
        if let Some((health, require_domains)) = &self.health {
            health.set_config_loaded(config_counts(domains, *require_domains));
        }
        let (state, recovered) = {
            let mut state = self.status.lock();
            state.generation += 1;
            state.hash = hash;
            state.version = version;
            state.loaded_at = Some(now);
            state.last_success = Some(now);
            state.successes += 1;
            let recovered = state.last_error.take();
            (state.clone(), recovered)
        };
        self.limiter.metrics().reload(true);
        publish(&self.limiter, &state);
        tracing::info!(
            event = "config_reloaded",
            source = state.source.as_str(),
            path = %self.path.display(),
            trigger = trigger.as_str(),
            generation = state.generation,
            hash = state.hash.as_deref().unwrap_or_default(),
            version = state.version.as_deref().unwrap_or_default(),
            domains,
            "config reloaded"
        );
        if let Some(errors) = recovered {
            self.log_recovered(trigger, state.generation, &errors);
        }
        state.generation
    }

    /// Records a set that did not validate; the served one stays.
    pub(super) fn failed(&self, error: &ReloadError, trigger: Trigger) {
        let messages = error.messages();
        let (generation, failures) = {
            let mut state = self.status.lock();
            state.last_failure = Some(SystemTime::now());
            state.last_error = Some(messages.clone());
            state.failures += 1;
            (state.generation, state.failures)
        };
        self.limiter.metrics().reload(false);
        // A storm of file events fails a reload on each: one line a second.
        let Some(suppressed) = ratelimited::admit(&["config_reload_failed"]) else {
            return;
        };
        tracing::warn!(
            event = "config_reload_failed",
            suppressed,
            source = self.source.as_str(),
            path = %self.path.display(),
            trigger = trigger.as_str(),
            generation,
            failures,
            error_count = messages.len(),
            errors = %Json(&messages),
            "config reload failed; still serving generation {generation}"
        );
    }

    /// The served set is good again after failed reloads: say so, with what had failed.
    fn log_recovered(&self, trigger: Trigger, generation: u64, errors: &[String]) {
        tracing::info!(
            event = "config_recovered",
            path = %self.path.display(),
            trigger = trigger.as_str(),
            generation,
            previous_errors = %Json(errors),
            "config valid again after a failed reload; last_error cleared"
        );
    }
}
