//! What a rule's series are labelled with: its domain and path ([`RuleLabels`]), and,
//! for rules that carry request values (`detailed_metric`, `value_to_metric`, Envoy's
//! override), the descriptor's entries as one `descriptor` label; [`OVERFLOW`] is the
//! label of the series that holds the values past the bound.

use std::sync::Arc;

use compact_str::CompactString;
use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};

use crate::config::rule::MetricLevel;

/// Which rule a descriptor's outcome is counted on: plain labels, borrowed from the
/// request's counter (metrics know no store type).
#[derive(Debug, Clone, Copy)]
pub struct RuleLabels<'a> {
    pub domain: &'a Arc<str>,
    /// The rule's config path.
    pub rule: &'a Arc<str>,
    /// The descriptor's entries as counted (a `share_threshold` wildcard as `*`).
    pub entries: &'a [(CompactString, CompactString)],
    /// `detailed_metric: true` (or Envoy's override): the entries become the
    /// `descriptor` label.
    pub detailed: bool,
    /// `value_to_metric` (without `detailed_metric`, which wins): how each entry
    /// appears in the `descriptor` label and the upstream key.
    pub metric_levels: Option<&'a [MetricLevel]>,
}

impl RuleLabels<'_> {
    /// The `descriptor` label's entries, as `(key, value)` (an empty value: the key
    /// alone), when this series carries request values.
    pub(super) fn labelled_entries(&self) -> Option<Vec<(&str, &str)>> {
        if self.detailed {
            return Some(
                self.entries
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect(),
            );
        }
        let levels = self.metric_levels?;
        Some(
            self.entries
                .iter()
                .zip(levels)
                .map(|((k, v), level)| match level {
                    MetricLevel::RequestValue => (k.as_str(), v.as_str()),
                    MetricLevel::Configured(c) => (k.as_str(), &**c),
                    MetricLevel::KeyOnly => (k.as_str(), ""),
                })
                .collect(),
        )
    }
}

/// The `descriptor` label of a rule's series that holds the values past the bound.
pub const OVERFLOW: &str = "(overflow)";

/// `domain`, `rule` and, for `detailed_metric` rules, `descriptor` (`k=v,k2=v2`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct SeriesLabels {
    pub(super) domain: Arc<str>,
    pub(super) rule: Arc<str>,
    pub(super) descriptor: Option<Box<str>>,
}

impl EncodeLabelSet for SeriesLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        ("domain", &*self.domain).encode(encoder.encode_label())?;
        ("rule", &*self.rule).encode(encoder.encode_label())?;
        // Absent, not empty, when the rule does not ask for descriptor values.
        if let Some(descriptor) = &self.descriptor {
            ("descriptor", &**descriptor).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// The labels of `rule`'s series: with `descriptor`, one made from request values.
pub(super) fn series_labels(rule: &RuleLabels<'_>, descriptor: Option<&str>) -> SeriesLabels {
    SeriesLabels {
        domain: rule.domain.clone(),
        rule: rule.rule.clone(),
        descriptor: descriptor.map(Into::into),
    }
}

/// The labelled entries as `k=v,k2=v2` (a key without value alone; a
/// `share_threshold` wildcard shows as `*`, as it is counted).
pub(super) fn descriptor_text(entries: &[(&str, &str)]) -> String {
    let mut text = String::new();
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(k);
        if !v.is_empty() {
            text.push('=');
            text.push_str(v);
        }
    }
    text
}
