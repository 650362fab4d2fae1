//! The xDS config source: nothing is read from disk or watched; the process is
//! NOT_SERVING (no domain limits anything) until the control plane's first config
//! arrives, unless `FORCE_START_WITHOUT_INITIAL_CONFIG` asks to serve at once without
//! domains. Following it is running the [`XdsClient`], which installs every accepted
//! response as a whole set.

use std::path::PathBuf;
use std::sync::Arc;

use super::XdsClient;
use crate::background::Background;
use crate::config::Config;
use crate::metrics::source::SourceMetrics;
use crate::server::reload::{
    ConfigSource, FirstSet, ReloadStatus, Reloader, Source, SourceError, config_counts,
};
use crate::settings::xds::XdsSettings;

/// The source's name in logs, metrics and `/config.json`.
pub const XDS: ConfigSource = ConfigSource::pushed("xds");

/// Limits from an xDS control plane (`CONFIG_TYPE=GRPC_XDS_SOTW`).
pub struct XdsSource(pub XdsSettings);

impl Source for XdsSource {
    fn kind(&self) -> ConfigSource {
        XDS
    }

    /// Under xDS the "path" in reload logs is the control plane's URL.
    fn origin(&self) -> PathBuf {
        self.0.server_url.clone().into()
    }

    fn first_set(&self, require_domains: bool) -> Result<FirstSet, SourceError> {
        let xds = &self.0;
        tracing::info!(
            event = "config_source",
            source = "xds",
            server = %xds.server_url,
            node_id = %xds.node_id,
            force_start = xds.force_start_without_initial_config,
            "limits come from the xDS control plane"
        );
        Ok(FirstSet {
            config: Config::new(Vec::new()),
            status: ReloadStatus::waiting_for(XDS),
            config_loaded: xds.force_start_without_initial_config
                && config_counts(0, require_domains),
        })
    }

    /// The client runs for the life of the process; if it ever ends (a panic, or a
    /// return) tollgate would keep serving its last limits with nobody told, so its
    /// end is logged at ERROR.
    fn follow(
        &self,
        reloader: Arc<Reloader>,
        metrics: SourceMetrics,
    ) -> Result<Vec<Background>, SourceError> {
        let client =
            XdsClient::new(self.0.clone(), reloader, metrics).map_err(|e| SourceError::Start {
                source_name: "xDS",
                message: e.to_string(),
            })?;
        let client = Background::spawn(client.run());
        Ok(vec![Background::spawn(async move {
            match client.join().await {
                Ok(()) => tracing::error!(
                    event = "xds_client_ended",
                    "the xDS client stopped; limits will no longer be updated"
                ),
                Err(e) if e.is_cancelled() => {}
                Err(e) => tracing::error!(
                    event = "xds_client_ended",
                    error = %e,
                    "the xDS client panicked; limits will no longer be updated"
                ),
            }
        })])
    }
}
