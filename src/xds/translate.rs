//! `RateLimitConfig` resources into the config set the file path serves.
//!
//! Each resource is rendered as the YAML document envoyproxy/ratelimit's own converter
//! (`ConfigXdsProtoToYaml`) builds from it, written as JSON (a subset of YAML), and
//! that set of documents goes through [`crate::config::load_documents`]: the parse, the
//! key checks and the compile step are the file path's, so a resource compiles to
//! exactly what the same limits in a file compile to, and is refused for exactly the
//! same reasons. The resource name plays the file name in errors; lines are dropped,
//! since they would point into a document nobody wrote.
//!
//! tollgate's extensions travel in descriptor `metadata` under `tollgate.` keys
//! ([`super::extensions`]).

use std::path::Path;

use prost::Message;
use serde_json::{Map, Value as Json, json};

use super::extensions::{self, Extensions};
use crate::config::{self, Config, ConfigError, ConfigErrors};
use crate::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

/// The type URL of envoyproxy/ratelimit's resource (what the client subscribes to).
pub const RATE_LIMIT_CONFIG_TYPE: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Decodes and compiles a whole response's resources as one config set; every error
/// of every resource is returned.
pub fn compile(resources: &[prost_types::Any]) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    let mut documents = Vec::with_capacity(resources.len());
    for (index, any) in resources.iter().enumerate() {
        match document(index, any) {
            Ok(doc) => documents.push(doc),
            Err(e) => errors.push(e),
        }
    }
    let sources: Vec<(&Path, &str)> = documents
        .iter()
        .map(|(name, text)| (Path::new(name.as_str()), text.as_str()))
        .collect();
    match config::load_documents(&sources) {
        Ok(config) if errors.is_empty() => Ok(config),
        Ok(_) => Err(ConfigErrors(errors)),
        Err(ConfigErrors(more)) => {
            errors.extend(more);
            Err(ConfigErrors(errors))
        }
    }
}

/// Whether an `Any`'s type URL names RateLimitConfig. Like Go's `anypb.UnmarshalTo`,
/// only the full message name after the last '/' counts: the host part before it is
/// free (`type.googleapis.com/` by convention, but a control plane may use another).
fn same_type(type_url: &str) -> bool {
    let name = |url: &str| url.rsplit('/').next().unwrap_or_default().to_owned();
    name(type_url) == name(RATE_LIMIT_CONFIG_TYPE)
}

/// One resource as (name, YAML document), or why it cannot be one.
fn document(index: usize, any: &prost_types::Any) -> Result<(String, String), ConfigError> {
    let fallback = format!("resource #{index}");
    if !same_type(&any.type_url) {
        return Err(ConfigError::new(
            Path::new(&fallback),
            None,
            format!(
                "unexpected resource type '{}' (expected {RATE_LIMIT_CONFIG_TYPE})",
                any.type_url
            ),
        ));
    }
    let resource = RateLimitConfig::decode(any.value.as_slice()).map_err(|e| {
        ConfigError::new(
            Path::new(&fallback),
            None,
            format!("cannot decode RateLimitConfig: {e}"),
        )
    })?;
    let name = if resource.name.is_empty() {
        fallback
    } else {
        resource.name.clone()
    };
    let yaml = to_yaml(&resource).map_err(|m| ConfigError::new(Path::new(&name), None, m))?;
    let text = serde_json::to_string_pretty(&yaml)
        .map_err(|e| ConfigError::new(Path::new(&name), None, e.to_string()))?;
    Ok((name, text))
}

/// The YAML schema's mapping for one resource (see `crate::config::schema`).
pub fn to_yaml(resource: &RateLimitConfig) -> Result<Json, String> {
    let mut root = Map::new();
    root.insert("domain".into(), json!(resource.domain));
    let mut domain_extensions = Map::new();
    let descriptors = descriptors(&resource.descriptors, 0, &mut domain_extensions)?;
    if !descriptors.is_empty() {
        root.insert("descriptors".into(), Json::Array(descriptors));
    }
    root.extend(domain_extensions);
    Ok(Json::Object(root))
}

