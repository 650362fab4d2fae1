//! Validation of one parsed file into a [`Domain`]: every rule of envoyproxy/ratelimit's
//! loader, each error naming the file, the line and the descriptor it concerns.

use std::collections::hash_map::Entry;
use std::path::Path;
use std::sync::Arc;

use serde_saphyr::Spanned;

use super::error::ConfigError;
use super::glob::Glob;
use super::rule::{Limit, Rule, RuleKind, Unit};
use super::schema::{DescriptorYaml, DomainYaml, RateLimitYaml};
use super::tree::{Domain, Level, Node};

/// Compiles one file's contents. Errors are appended to `errors`; a domain comes back
/// only when the file had none.
pub fn compile_domain(
    file: &Path,
    yaml: DomainYaml,
    errors: &mut Vec<ConfigError>,
) -> Option<Domain> {
    let before = errors.len();
    let name = match &yaml.domain {
        Some(d) if !d.value.is_empty() => d.value.clone(),
        Some(d) => {
            errors.push(ConfigError::new(
                file,
                Some(d.referenced.line()),
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
        errors,
        rules: Vec::new(),
    };
    let root = compiler.level(
        &format!("{name}."),
        "",
        yaml.descriptors.unwrap_or_default(),
    );
    let rules = compiler.rules;
    (errors.len() == before).then(|| Domain {
        name: name.into(),
        root,
        rules,
    })
}

struct Compiler<'a> {
    file: &'a Path,
    errors: &'a mut Vec<ConfigError>,
    rules: Vec<Rule>,
}

impl Compiler<'_> {
    fn error(&mut self, line: u64, message: String) {
        self.errors
            .push(ConfigError::new(self.file, Some(line), message));
    }

    /// `composite` is envoyproxy/ratelimit's composite key of the parent (`domain.k_v.`),
    /// used in duplicate errors; `path` is the parent's path for rule names in logs.
    fn level(
        &mut self,
        composite: &str,
        path: &str,
        descriptors: Vec<Spanned<DescriptorYaml>>,
    ) -> Level {
        let mut level = Level::default();
        for spanned in descriptors {
            let line = spanned.referenced.line();
            let d = spanned.value;
            let key = d.key.as_ref().map(|k| k.value.clone()).unwrap_or_default();
            let key_line = d.key.as_ref().map_or(line, |k| k.referenced.line());
            if key.is_empty() {
                self.error(key_line, "descriptor: 'key' must not be empty".to_owned());
                continue;
            }
            let value = d
                .value
                .as_ref()
                .map(|v| v.value.clone())
                .unwrap_or_default();
            // envoyproxy/ratelimit's node identity: `key_value`, or `key` for key-only.
            let final_key = if value.is_empty() {
                key.clone()
            } else {
                format!("{key}_{value}")
            };
            let node_composite = format!("{composite}{final_key}");
            let node_path = if path.is_empty() {
                final_key.clone()
            } else {
                format!("{path}.{final_key}")
            };

            let rule = d
                .rate_limit
                .map(|rl| self.rule(&node_path, &d.shadow_mode, &d.detailed_metric, rl));
            if let Some(share) = &d.share_threshold
                && share.value
                && !value.contains('*')
            {
                self.error(
                    share.referenced.line(),
                    format!(
                        "descriptor '{node_path}': share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
                    ),
                );
            }
            let children = self.level(
                &format!("{node_composite}."),
                &node_path,
                d.descriptors.unwrap_or_default(),
            );
            let node = Node {
                rule: rule.flatten(),
                children,
                share_threshold: d.share_threshold.as_ref().is_some_and(|s| s.value),
            };

            let branch = level.keys.entry(key.clone()).or_default();
            let duplicate = if value.is_empty() {
                let taken = branch.key_only.is_some();
                if !taken {
                    branch.key_only = Some(Box::new(node));
                }
                taken
            } else if let Some(glob) = Glob::new(&value) {
                let taken = branch.wildcards.iter().any(|(g, _)| g.pattern() == value);
                if !taken {
                    branch.wildcards.push((glob, node));
                }
                taken
            } else {
                match branch.exact.entry(value.clone()) {
                    Entry::Occupied(_) => true,
                    Entry::Vacant(slot) => {
                        slot.insert(node);
                        false
                    }
                }
            };
            if duplicate {
                self.error(
                    key_line,
                    format!("duplicate descriptor composite key '{node_composite}'"),
                );
            }
        }
        level
    }

    fn rule(
        &mut self,
        path: &str,
        shadow_mode: &Option<bool>,
        detailed_metric: &Option<bool>,
        spanned: Spanned<RateLimitYaml>,
    ) -> Option<Rule> {
        let line = spanned.referenced.line();
        let rl = spanned.value;
        let unlimited = rl.unlimited.unwrap_or(false);
        let name = rl
            .name
            .as_ref()
            .map(|n| n.value.clone())
            .filter(|n| !n.is_empty());
        let mut ok = true;

        let kind = if unlimited {
            if let Some(unit) = &rl.unit {
                self.error(
                    unit.referenced.line(),
                    format!("descriptor '{path}': rate_limit.unit: should not specify rate limit unit when unlimited"),
                );
                ok = false;
            }
            RuleKind::Unlimited
        } else {
            let (unit_text, unit_line) = match &rl.unit {
                Some(u) => (u.value.as_str(), u.referenced.line()),
                None => ("", line),
            };
            match Unit::parse(unit_text) {
                Some(unit) => RuleKind::Limited(Limit {
                    requests_per_unit: rl.requests_per_unit.as_ref().map_or(0, |r| r.value),
                    unit,
                }),
                None => {
                    let expected: Vec<&str> = Unit::ALL.iter().map(|(_, n)| *n).collect();
                    self.error(
                        unit_line,
                        format!(
                            "descriptor '{path}': rate_limit.unit: invalid rate limit unit '{unit_text}' (expected one of {})",
                            expected.join(", ")
                        ),
                    );
                    return None;
                }
            }
        };

        let mut replaces = Vec::new();
        for r in rl.replaces.unwrap_or_default() {
            let r_line = r.referenced.line();
            match r.value.name.filter(|n| !n.is_empty()) {
                None => {
                    self.error(r_line, format!("descriptor '{path}': rate_limit.replaces: should not have an empty replaces entry"));
                    ok = false;
                }
                Some(replaced) if Some(&replaced) == name.as_ref() => {
                    self.error(
                        r_line,
                        format!(
                            "descriptor '{path}': rate_limit.replaces: replaces should not contain name of same descriptor ('{replaced}')"
                        ),
                    );
                    ok = false;
                }
                Some(replaced) => replaces.push(Arc::from(replaced)),
            }
        }

        let rule = Rule {
            path: path.into(),
            name: name.map(Arc::from),
            kind,
            replaces,
            shadow_mode: shadow_mode.unwrap_or(false),
            detailed_metric: detailed_metric.unwrap_or(false),
        };
        self.rules.push(rule.clone());
        ok.then_some(rule)
    }
}
