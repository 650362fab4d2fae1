//! Where the served config came from: `tollgate_config_source_info{source,version}`
//! (always 1; the source's name, `server::reload::ConfigSource`: `file` with the
//! files' hash as version, or `xds` with the control plane's `version_info`) and, for xDS, `tollgate_xds_connected` (1 while a stream to
//! the control plane is open) and `tollgate_xds_updates_total{result}` (responses
//! ACKed or NACKed). When an update was last refused is the reload failure timestamp
//! of the lifecycle metrics, whichever the source.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The source metrics (cheap to clone: handles on the registered series).
#[derive(Debug, Clone)]
pub struct SourceMetrics {
    info: Family<[(&'static str, String); 2], Gauge>,
    connected: Gauge,
    updates: Family<[(&'static str, &'static str); 1], Counter>,
}

impl SourceMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let info = Family::default();
        registry.register(
            "tollgate_config_source_info",
            "Always 1; source names the config source (file, xds), version what it served (the files' hash, the xDS version_info)",
            info.clone(),
        );
        let connected = Gauge::default();
        registry.register(
            "tollgate_xds_connected",
            "1 while the stream to the xDS control plane is open",
            connected.clone(),
        );
        let updates = Family::default();
        registry.register(
            "tollgate_xds_updates",
            "xDS responses accepted (ack) or refused with the old config kept (nack)",
            updates.clone(),
        );
        Self {
            info,
            connected,
            updates,
        }
    }

    /// The set now served: one series, the previous one removed.
    pub fn served(&self, source: &'static str, version: &str) {
        self.info.clear();
        self.info
            .get_or_create(&[
                ("source", source.to_owned()),
                ("version", version.to_owned()),
            ])
            .set(1);
    }

    pub fn xds_connected(&self, connected: bool) {
        self.connected.set(i64::from(connected));
    }

    /// One response handled: `true` ACKed, `false` NACKed.
    pub fn xds_update(&self, accepted: bool) {
        let result = if accepted { "ack" } else { "nack" };
        self.updates.get_or_create(&[("result", result)]).inc();
    }
}
