//! The first pass's check: every unknown key and mistyped value of one file.
//!
//! It walks the file's tree (`super::yaml`) against the known keys of each mapping
//! ([`ROOT`], [`DESCRIPTOR`], [`RATE_LIMIT`] and theirs, the twins of `schema.rs`; a
//! test keeps the two in step), reports every mistake with its line, and takes each
//! out of the tree, so the typed parse and the compiler go on to check the rest of the
//! file:
//!
//! - an unknown key (or one that is not text) is removed with its value;
//! - a value of the wrong type stands in as a neutral one of the right type (a whole
//!   number as 1, text as `?`), so the checks that follow neither stop nor complain
//!   about it again (the loader drops what they say on a line already reported); a
//!   boolean, mapping or list of the wrong type is removed (absent is neutral there).
//!
//! Numbers and booleans are accepted as the typed parse reads them ([`Yaml::read`]),
//! so this pass never refuses what the typed parse would load.

use super::yaml::{Kind, Scalar, Value, Yaml};

/// What a value must look like.
enum Shape {
    /// Any scalar (the typed parse turns numbers and booleans into text too).
    Text,
    Bool,
    U32,
    /// A mapping with these keys.
    Map(&'static [(&'static str, &'static Shape)]),
    /// A sequence of this.
    List(&'static Shape),
    /// A mapping of anything (`metadata`: arbitrary, as upstream leaves it unchecked).
    AnyMap,
}

static TEXT: Shape = Shape::Text;
static BOOL: Shape = Shape::Bool;
static U32: Shape = Shape::U32;
static TEXTS: Shape = Shape::List(&TEXT);
static REPLACES: Shape = Shape::List(&Shape::Map(&[("name", &TEXT)]));
static LEAKY_BUCKET: Shape = Shape::Map(&[("max_delay", &TEXT)]);
static TARPIT: Shape = Shape::Map(&[("delay", &TEXT), ("max_concurrent", &U32)]);
static RAW_BODY: Shape = Shape::Map(&[("body", &TEXT), ("content_type", &TEXT)]);
static ANY_MAP: Shape = Shape::AnyMap;

static RATE_LIMIT: Shape = Shape::Map(&[
    ("requests_per_unit", &U32),
    ("unit", &TEXT),
    ("unlimited", &BOOL),
    ("name", &TEXT),
    ("replaces", &REPLACES),
    ("algorithm", &TEXT),
    ("unit_multiplier", &U32),
    ("burst", &U32),
    ("leaky_bucket", &LEAKY_BUCKET),
    ("time_zone", &TEXT),
    ("lease", &TEXT),
    ("lease_key", &TEXT),
]);
static RATE_LIMITS: Shape = Shape::List(&RATE_LIMIT);
static DESCRIPTORS: Shape = Shape::List(&DESCRIPTOR);
static DESCRIPTOR: Shape = Shape::Map(&[
    ("key", &TEXT),
    ("value", &TEXT),
    ("rate_limit", &RATE_LIMIT),
    ("rate_limits", &RATE_LIMITS),
    ("descriptors", &DESCRIPTORS),
    ("shadow_mode", &BOOL),
    ("quota_mode", &BOOL),
    ("overdraft", &BOOL),
    ("detailed_metric", &BOOL),
    ("share_threshold", &BOOL),
    ("value_to_metric", &BOOL),
    ("metadata", &ANY_MAP),
    ("hash_tag", &TEXTS),
    ("tarpit", &TARPIT),
    ("global", &BOOL),
]);
static ROOT: Shape = Shape::Map(&[
    ("domain", &TEXT),
    ("descriptors", &DESCRIPTORS),
    ("hash_tag", &TEXTS),
    ("raw_body", &RAW_BODY),
    ("failure_mode", &TEXT),
]);

/// Every unknown key and mistyped value of the tree, as (line, message); each is taken
/// out of the tree (see the module's doc).
pub fn check(root: &mut Yaml) -> Vec<(u64, String)> {
    let mut found = Vec::new();
    if !fits(root, &ROOT, "", &mut found) {
        root.value = Value::Map(Vec::new());
    }
    found
}

/// Checks `node` against `shape`; false when `node` is of the wrong type and must be
/// replaced or removed by its parent ([`stand_in`]).
fn fits(node: &mut Yaml, shape: &Shape, field: &str, found: &mut Vec<(u64, String)>) -> bool {
    // An empty value is an absent one, as the typed parse's `Option`s read it.
    if matches!(node.value, Value::Null) {
        return true;
    }
    let expected = match (shape, &mut node.value) {
        (Shape::Bool, _) => match node.read::<bool>() {
            Some(_) => return true,
            None => "true or false",
        },
        (Shape::U32, _) => match node.read::<u32>() {
            Some(_) => return true,
            None => "a whole number from 0 to 4294967295",
        },
        (Shape::Text, Value::Scalar(_)) => return true,
        (Shape::Text, _) => "text",
        (Shape::AnyMap, Value::Map(_)) => return true,
        (Shape::AnyMap, _) => "a mapping",
        (Shape::List(item), Value::Seq(items)) => {
            items.retain_mut(|one| fits(one, item, field, found) || stand_in(one, item));
            return true;
        }
        (Shape::List(_), _) => "a list",
        (Shape::Map(keys), Value::Map(entries)) => {
            entries.retain_mut(|(key, value)| entry(keys, key, value, found));
            return true;
        }
        (Shape::Map(_), _) => "a mapping",
    };
    let got = node.describe();
    // The file itself has no field name.
    let field = if field.is_empty() { "the file" } else { field };
    found.push((
        node.line,
        format!("{field}: expected {expected} (got {got})"),
    ));
    false
}

/// One entry of a mapping whose keys are `keys`; false when it is to be removed.
fn entry(
    keys: &[(&str, &Shape)],
    key: &Yaml,
    value: &mut Yaml,
    found: &mut Vec<(u64, String)>,
) -> bool {
    let name = match &key.value {
        Value::Scalar(s) if matches!(s.kind, Kind::Str) => &s.text,
        // upstream's words (`validateYamlKeys`), naming the value: a key written
        // `0.25:` is a number to YAML, not the text "0.25".
        other => {
            let what = match other {
                Value::Scalar(s) => s.text.clone(),
                Value::Null => "null".to_owned(),
                _ => key.describe(),
            };
            found.push((key.line, format!("key is not of type string: {what}")));
            return false;
        }
    };
    match keys.iter().find(|(k, _)| k == name) {
        Some((k, shape)) => fits(value, shape, k, found) || stand_in(value, shape),
        None => {
            let known: Vec<&str> = keys.iter().map(|(k, _)| *k).collect();
            let message = format!(
                "unknown key '{name}' (expected one of {})",
                known.join(", ")
            );
            found.push((key.line, message));
            false
        }
    }
}

/// Replaces a value of the wrong type by a neutral one of `shape`'s type; false when
/// absence is neutral (the value is then removed).
fn stand_in(node: &mut Yaml, shape: &Shape) -> bool {
    let (kind, text) = match shape {
        Shape::U32 => (Kind::Int(1), "1"),
        Shape::Text => (Kind::Str, "?"),
        _ => return false,
    };
    node.value = Value::Scalar(Scalar {
        kind,
        text: text.to_owned(),
        source: None,
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::yaml;

    fn check(source: &str) -> Option<Vec<(u64, String)>> {
        Some(super::check(&mut yaml::parse(source).ok()?))
    }

    #[test]
    fn three_mistakes_give_three_errors_with_their_lines() {
        let yaml = "domain: d
descriptorz: []
descriptors:
  - key: a
    quota_mod: true
    rate_limit:
      unit: second
      requests_per_unit: ten
";
        let found = check(yaml).unwrap();
        let lines: Vec<u64> = found.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, [2, 5, 8], "{found:#?}");
        assert!(
            found[0].1.contains("unknown key 'descriptorz'"),
            "{found:#?}"
        );
        assert!(found[1].1.contains("unknown key 'quota_mod'"), "{found:#?}");
        assert!(found[2].1.starts_with("requests_per_unit:"), "{found:#?}");
    }

    #[test]
    fn every_upstream_key_and_arbitrary_metadata_pass() {
        let yaml = "domain: d
descriptors:
  - key: a
    value: b
    shadow_mode: false
    quota_mode: true
    detailed_metric: true
    value_to_metric: true
    metadata:
      anything: [1, {nested: x}]
      unknown_key_here: ~
    rate_limit:
      unit: second
      requests_per_unit: 5
      name: n
      replaces:
        - name: m
    descriptors:
      - key: c
        value: x*
        share_threshold: true
        rate_limit:
          unlimited: true
";
        assert_eq!(check(yaml).unwrap(), []);
    }

    #[test]
    fn wrong_shapes_are_named() {
        let yaml = "domain: d
descriptors:
  key: a
";
        let found = check(yaml).unwrap();
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].1.contains("descriptors: expected a list"),
            "{found:#?}"
        );
        let yaml = "domain: d\ndescriptors:\n  - key: a\n    metadata: 5\n    shadow_mode: maybe\n    quota_mode: \"true\"\n";
        let found = check(yaml).unwrap();
        assert_eq!(found.len(), 2, "{found:#?}");
    }

    #[test]
    fn a_key_that_is_not_text_is_named_by_its_value() {
        let yaml = "domain: d\n0.25: x\ndescriptors:\n  - key: a\n    7: y\n    true: z\n";
        let found = check(yaml).unwrap();
        let messages: Vec<&str> = found.iter().map(|(_, m)| m.as_str()).collect();
        assert_eq!(
            messages,
            [
                "key is not of type string: 0.25",
                "key is not of type string: 7",
                "key is not of type string: true",
            ],
            "{found:#?}"
        );
        assert_eq!(found[0].0, 2);
    }

    #[test]
    fn mistakes_are_taken_out_and_wrong_types_stand_in_as_neutral_values() {
        let source = "domain: d
descriptors:
  - key: [a]
    rate_limt: {unit: second}
    shadow_mode: maybe
    rate_limit:
      unit: second
      requests_per_unit: ten
";
        let mut tree = yaml::parse(source).unwrap();
        assert_eq!(super::check(&mut tree).len(), 4);
        let clean = yaml::parse(
            "domain: d
descriptors:
  - key: '?'
    rate_limit:
      unit: second
      requests_per_unit: 1
",
        )
        .unwrap();
        // Lines differ; the keys and values left must not.
        assert_eq!(plain(&tree), plain(&clean));
        assert_eq!(
            plain(&tree),
            "{domain: d, descriptors: [{key: ?, rate_limit: {unit: second, requests_per_unit: 1}}]}"
        );
    }

    /// The tree's keys and values, without lines.
    fn plain(y: &yaml::Yaml) -> String {
        match &y.value {
            Value::Map(entries) => {
                let all: Vec<String> = entries
                    .iter()
                    .map(|(k, v)| format!("{}: {}", plain(k), plain(v)))
                    .collect();
                format!("{{{}}}", all.join(", "))
            }
            Value::Seq(items) => {
                let all: Vec<String> = items.iter().map(plain).collect();
                format!("[{}]", all.join(", "))
            }
            Value::Scalar(s) => s.text.clone(),
            Value::Null => "~".to_owned(),
        }
    }

    /// Every mapping's keys here are the fields of its type in schema.rs: a key known
    /// only there would be refused here, and one known only here by the typed parse.
    #[test]
    fn the_known_keys_are_the_schema_fields() {
        use crate::config::schema::*;
        let pairs: [(&Shape, Vec<&str>); 7] = [
            (&ROOT, fields::<DomainYaml>()),
            (&DESCRIPTOR, fields::<DescriptorYaml>()),
            (&RATE_LIMIT, fields::<RateLimitYaml>()),
            (&TARPIT, fields::<TarpitYaml>()),
            (&LEAKY_BUCKET, fields::<LeakyBucketYaml>()),
            (&RAW_BODY, fields::<RawBodyYaml>()),
            (
                match &REPLACES {
                    Shape::List(item) => item,
                    _ => unreachable!("replaces is a list"),
                },
                fields::<ReplacesYaml>(),
            ),
        ];
        for (shape, schema) in pairs {
            let Shape::Map(keys) = shape else {
                panic!("not a mapping")
            };
            let known: Vec<&str> = keys.iter().map(|(k, _)| *k).collect();
            assert_eq!(known, schema);
        }
    }

    /// The field names serde's derive hands `deserialize_struct` for `T`.
    fn fields<T: serde::de::DeserializeOwned>() -> Vec<&'static str> {
        use serde::de::{Deserializer, Error as _, Visitor, value::Error};
        struct Grab<'a>(&'a mut &'static [&'static str]);
        impl<'de> Deserializer<'de> for Grab<'_> {
            type Error = Error;
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
                Err(Error::custom("only structs"))
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Error> {
                *self.0 = fields;
                Err(Error::custom("grabbed"))
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
                byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
                enum identifier ignored_any
            }
        }
        let mut fields: &'static [&'static str] = &[];
        let _ = T::deserialize(Grab(&mut fields));
        fields.to_vec()
    }
}
