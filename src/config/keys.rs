//! Every unknown key and mistyped value of one file, found before the typed parse.
//!
//! serde stops at the first error of a file, so a file with three mistakes would take
//! three rounds of `tollgate validate` to fix. This pass reads the file as a generic
//! YAML tree with the line of every key and value, and walks it against the known keys
//! of each mapping ([`ROOT`], [`DESCRIPTOR`], [`RATE_LIMIT`] and theirs, the twins of
//! `schema.rs`). Its checks are deliberately loose where the typed parse might accept
//! (any scalar for a text field), so it never refuses what the typed parse would load;
//! whatever it misses, the typed parse still reports (one error, as before).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

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
]);
static ROOT: Shape = Shape::Map(&[
    ("domain", &TEXT),
    ("descriptors", &DESCRIPTORS),
    ("hash_tag", &TEXTS),
    ("raw_body", &RAW_BODY),
    ("failure_mode", &TEXT),
]);

/// A YAML value of any shape, with the line of every part.
enum Node {
    Map(Vec<(Spanned<Node>, Spanned<Node>)>),
    Seq(Vec<Spanned<Node>>),
    Bool(bool),
    Int(i128),
    Float(f64),
    Text(String),
    Null,
}

/// Every unknown key and mistyped value of `source`, as (line, message). `None` when
/// the file is not YAML at all (the typed parse then says why).
pub fn check(source: &str) -> Option<Vec<(u64, String)>> {
    let root: Spanned<Node> = serde_saphyr::from_str(source).ok()?;
    let mut found = Vec::new();
    walk(&root, &ROOT, "", &mut found);
    Some(found)
}

fn walk(node: &Spanned<Node>, shape: &Shape, field: &str, found: &mut Vec<(u64, String)>) {
    let line = node.referenced.line();
    let mut wrong = |expected: &str| {
        let got = match &node.value {
            Node::Map(_) => "a mapping".to_owned(),
            Node::Seq(_) => "a list".to_owned(),
            Node::Text(t) => format!("'{t}'"),
            Node::Bool(b) => format!("'{b}'"),
            Node::Int(i) => format!("'{i}'"),
            Node::Float(_) => "a decimal number".to_owned(),
            Node::Null => "nothing".to_owned(),
        };
        found.push((line, format!("{field}: expected {expected} (got {got})")));
    };
    match (shape, &node.value) {
        // An empty value is an absent one, as the typed parse's `Option`s read it.
        (_, Node::Null) => {}
        (Shape::Text, Node::Map(_) | Node::Seq(_)) => wrong("text"),
        (Shape::Text, _) => {}
        (Shape::Bool, Node::Bool(_)) => {}
        // A quoted `"true"` is a string to YAML, yet the typed parse accepts it.
        (Shape::Bool, Node::Text(t)) if is_bool_text(t) => {}
        (Shape::Bool, _) => wrong("true or false"),
        (Shape::U32, Node::Int(i)) if u32::try_from(*i).is_ok() => {}
        (Shape::U32, Node::Text(t)) if t.trim().parse::<u32>().is_ok() => {}
        (Shape::U32, _) => wrong("a whole number from 0 to 4294967295"),
        (Shape::AnyMap, Node::Map(_)) => {}
        (Shape::AnyMap, _) => wrong("a mapping"),
        (Shape::List(item), Node::Seq(items)) => {
            for one in items {
                walk(one, item, field, found);
            }
        }
        (Shape::List(_), _) => wrong("a list"),
        (Shape::Map(keys), Node::Map(entries)) => {
            for (key, value) in entries {
                let Node::Text(name) = &key.value else {
                    // upstream's words (`validateYamlKeys`), naming the value: a key
                    // written `0.25:` is a number to YAML, not the text "0.25".
                    let what = key_text(&key.value);
                    let message = format!("key is not of type string: {what}");
                    found.push((key.referenced.line(), message));
                    continue;
                };
                match keys.iter().find(|(k, _)| *k == name) {
                    Some((k, shape)) => walk(value, shape, k, found),
                    None => {
                        let known: Vec<&str> = keys.iter().map(|(k, _)| *k).collect();
                        found.push((
                            key.referenced.line(),
                            format!(
                                "unknown key '{name}' (expected one of {})",
                                known.join(", ")
                            ),
                        ));
                    }
                }
            }
        }
        (Shape::Map(_), _) => wrong("a mapping"),
    }
}

fn is_bool_text(text: &str) -> bool {
    let spellings = ["true", "false", "yes", "no", "on", "off"];
    spellings
        .iter()
        .any(|s| text.trim().eq_ignore_ascii_case(s))
}

/// A key that is not text, as upstream's `%v` prints it: the value itself.
fn key_text(node: &Node) -> String {
    match node {
        Node::Text(t) => t.clone(),
        Node::Bool(b) => b.to_string(),
        Node::Int(i) => i.to_string(),
        Node::Float(f) => f.to_string(),
        Node::Null => "null".to_owned(),
        Node::Map(_) => "a mapping".to_owned(),
        Node::Seq(_) => "a list".to_owned(),
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Node, E> {
        Ok(Node::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Node, E> {
        Ok(Node::Int(i128::try_from(v).unwrap_or(i128::MAX)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Text(v.to_owned()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Node::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::check;

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
}
