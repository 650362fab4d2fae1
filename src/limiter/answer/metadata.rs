//! The answer's `dynamic_metadata` as envoyproxy/ratelimit builds it when
//! `RESPONSE_DYNAMIC_METADATA` is on: the request (`domain`, each descriptor's
//! `entries` as `k=v`, its `limit` override and `hitsAddend`, the request's
//! `hitsAddend`) and, under `metadata`, the YAML `metadata` of every descriptor that
//! passed, merged in request order (the first value of a key wins; mappings merge
//! key by key). Built only when the setting is on: it allocates for every request.

use prost_types::{ListValue, Struct, Value, value::Kind};

use crate::config::Rule;
use crate::proto::{RateLimitDescriptor, RateLimitRequest};

/// `passed`: the rule of each descriptor answered OK (unlimited ones excluded, as
/// upstream leaves them out).
pub(super) fn build<'a>(
    request: &RateLimitRequest,
    passed: impl Iterator<Item = &'a Rule>,
) -> Struct {
    let mut fields = std::collections::BTreeMap::new();
    fields.insert("domain".to_owned(), text(&request.domain));
    let descriptors = request.descriptors.iter().map(descriptor).collect();
    fields.insert("descriptors".to_owned(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".to_owned(), number(request.hits_addend.into()));
    }
    let mut merged = Struct::default();
    for rule in passed {
        if let Some(metadata) = &rule.metadata {
            merge(&mut merged, &metadata.0);
        }
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_owned(), structure(merged));
    }
    Struct { fields }
}

fn descriptor(descriptor: &RateLimitDescriptor) -> Value {
    let mut fields = std::collections::BTreeMap::new();
    let entries = descriptor
        .entries
        .iter()
        .map(|e| text(&format!("{}={}", e.key, e.value)))
        .collect();
    fields.insert("entries".to_owned(), list(entries));
    if let Some(limit) = &descriptor.limit {
        // Go's text form of the override message, which upstream sends.
        let unit = crate::proto::rate_limit_response::rate_limit::Unit::try_from(limit.unit)
            .map_or_else(|_| limit.unit.to_string(), |u| u.as_str_name().to_owned());
        let text_form = format!("requests_per_unit:{} unit:{unit}", limit.requests_per_unit);
        fields.insert("limit".to_owned(), text(&text_form));
    }
    if let Some(hits) = descriptor.hits_addend {
        // A protobuf number is a double, as upstream's float64(...).
        fields.insert("hitsAddend".to_owned(), number(hits as f64));
    }
    structure(Struct { fields })
}

/// upstream's `mergeMetadata`: keys missing in `dest` are added; a key present in
/// both is merged when both values are mappings, else `dest` keeps its value.
fn merge(dest: &mut Struct, src: &Struct) {
    for (key, value) in &src.fields {
        match dest.fields.get_mut(key) {
            None => {
                dest.fields.insert(key.clone(), value.clone());
            }
            Some(Value {
                kind: Some(Kind::StructValue(inner)),
            }) => {
                if let Some(Kind::StructValue(other)) = &value.kind {
                    merge(inner, other);
                }
            }
            Some(_) => {}
        }
    }
}

fn text(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn structure(s: Struct) -> Value {
    Value {
        kind: Some(Kind::StructValue(s)),
    }
}
