//! One config file as a YAML tree with the line of every node: the first of the
//! loader's two passes.
//!
//! serde stops at the first error of a file, so a file with three mistakes would take
//! three rounds of `tollgate validate` to fix. The loader therefore reads a file in two
//! passes: serde-saphyr parses it into this tree ([`parse`]; anchors, aliases and the
//! parser's budget as usual), `super::keys` checks every key and value of the tree
//! against the schema, reporting each mistake and taking it out, and then the typed
//! schema (`super::schema`) is deserialized from what is left ([`from_tree`], through
//! `de.rs`), so the compiler still checks every value (units, algorithms, ...) of a
//! file that had unknown keys. [`At`] carries each value's line from the tree to the
//! compiler's messages.
//!
//! A scalar keeps its text as written (`007`, `yes`, `1.50`): where the schema wants
//! text, that is the text; where it wants a number or a boolean, serde-saphyr reads
//! that same text, so both passes convert exactly as a one-pass serde-saphyr parse
//! would.

mod de;

use std::fmt;

use serde::de::{self as serde_de, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

pub use de::{Error, from_tree};

/// A value and the line it is written on (1-based; 0 where no line is known).
#[derive(Debug, Clone, PartialEq)]
pub struct At<T> {
    pub value: T,
    pub line: u64,
}

/// The newtype name [`At`] asks a deserializer for; only `de.rs` answers it (with the
/// line, then the value), any other deserializer gives the value alone, at line 0.
pub(super) const AT: &str = "$tollgate::config::yaml::At";

impl<'de, T: Deserialize<'de>> Deserialize<'de> for At<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_newtype_struct(AT, AtVisitor(std::marker::PhantomData))
    }
}

struct AtVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for AtVisitor<T> {
    type Value = At<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value with its line")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<At<T>, A::Error> {
        let line = seq
            .next_element()?
            .ok_or_else(|| serde_de::Error::invalid_length(0, &self))?;
        let value = seq
            .next_element()?
            .ok_or_else(|| serde_de::Error::invalid_length(1, &self))?;
        Ok(At { value, line })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<At<T>, D::Error> {
        Ok(At {
            value: T::deserialize(d)?,
            line: 0,
        })
    }
}

/// One node of the tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Yaml {
    /// Where the node is used (an alias's line, not its anchor's).
    pub line: u64,
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Map(Vec<(Yaml, Yaml)>),
    Seq(Vec<Yaml>),
    Scalar(Scalar),
    /// `~`, `null`, or nothing after the colon: an absent value.
    Null,
}

/// A scalar as YAML typed it, and its text.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    pub kind: Kind,
    /// The value of a string; for anything else the characters as written.
    pub text: String,
    /// The characters as written, quotes included, when the parser knew where they
    /// are: what a number or a boolean is read from.
    pub source: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Str,
    Bool(bool),
    Int(i128),
    Float(f64),
}

impl Scalar {
    /// The text serde-saphyr reads a number or a boolean from.
    fn written(&self) -> &str {
        self.source.as_deref().unwrap_or(&self.text)
    }
}

impl Yaml {
    /// How a message names this value: `'text'`, or what it is.
    pub fn describe(&self) -> String {
        match &self.value {
            Value::Map(_) => "a mapping".to_owned(),
            Value::Seq(_) => "a list".to_owned(),
            Value::Scalar(s) => format!("'{}'", s.text),
            Value::Null => "nothing".to_owned(),
        }
    }

    /// A scalar read as `T` the way serde-saphyr reads it in place (`"5"`, `0x10`
    /// and `1_000` are numbers, `yes` and `"on"` booleans); `None` for anything else.
    pub fn read<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        match &self.value {
            Value::Scalar(s) => serde_saphyr::from_str(s.written()).ok(),
            _ => None,
        }
    }
}

/// `source` as a tree; the parser's error when it is not YAML.
pub fn parse(source: &str) -> Result<Yaml, serde_saphyr::Error> {
    let root: Spanned<Raw> = serde_saphyr::from_str(source)?;
    Ok(build(source, root))
}

fn build(source: &str, node: Spanned<Raw>) -> Yaml {
    let line = node.referenced.line();
    let value = match node.value {
        Raw::Map(entries) => Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| (build(source, k), build(source, v)))
                .collect(),
        ),
        Raw::Seq(items) => Value::Seq(items.into_iter().map(|i| build(source, i)).collect()),
        Raw::Null => Value::Null,
        Raw::Scalar(kind, text) => {
            // The definition's characters: an alias's own text is `*name`.
            let span = node.defined.span();
            let written = span
                .byte_offset()
                .zip(span.byte_len())
                .and_then(|(at, len)| {
                    let at = usize::try_from(at).ok()?;
                    source.get(at..at.checked_add(usize::try_from(len).ok()?)?)
                })
                .filter(|w| !w.is_empty())
                .map(str::to_owned);
            let text = match (kind, &written) {
                (Kind::Str, _) | (_, None) => text,
                (_, Some(w)) => w.clone(),
            };
            Value::Scalar(Scalar {
                kind,
                text,
                source: written,
            })
        }
    };
    Yaml { line, value }
}

/// What serde-saphyr hands a visitor that takes anything.
enum Raw {
    Map(Vec<(Spanned<Raw>, Spanned<Raw>)>),
    Seq(Vec<Spanned<Raw>>),
    /// The kind, and the text of a string (or the value printed, for the rest).
    Scalar(Kind, String),
    Null,
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: serde_de::Error>(self, v: bool) -> Result<Raw, E> {
        Ok(Raw::Scalar(Kind::Bool(v), v.to_string()))
    }
    fn visit_i64<E: serde_de::Error>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw::Scalar(Kind::Int(v.into()), v.to_string()))
    }
    fn visit_i128<E: serde_de::Error>(self, v: i128) -> Result<Raw, E> {
        Ok(Raw::Scalar(Kind::Int(v), v.to_string()))
    }
    fn visit_u64<E: serde_de::Error>(self, v: u64) -> Result<Raw, E> {
        Ok(Raw::Scalar(Kind::Int(v.into()), v.to_string()))
    }
    fn visit_u128<E: serde_de::Error>(self, v: u128) -> Result<Raw, E> {
        let v = i128::try_from(v).unwrap_or(i128::MAX);
        Ok(Raw::Scalar(Kind::Int(v), v.to_string()))
    }
    fn visit_f64<E: serde_de::Error>(self, v: f64) -> Result<Raw, E> {
        Ok(Raw::Scalar(Kind::Float(v), v.to_string()))
    }
    fn visit_str<E: serde_de::Error>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw::Scalar(Kind::Str, v.to_owned()))
    }
    fn visit_unit<E: serde_de::Error>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_none<E: serde_de::Error>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Raw, D::Error> {
        Raw::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Raw::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Raw::Map(entries))
    }
}

#[cfg(test)]
mod tests;
