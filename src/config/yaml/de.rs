//! The typed schema deserialized from a [`Yaml`] tree: the loader's second pass.
//!
//! A serde `Deserializer` over the tree, which `super::keys` has already checked and
//! cleared of every mistake it found; what this still refuses (a key or a type the
//! first pass did not know of) is an [`Error`] with the node's line. Text is the
//! scalar's text; numbers and booleans are read by serde-saphyr from the scalar as
//! written ([`Yaml::read`]), so they convert as a one-pass parse would. [`super::At`]
//! gets the node's line.

use std::fmt;

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};

use super::{AT, Kind, Value, Yaml};

/// Why the typed pass refused a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The line of the node at fault, when one is known.
    pub line: Option<u64>,
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(message: T) -> Self {
        Error {
            line: None,
            message: message.to_string(),
        }
    }
}

/// `T` from `tree`.
pub fn from_tree<T: DeserializeOwned>(tree: &Yaml) -> Result<T, Error> {
    T::deserialize(Node(tree))
}

/// One node as a deserializer.
#[derive(Clone, Copy)]
struct Node<'a>(&'a Yaml);

impl Node<'_> {
    /// An error without a line gets this node's.
    fn here<T>(&self, result: Result<T, Error>) -> Result<T, Error> {
        result.map_err(|mut e| {
            e.line.get_or_insert(self.0.line);
            e
        })
    }

    fn wrong(&self, expected: &str) -> Error {
        Error {
            line: Some(self.0.line),
            message: format!("expected {expected} (got {})", self.0.describe()),
        }
    }

    /// A number or a boolean, as serde-saphyr reads the scalar.
    fn read<T: DeserializeOwned>(&self, what: &str) -> Result<T, Error> {
        self.0.read().ok_or_else(|| self.wrong(what))
    }
}

macro_rules! read_as {
    ($($method:ident $visit:ident $ty:ty, $what:literal;)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            let value: $ty = self.read($what)?;
            self.here(visitor.$visit(value))
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Node<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let result = match &self.0.value {
            Value::Map(entries) => visitor.visit_map(Entries::new(entries, None)),
            Value::Seq(items) => visitor.visit_seq(Items(items.iter())),
            Value::Null => visitor.visit_unit(),
            Value::Scalar(s) => match s.kind {
                Kind::Str => visitor.visit_str(&s.text),
                Kind::Bool(b) => visitor.visit_bool(b),
                Kind::Int(i) => match i64::try_from(i) {
                    Ok(i) => visitor.visit_i64(i),
                    Err(_) => visitor.visit_i128(i),
                },
                Kind::Float(f) => visitor.visit_f64(f),
            },
        };
        self.here(result)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        if name == AT {
            visitor.visit_seq(Located {
                node: self,
                step: 0,
            })
        } else {
            visitor.visit_newtype_struct(self)
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.0.value {
            Value::Scalar(s) => self.here(visitor.visit_str(&s.text)),
            _ => Err(self.wrong("text")),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    read_as! {
        deserialize_bool visit_bool bool, "true or false";
        deserialize_u8 visit_u8 u8, "a whole number from 0 to 255";
        deserialize_u16 visit_u16 u16, "a whole number from 0 to 65535";
        deserialize_u32 visit_u32 u32, "a whole number from 0 to 4294967295";
        deserialize_u64 visit_u64 u64, "a whole number from 0";
        deserialize_i8 visit_i8 i8, "a whole number";
        deserialize_i16 visit_i16 i16, "a whole number";
        deserialize_i32 visit_i32 i32, "a whole number";
        deserialize_i64 visit_i64 i64, "a whole number";
        deserialize_f32 visit_f32 f32, "a number";
        deserialize_f64 visit_f64 f64, "a number";
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.0.value {
            Value::Seq(items) => self.here(visitor.visit_seq(Items(items.iter()))),
            _ => Err(self.wrong("a list")),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.0.value {
            Value::Map(entries) => self.here(visitor.visit_map(Entries::new(entries, None))),
            _ => Err(self.wrong("a mapping")),
        }
    }

    /// A struct refuses keys it does not have, whether or not it says
    /// `deny_unknown_fields` (every schema type does), naming the key's line: the first
    /// pass takes unknown keys out, so one left here is a key it does not know of.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match &self.0.value {
            Value::Map(entries) => {
                self.here(visitor.visit_map(Entries::new(entries, Some(fields))))
            }
            _ => Err(self.wrong("a mapping")),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        i128 u128 char bytes byte_buf unit_struct tuple tuple_struct enum
    }
}

/// A list's items.
struct Items<'a>(std::slice::Iter<'a, Yaml>);

impl<'de> SeqAccess<'de> for Items<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0
            .next()
            .map(|item| seed.deserialize(Node(item)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

/// A mapping's entries; for a struct, only the keys it has.
struct Entries<'a> {
    entries: std::slice::Iter<'a, (Yaml, Yaml)>,
    fields: Option<&'static [&'static str]>,
    value: Option<&'a Yaml>,
}

impl<'a> Entries<'a> {
    fn new(entries: &'a [(Yaml, Yaml)], fields: Option<&'static [&'static str]>) -> Self {
        Self {
            entries: entries.iter(),
            fields,
            value: None,
        }
    }
}

impl<'de> MapAccess<'de> for Entries<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        if let Some(fields) = self.fields {
            let known = matches!(&key.value, Value::Scalar(s) if fields.contains(&s.text.as_str()));
            if !known {
                return Err(Error {
                    line: Some(key.line),
                    message: format!(
                        "unknown key {} (expected one of {})",
                        key.describe(),
                        fields.join(", ")
                    ),
                });
            }
        }
        self.value = Some(value);
        seed.deserialize(Node(key)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let value = self
            .value
            .take()
            .ok_or_else(|| <Error as de::Error>::custom("a value without its key"))?;
        seed.deserialize(Node(value))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

/// [`super::At`]'s two parts: the line, then the value.
struct Located<'a> {
    node: Node<'a>,
    step: u8,
}

impl<'de> SeqAccess<'de> for Located<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.step += 1;
        match self.step {
            1 => seed
                .deserialize(self.node.0.line.into_deserializer())
                .map(Some),
            2 => seed.deserialize(self.node).map(Some),
            _ => Ok(None),
        }
    }
}