fn descriptors(
    list: &[RateLimitDescriptor],
    depth: usize,
    domain: &mut Map<String, Json>,
) -> Result<Vec<Json>, String> {
    list.iter().map(|d| descriptor(d, depth, domain)).collect()
}

fn descriptor(
    d: &RateLimitDescriptor,
    depth: usize,
    domain: &mut Map<String, Json>,
) -> Result<Json, String> {
    let what = if d.value.is_empty() {
        format!("descriptor '{}'", d.key)
    } else {
        format!("descriptor '{}_{}'", d.key, d.value)
    };
    let metadata = d.metadata.clone().map(extensions::struct_to_json);
    let Extensions {
        rate_limit: rate_limit_extras,
        descriptor: descriptor_extras,
        domain: domain_extras,
        metadata,
    } = extensions::split(metadata).map_err(|e| format!("{what}: {e}"))?;
    if !domain_extras.is_empty() {
        if depth > 0 {
            return Err(format!(
                "{what}: metadata: tollgate.domain.* keys belong on a first-level descriptor"
            ));
        }
        for (key, value) in domain_extras {
            if domain.get(&key).is_some_and(|seen| *seen != value) {
                return Err(format!(
                    "{what}: metadata: tollgate.domain.{key} differs from another descriptor's"
                ));
            }
            domain.insert(key, value);
        }
    }
    let mut out = Map::new();
    out.insert("key".into(), json!(d.key));
    if !d.value.is_empty() {
        out.insert("value".into(), json!(d.value));
    }
    match &d.rate_limit {
        Some(policy) => {
            let mut limit = rate_limit(policy);
            // A policy always names a unit, but a lease is the window of a rule that
            // takes one: `tollgate.lease` replaces it (the YAML allows one or the other).
            if rate_limit_extras.contains_key("lease") {
                limit.remove("unit");
            }
            limit.extend(rate_limit_extras);
            out.insert("rate_limit".into(), Json::Object(limit));
        }
        None if !rate_limit_extras.is_empty() => {
            let keys: Vec<String> = rate_limit_extras
                .keys()
                .map(|k| format!("tollgate.{k}"))
                .collect();
            return Err(format!(
                "{what}: metadata: {} set without a rate_limit",
                keys.join(", ")
            ));
        }
        None => {}
    }
    let children = descriptors(&d.descriptors, depth + 1, domain)?;
    if !children.is_empty() {
        out.insert("descriptors".into(), Json::Array(children));
    }
    // proto3 booleans cannot be absent: false is the YAML default, so only true is said.
    for (field, set) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if set {
            out.insert(field.into(), Json::Bool(true));
        }
    }
    if !metadata.is_empty() {
        out.insert("metadata".into(), Json::Object(metadata));
    }
    out.extend(descriptor_extras);
    Ok(Json::Object(out))
}

/// A policy as upstream's converter writes it: `unit` is its enum name, so UNKNOWN on a
/// limited policy is refused by the unit check, and a unit on an unlimited one too.
fn rate_limit(policy: &RateLimitPolicy) -> Map<String, Json> {
    let mut out = Map::new();
    let unit = RateLimitUnit::try_from(policy.unit).unwrap_or(RateLimitUnit::Unknown);
    if unit != RateLimitUnit::Unknown || !policy.unlimited {
        out.insert("unit".into(), json!(unit.as_str_name()));
    }
    if !policy.unlimited || policy.requests_per_unit != 0 {
        out.insert("requests_per_unit".into(), json!(policy.requests_per_unit));
    }
    if policy.unlimited {
        out.insert("unlimited".into(), Json::Bool(true));
    }
    if !policy.name.is_empty() {
        out.insert("name".into(), json!(policy.name));
    }
    if !policy.replaces.is_empty() {
        let replaces = policy
            .replaces
            .iter()
            .map(|r| json!({ "name": r.name }))
            .collect();
        out.insert("replaces".into(), Json::Array(replaces));
    }
    out
}

#[cfg(test)]
#[path = "translate_tests.rs"]
mod tests;
