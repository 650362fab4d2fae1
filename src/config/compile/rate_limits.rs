//! A descriptor's `rate_limit` or `rate_limits` into its one [`Rule`]: each mapping
//! validated (`limit.rs`), then the rules that span them (an unlimited entry among
//! others, a rule that replaces itself).

use std::sync::Arc;

use crate::config::yaml::At;

use super::{Compiler, limit};
use crate::algorithm::{Algorithm, Division};
use crate::config::Limit;
use crate::config::diagnostics::{ConfigError, key_line};
use crate::config::rule::{Metadata, MetricLevel, Rule, RuleKind, Tarpit};
use crate::config::schema::{DescriptorYaml, RateLimitYaml};

impl Compiler<'_> {
    /// A descriptor's `rate_limit` or `rate_limits` as one rule.
    pub(super) fn rule(
        &mut self,
        path: &str,
        flags: RuleFlags,
        d: &mut DescriptorYaml,
        line: u64,
    ) -> Option<Rule> {
        let what = format!("descriptor '{path}'");
        let mappings = self.mappings(&what, d)?;
        let mut ok = self.lease_keys_on_the_node(&what, &flags, &mappings);
        let several = mappings.len() > 1;
        let (parsed, failed) = self.limits(&what, mappings);
        let mut limits = Vec::new();
        let mut unlimited = false;
        let mut replaces: Vec<(Arc<str>, u64)> = Vec::new();
        for p in parsed {
            match p.limit {
                Some(limit) => limits.push(limit),
                None => unlimited = true,
            }
            replaces.extend(p.replaces);
        }
        if unlimited && several {
            self.error(
                line,
                format!("{what}: rate_limits: an unlimited entry makes the others meaningless"),
            );
            return None;
        }
        let name: Option<Arc<str>> = limits.iter().find_map(|l| l.name.clone());
        let own: Vec<Arc<str>> = limits.iter().filter_map(|l| l.name.clone()).collect();
        ok &= !failed;
        for (replaced, r_line) in &replaces {
            if own.contains(replaced) {
                self.error(
                    *r_line,
                    format!("{what}: replaces: replaces should not contain name of same descriptor ('{replaced}')"),
                );
                ok = false;
            }
        }
        ok &= self.charges_defined(&what, &flags, &limits, line);
        ok &= self.global_defined(&what, &flags, &limits);
        let kind = if unlimited {
            RuleKind::Unlimited
        } else {
            RuleKind::Limited(limits)
        };
        let rule = Rule {
            path: path.into(),
            name,
            kind,
            replaces: replaces.into_iter().map(|(r, _)| r).collect(),
            shadow_mode: flags.shadow_mode,
            quota_mode: flags.quota_mode,
            overdraft: flags.overdraft,
            detailed_metric: flags.detailed_metric,
            metric_levels: flags.metric_levels,
            metadata: flags.metadata,
            hash_tag: flags.hash_tag,
            tarpit: flags.tarpit,
            global: flags.global.is_some(),
        };
        self.rules.push(rule.clone());
        ok.then_some(rule)
    }

    /// A `lease_key` names the rule's own key, a node without a value: the request's
    /// last entry is its id, which leaves the counter (every request of the path above
    /// shares one) and identifies the request's lease in it.
    fn lease_keys_on_the_node(
        &mut self,
        what: &str,
        flags: &RuleFlags,
        mappings: &[(String, At<RateLimitYaml>)],
    ) -> bool {
        let mut ok = true;
        for (field, mapping) in mappings {
            let Some(key) = &mapping.value.lease_key else {
                continue;
            };
            if flags.key_only.as_deref() == Some(key.value.as_str()) {
                continue;
            }
            let node = match &flags.key_only {
                Some(own) => format!("this descriptor's key is '{own}'"),
                None => "this descriptor has a value".to_owned(),
            };
            self.error(
                key.line,
                format!(
                    "{what}: {field}.lease_key: '{}' must be this descriptor's own key, with no value ({node}): put the rule on a descriptor `key: {}` under the path it limits, and have Envoy send the request's id as its last entry",
                    key.value, key.value
                ),
            );
            ok = false;
        }
        ok
    }

    /// `overdraft` and `quota_mode` charge: refused, with the model's reason, on an
    /// algorithm where a charge makes no sense.
    fn charges_defined(
        &mut self,
        what: &str,
        flags: &RuleFlags,
        limits: &[Limit],
        line: u64,
    ) -> bool {
        let key = match (flags.overdraft, flags.quota_mode) {
            (true, _) => "overdraft",
            (false, true) => "quota_mode",
            (false, false) => return true,
        };
        let mut ok = true;
        for limit in limits {
            if let Some(reason) = limit.algorithm.charge_refusal() {
                self.error(
                    line,
                    format!(
                        "{what}: {key}: not defined for algorithm '{}': {reason}",
                        limit.algorithm.name()
                    ),
                );
                ok = false;
            }
        }
        ok
    }

    /// `global: true` divides each limit between regions: refused where the division
    /// would not keep the limit (the algorithm's reason), for calendar periods (the
    /// regions' windows must be the epoch-aligned ones the ledger names), and for
    /// charges (a charge admits past the limit, once per region).
    fn global_defined(&mut self, what: &str, flags: &RuleFlags, limits: &[Limit]) -> bool {
        let Some(line) = flags.global else {
            return true;
        };
        let mut ok = true;
        for limit in limits {
            if let Division::Refused(reason) = limit.algorithm.division() {
                self.error(
                    line,
                    format!(
                        "{what}: global: not defined for algorithm '{}': {reason} (global rules take {})",
                        limit.algorithm.name(),
                        Algorithm::names_where(|a| !matches!(a.division(), Division::Refused(_)))
                    ),
                );
                ok = false;
            }
            if let Some(zone) = limit.time_zone {
                self.error(
                    line,
                    format!(
                        "{what}: global: not with time_zone '{}': regions agree on epoch-aligned windows, not calendar periods",
                        zone.name()
                    ),
                );
                ok = false;
            }
        }
        for (set, key) in [
            (flags.overdraft, "overdraft"),
            (flags.quota_mode, "quota_mode"),
        ] {
            if set {
                self.error(
                    line,
                    format!(
                        "{what}: global: not with {key}: a charge admits past its counter's limit, so each region could pass its share by one charge"
                    ),
                );
                ok = false;
            }
        }
        ok
    }

    /// `rate_limit`, or each entry of `rate_limits`, with its name in messages.
    fn mappings(
        &mut self,
        what: &str,
        d: &mut DescriptorYaml,
    ) -> Option<Vec<(String, At<RateLimitYaml>)>> {
        match (d.rate_limit.take(), d.rate_limits.take()) {
            (None, None) => None,
            (Some(_), Some(list)) => {
                self.error(
                    key_line(self.source, list.line, "rate_limits"),
                    format!("{what}: use either rate_limit or rate_limits, not both"),
                );
                None
            }
            (Some(one), None) => Some(vec![("rate_limit".to_owned(), one)]),
            (None, Some(list)) if list.value.is_empty() => {
                let line = key_line(self.source, list.line, "rate_limits");
                self.error(line, format!("{what}: rate_limits: must not be empty"));
                None
            }
            (None, Some(list)) => Some(
                list.value
                    .into_iter()
                    .enumerate()
                    .map(|(i, one)| (format!("rate_limits[{i}]"), one))
                    .collect(),
            ),
        }
    }

    /// Each mapping validated; also whether any had an error.
    fn limits(
        &mut self,
        what: &str,
        mappings: Vec<(String, At<RateLimitYaml>)>,
    ) -> (Vec<limit::Parsed>, bool) {
        let (file, source) = (self.file, self.source);
        let mut errors = Vec::new();
        let mut parsed = Vec::new();
        for (field, mapping) in mappings {
            let mut report = |line: u64, message: String| {
                errors.push(ConfigError::new(file, Some(line), message))
            };
            parsed.extend(limit::parse(source, what, &field, mapping, &mut report));
        }
        let failed = !errors.is_empty();
        self.errors.append(&mut errors);
        (parsed, failed)
    }
}

/// Descriptor-level settings that end up on the rule.
pub(super) struct RuleFlags {
    pub(super) shadow_mode: bool,
    pub(super) quota_mode: bool,
    pub(super) overdraft: bool,
    pub(super) detailed_metric: bool,
    pub(super) metric_levels: Option<Arc<[MetricLevel]>>,
    pub(super) metadata: Option<Metadata>,
    pub(super) hash_tag: Option<Arc<[Arc<str>]>>,
    pub(super) tarpit: Option<Tarpit>,
    /// The node's key when it has no value (any value matches it): the only entry a
    /// `lease_key` may name, since that entry is the request's id.
    pub(super) key_only: Option<String>,
    /// `global: true`, with its line.
    pub(super) global: Option<u64>,
}
