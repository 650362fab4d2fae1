//! Validation of one parsed file into a [`Domain`]: every rule of envoyproxy/ratelimit's
//! loader, each error naming the file, the line and the descriptor it concerns.

mod limit;
mod metadata;
mod rate_limits;
mod response;

use std::collections::hash_map::Entry;
use std::path::Path;
use std::sync::Arc;

use crate::config::yaml::At;

use self::rate_limits::RuleFlags;
use super::diagnostics::ConfigError;
use super::glob::Glob;
use super::rule::{MetricLevel, Rule};
use super::schema::{DescriptorYaml, DomainYaml};
use super::tree::{Branch, Domain, FailureMode, Level, Node};

/// Compiles one file's contents. Errors are appended to `errors`; a domain comes back
/// only when the file had none.
pub fn compile_domain(
    file: &Path,
    source: &str,
    yaml: DomainYaml,
    errors: &mut Vec<ConfigError>,
) -> Option<Domain> {
    let before = errors.len();
    let name = match &yaml.domain {
        Some(d) if !d.value.is_empty() => d.value.clone(),
        Some(d) => {
            errors.push(ConfigError::new(
                file,
                Some(d.line),
                "domain: must not be empty",
            ));
            return None;
        }
        None => {
            errors.push(ConfigError::new(
                file,
                Some(1),
                "domain: missing (every file must name its domain)",
            ));
            return None;
        }
    };
    let mut compiler = Compiler {
        file,
        source,
        errors,
        rules: Vec::new(),
    };
    let hash_tag = compiler.hash_tag(yaml.hash_tag.as_ref(), "domain", None);
    let scope = Scope {
        composite: format!("{name}."),
        path: String::new(),
        keys: Vec::new(),
        hash_tag,
        metric_levels: Vec::new(),
    };
    let root = compiler.level(&scope, yaml.descriptors.unwrap_or_default());
    let rules = compiler.rules;
    let mut report =
        |line: u64, message: String| errors.push(ConfigError::new(file, Some(line), message));
    let raw_body = response::raw_body(yaml.raw_body, &mut report);
    let failure_mode = match &yaml.failure_mode {
        None => FailureMode::default(),
        Some(m) => FailureMode::parse(&m.value).unwrap_or_else(|| {
            let expected: Vec<&str> = FailureMode::ALL.iter().map(|(_, n)| *n).collect();
            report(
                m.line,
                format!(
                    "failure_mode: unknown mode '{}' (expected one of {})",
                    m.value,
                    expected.join(", ")
                ),
            );
            FailureMode::default()
        }),
    };
    (errors.len() == before).then(|| Domain {
        name: name.into(),
        root,
        rules,
        raw_body,
        failure_mode,
    })
}

/// What a descriptor inherits from the nodes above it.
struct Scope {
    /// envoyproxy/ratelimit's composite key of the parent (`domain.k_v.`), for
    /// duplicate errors in its wording.
    composite: String,
    /// The parent's path (`k_v.k2`), naming rules in errors, logs and metrics.
    path: String,
    /// Entry keys from the root down to the parent.
    keys: Vec<String>,
    hash_tag: Option<Arc<[Arc<str>]>>,
    /// The metric key's levels from the root down to the parent (`value_to_metric`).
    metric_levels: Vec<MetricLevel>,
}

struct Compiler<'a> {
    file: &'a Path,
    source: &'a str,
    errors: &'a mut Vec<ConfigError>,
    rules: Vec<Rule>,
}

