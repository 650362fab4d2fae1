//! A counter as an algorithm's Lua twin keeps it in Redis, read back with plain
//! commands (`tollgate inspect`): which Redis type holds it ([`Layout`]) and what
//! the read returned ([`Stored`]). Each [`super::Model`] names its layout and puts
//! the stored value in words, next to the arithmetic that gives the fields meaning.

/// The Redis type a Lua twin stores one counter in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A hash of short fields (`HGETALL`).
    Hash,
    /// A sorted set with a member per hit (`ZCARD`).
    SortedSet,
    /// One string (`GET`): a number, or numbers packed ([`super::Model::PACKED`]).
    Value,
}

/// What the plain read of a counter's key returned (never empty: no key is no state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    Hash(Vec<(String, String)>),
    SortedSet { members: u64 },
    Value(Vec<u8>),
}

impl Stored {
    /// A hash field's value; `?` when the field (or the hash) is not there.
    pub fn field(&self, name: &str) -> &str {
        match self {
            Stored::Hash(fields) => fields
                .iter()
                .find(|(k, _)| k == name)
                .map_or("?", |(_, v)| v.as_str()),
            _ => "?",
        }
    }

    /// Every field of a hash as `k=v, ...` (a field per entry, as a map stores it).
    pub fn fields_text(&self) -> String {
        match self {
            Stored::Hash(fields) => fields
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", "),
            _ => "?".to_owned(),
        }
    }

    /// A sorted set's size; 0 for other layouts.
    pub fn members(&self) -> u64 {
        match self {
            Stored::SortedSet { members } => *members,
            _ => 0,
        }
    }

    /// A plain value as text (bytes that are not UTF-8 replaced); `?` for other
    /// layouts.
    pub fn value(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Stored::Value(v) => String::from_utf8_lossy(v),
            _ => "?".into(),
        }
    }

    /// A value of numbers packed in `format` (`struct.pack`'s: `<` then `d`, a
    /// little-endian double, or `I`, a little-endian u32), read back; `None` for
    /// anything else (another layout, or an earlier release's).
    pub fn unpacked(&self, format: &str) -> Option<Vec<f64>> {
        let Stored::Value(bytes) = self else {
            return None;
        };
        let mut at = 0;
        let mut out = Vec::new();
        for c in format.strip_prefix('<')?.chars() {
            let (len, read): (usize, fn(&[u8]) -> f64) = match c {
                'd' => (8, |b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8]))),
                'I' => (4, |b| {
                    f64::from(u32::from_le_bytes(b.try_into().unwrap_or([0; 4])))
                }),
                _ => return None,
            };
            out.push(read(bytes.get(at..at + len)?));
            at += len;
        }
        (at == bytes.len()).then_some(out)
    }
}
