//! A descriptor's `metadata` mapping into the protobuf `Struct` the answer carries, as
//! envoyproxy/ratelimit converts it (`structpb.NewStruct`): numbers become doubles,
//! nested mappings structs, sequences lists, `~` null. Converted once at load so the
//! request path only clones a reference.

use std::sync::Arc;

use crate::config::yaml::At;
use prost_types::{ListValue, Struct, Value, value::Kind};
use serde_json::{Map, Value as Json};

use crate::config::rule::Metadata;

/// `None` for an absent or empty mapping (upstream attaches nothing then either).
pub fn convert(yaml: Option<At<Map<String, Json>>>) -> Option<Metadata> {
    let map = yaml?.value;
    (!map.is_empty()).then(|| Metadata(Arc::new(to_struct(map))))
}

/// A JSON object as a protobuf `Struct`.
pub fn to_struct(map: Map<String, Json>) -> Struct {
    Struct {
        fields: map.into_iter().map(|(k, v)| (k, to_value(v))).collect(),
    }
}

fn to_value(json: Json) -> Value {
    let kind = match json {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Json::String(s) => Kind::StringValue(s),
        Json::Array(items) => Kind::ListValue(ListValue {
            values: items.into_iter().map(to_value).collect(),
        }),
        Json::Object(map) => Kind::StructValue(to_struct(map)),
    };
    Value { kind: Some(kind) }
}