impl Compiler<'_> {
    fn error(&mut self, line: u64, message: String) {
        self.errors
            .push(ConfigError::new(self.file, Some(line), message));
    }

    fn level(&mut self, scope: &Scope, descriptors: Vec<At<DescriptorYaml>>) -> Level {
        let mut level = Level::default();
        for spanned in descriptors {
            self.descriptor(scope, &mut level, spanned);
        }
        level
    }

    /// One descriptor into `level`: its node (the rule and the level below), under
    /// envoyproxy/ratelimit's identity, `key_value` or `key` for key-only.
    fn descriptor(&mut self, scope: &Scope, level: &mut Level, spanned: At<DescriptorYaml>) {
        let line = spanned.line;
        let mut d = spanned.value;
        let key = d.key.as_ref().map(|k| k.value.clone()).unwrap_or_default();
        let key_line = d.key.as_ref().map_or(line, |k| k.line);
        if key.is_empty() {
            self.error(key_line, "descriptor: 'key' must not be empty".to_owned());
            return;
        }
        let value = d
            .value
            .as_ref()
            .map(|v| v.value.clone())
            .unwrap_or_default();
        let final_key = if value.is_empty() {
            key.clone()
        } else {
            format!("{key}_{value}")
        };
        let mut keys = scope.keys.clone();
        keys.push(key.clone());
        let path = if scope.path.is_empty() {
            final_key.clone()
        } else {
            format!("{}.{final_key}", scope.path)
        };
        let what = format!("descriptor '{path}'");
        let hash_tag = match &d.hash_tag {
            Some(_) => self.hash_tag(d.hash_tag.as_ref(), &what, Some(&keys)),
            None => scope.hash_tag.clone(),
        };
        let share_threshold = self.share_threshold(&d, &value, &what, &final_key);
        let mut metric_levels = scope.metric_levels.clone();
        metric_levels.push(metric_level(&d, &value, share_threshold));
        let mut flags = self.flags(&mut d, &what, hash_tag.clone(), &metric_levels);
        flags.key_only = value.is_empty().then(|| key.clone());
        let rule = self.rule(&path, flags, &mut d, line);
        let child_scope = Scope {
            composite: format!("{}{final_key}.", scope.composite),
            path,
            keys,
            hash_tag,
            metric_levels,
        };
        let node = Node {
            rule,
            children: self.level(&child_scope, d.descriptors.unwrap_or_default()),
            share_threshold,
        };
        if !insert(level.keys.entry(key).or_default(), &value, node) {
            self.error(
                key_line,
                format!(
                    "duplicate descriptor composite key '{}{final_key}'",
                    scope.composite
                ),
            );
        }
    }

    /// `share_threshold`, which only a wildcard value can share.
    fn share_threshold(
        &mut self,
        d: &DescriptorYaml,
        value: &str,
        what: &str,
        final_key: &str,
    ) -> bool {
        let Some(share) = d.share_threshold.as_ref().filter(|s| s.value) else {
            return false;
        };
        if !value.contains('*') {
            self.error(
                share.line,
                format!(
                    "{what}: share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
                ),
            );
        }
        true
    }

    /// The descriptor-level settings its rule carries.
    fn flags(
        &mut self,
        d: &mut DescriptorYaml,
        what: &str,
        hash_tag: Option<Arc<[Arc<str>]>>,
        metric_levels: &[MetricLevel],
    ) -> RuleFlags {
        let (file, source) = (self.file, self.source);
        let mut tarpit_errors = Vec::new();
        let mut report = |line: u64, message: String| {
            tarpit_errors.push(ConfigError::new(file, Some(line), message))
        };
        let tarpit = response::tarpit(source, what, d.tarpit.take(), &mut report);
        self.errors.append(&mut tarpit_errors);
        RuleFlags {
            shadow_mode: d.shadow_mode.unwrap_or(false),
            quota_mode: d.quota_mode.unwrap_or(false),
            overdraft: d.overdraft.unwrap_or(false),
            detailed_metric: d.detailed_metric.unwrap_or(false),
            metric_levels: metric_levels
                .contains(&MetricLevel::RequestValue)
                .then(|| metric_levels.into()),
            metadata: metadata::convert(d.metadata.take()),
            hash_tag,
            tarpit,
            key_only: None,
            global: d.global.as_ref().filter(|g| g.value).map(|g| g.line),
        }
    }

    /// Validates a `hash_tag` list. At descriptor level every key must be on the
    /// descriptor's path, or the tag could never be formed.
    fn hash_tag(
        &mut self,
        spanned: Option<&At<Vec<String>>>,
        what: &str,
        path_keys: Option<&[String]>,
    ) -> Option<Arc<[Arc<str>]>> {
        let spanned = spanned?;
        let line = spanned.line;
        if spanned.value.is_empty() {
            self.error(
                line,
                format!("{what}: hash_tag must name at least one descriptor key"),
            );
            return None;
        }
        for key in &spanned.value {
            if key.is_empty() {
                self.error(line, format!("{what}: hash_tag keys must not be empty"));
            } else if let Some(path_keys) = path_keys
                && !path_keys.contains(key)
            {
                self.error(
                    line,
                    format!(
                        "{what}: hash_tag key '{key}' is not a key on this descriptor's path (expected one of {})",
                        path_keys.join(", ")
                    ),
                );
            }
        }
        Some(
            spanned
                .value
                .iter()
                .map(|k| Arc::from(k.as_str()))
                .collect(),
        )
    }
}

/// How a node appears in its rules' metric keys, as envoyproxy/ratelimit builds them:
/// `value_to_metric` puts the request's value where the config has none (key-only) or
/// only a pattern, except under `share_threshold`, where the pattern stays.
fn metric_level(d: &DescriptorYaml, value: &str, share_threshold: bool) -> MetricLevel {
    let wildcard = value.contains('*');
    if d.value_to_metric == Some(true) && (value.is_empty() || (wildcard && !share_threshold)) {
        MetricLevel::RequestValue
    } else if value.is_empty() {
        MetricLevel::KeyOnly
    } else {
        MetricLevel::Configured(value.into())
    }
}

/// Files the node under its value kind; false when that value is already taken.
fn insert(branch: &mut Branch, value: &str, node: Node) -> bool {
    if value.is_empty() {
        if branch.key_only.is_some() {
            return false;
        }
        branch.key_only = Some(Box::new(node));
        true
    } else if let Some(glob) = Glob::new(value) {
        if branch.wildcards.iter().any(|(g, _)| g.pattern() == value) {
            return false;
        }
        branch.wildcards.push((glob, node));
        true
    } else {
        match branch.exact.entry(value.to_owned()) {
            Entry::Occupied(_) => false,
            Entry::Vacant(slot) => {
                slot.insert(node);
                true
            }
        }
    }
}
