//! A global counter's name in the ledger: the same in every region for the same
//! counter (domain, rule, the request's entries, algorithm, window), readable in
//! `tollgate inspect`, and injective: client values are escaped (`%`, `|`, `=`, `{`,
//! `}` and control bytes as `%XX`), so no two counters share a name.

use std::fmt::Write as _;

use crate::store::CounterKey;

/// `domain|rule|k=v|k=v|algorithm:window_secs`.
pub fn of(key: &CounterKey) -> String {
    let mut id = String::with_capacity(64);
    escape(&mut id, &key.domain);
    id.push('|');
    escape(&mut id, &key.rule);
    for (k, v) in &key.entries {
        id.push('|');
        escape(&mut id, k);
        id.push('=');
        escape(&mut id, v);
    }
    let _ = write!(id, "|{}:{}", key.algorithm.key_name(), key.window_secs);
    id
}

fn escape(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '%' | '|' | '=' | '{' | '}' => {
                let _ = write!(out, "%{:02X}", c as u32);
            }
            c if c.is_control() => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(out, "%{b:02X}");
                }
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::Algorithm;

    fn key(entries: &[(&str, &str)]) -> CounterKey {
        CounterKey {
            domain: Arc::from("api"),
            rule: Arc::from("tenant"),
            entries: entries
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            algorithm: Algorithm::FixedWindow,
            window_secs: 60,
            time_zone: None,
            hash_tag: None,
        }
    }

    #[test]
    fn readable_and_escaped() {
        assert_eq!(
            of(&key(&[("tenant", "acme")])),
            "api|tenant|tenant=acme|fw:60"
        );
        assert_eq!(
            of(&key(&[("tenant", "a|b=c%{}")])),
            "api|tenant|tenant=a%7Cb%3Dc%25%7B%7D|fw:60"
        );
    }

    proptest! {
        #[test]
        fn distinct_entries_have_distinct_names(
            a in proptest::collection::vec(("[a-z|=%]{0,3}", "[a-z|=%\\n]{0,3}"), 0..3),
            b in proptest::collection::vec(("[a-z|=%]{0,3}", "[a-z|=%\\n]{0,3}"), 0..3),
        ) {
            let ka: Vec<(&str, &str)> = a.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let kb: Vec<(&str, &str)> = b.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            prop_assert_eq!(of(&key(&ka)) == of(&key(&kb)), ka == kb);
        }
    }
}
