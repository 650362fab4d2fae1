//! Redis key encoding: `<prefix>{<tag>}<rest>`.
//!
//! The hash tag (between the first `{` and the next `}`) decides the Redis Cluster
//! slot, and a script may only touch keys of one slot, so the tag is chosen on
//! purpose: by default the domain plus every descriptor entry of the counter (counters
//! spread over the shards); with `hash_tag: [keys]` the domain plus only those entries,
//! so e.g. all of one tenant's counters share a slot and are decided in one script.
//!
//! Descriptor values come from clients. Every component is escaped so that it cannot
//! contain `{`, `}`, the separators `|` `=` `:`, `%` itself, or control bytes: the
//! encoding is injective, and no value can move a key to another slot than the rule
//! intends.

use crate::store::CounterKey;

/// Appends `text` with every special byte written as `%XX`. Every special byte is
/// ASCII, so the runs between them are whole UTF-8 and are copied as they are (most
/// values have none: one copy).
fn escape_into(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut plain = 0;
    for (i, &byte) in text.as_bytes().iter().enumerate() {
        if matches!(
            byte,
            b'{' | b'}' | b'|' | b'=' | b':' | b'%' | 0..=0x1f | 0x7f
        ) {
            out.push_str(&text[plain..i]);
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
            plain = i + 1;
        }
    }
    out.push_str(&text[plain..]);
}

/// Whether entry `key` belongs in the tag of `counter`.
fn in_tag(counter: &CounterKey, key: &str) -> bool {
    match &counter.hash_tag {
        Some(keys) => keys.iter().any(|k| &**k == key),
        None => true,
    }
}

/// The full Redis key of a counter. `prefix` must not contain `{` or `}` (checked when
/// settings are read), or it would capture the hash tag.
pub fn encode(prefix: &str, counter: &CounterKey) -> String {
    let mut key = String::with_capacity(prefix.len() + 64);
    key.push_str(prefix);
    key.push('{');
    escape_into(&mut key, &counter.domain);
    // A hash_tag naming keys the descriptor lacks falls back to the default tag
    // rather than piling every such counter into the domain's single slot.
    let tagged =
        counter.hash_tag.is_some() && counter.entries.iter().any(|(k, _)| in_tag(counter, k));
    for (k, v) in &counter.entries {
        if !tagged || in_tag(counter, k) {
            key.push('|');
            escape_into(&mut key, k);
            key.push('=');
            escape_into(&mut key, v);
        }
    }
    key.push_str("}:");
    escape_into(&mut key, &counter.rule);
    key.push(':');
    for (i, (k, v)) in counter.entries.iter().enumerate() {
        if i > 0 {
            key.push('|');
        }
        escape_into(&mut key, k);
        key.push('=');
        escape_into(&mut key, v);
    }
    key.push(':');
    key.push_str(counter.algorithm.key_name());
    key.push(':');
    key.push_str(itoa::Buffer::new().format(counter.window_secs));
    // A zone's name is letters, digits and `/_+-`: nothing the encoding escapes.
    if let Some(zone) = counter.time_zone {
        key.push('@');
        key.push_str(zone.name());
    }
    key
}

/// The hash tag of an encoded key: what Redis hashes to pick the slot.
pub fn tag(key: &str) -> Option<&str> {
    // Bytes, not chars: both braces are ASCII, so the slice bounds are char
    // boundaries, and a byte scan is a fraction of `str::find`'s cost (run per key per
    // request on a cluster).
    let bytes = key.as_bytes();
    let open = bytes.iter().position(|&b| b == b'{')?;
    let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
    Some(&key[open + 1..open + 1 + close])
}

/// Why a key prefix cannot be used.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.contains(['{', '}']) {
        return Err(format!(
            "key prefix '{prefix}' must not contain '{{' or '}}': it would become the Redis Cluster hash tag"
        ));
    }
    Ok(())
}

/// The hash slot of `key`, as Redis computes it (CRC16/XMODEM of the hash tag, or of
/// the whole key when it has no non-empty tag, modulo 16384). Computed here because
/// the cluster's order needs the slot's number, which redis-rs's `Slot` does not expose; the
/// CRC is the crate redis-rs itself uses.
pub fn slot_of(key: &str) -> u16 {
    let hashed = tag(key).filter(|tag| !tag.is_empty()).unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed.as_bytes()) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use proptest::prelude::*;
    use std::sync::Arc;

    /// Counters already in Redis are found by these names: they never change.
    #[test]
    fn algorithm_names_in_keys_are_stable() {
        let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.key_name()).collect();
        assert_eq!(names, ["fw", "sw", "sl", "tb", "gcra", "lb", "cc"]);
    }

    fn counter(entries: Vec<(String, String)>, hash_tag: Option<Vec<&str>>) -> CounterKey {
        CounterKey {
            domain: Arc::from("dom"),
            rule: Arc::from("tenant_id.user"),
            entries: entries
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            algorithm: Algorithm::FixedWindow,
            window_secs: 60,
            time_zone: None,
            hash_tag: hash_tag.map(|keys| keys.into_iter().map(Arc::from).collect()),
        }
    }

    fn pair(k: &str, v: &str) -> (String, String) {
        (k.to_owned(), v.to_owned())
    }

    #[test]
    fn layout_is_prefix_tag_rest() {
        let key = encode(
            "rl:",
            &counter(vec![pair("tenant_id", "acme"), pair("user", "u1")], None),
        );
        assert_eq!(
            key,
            "rl:{dom|tenant_id=acme|user=u1}:tenant_id.user:tenant_id=acme|user=u1:fw:60"
        );
    }

    #[test]
    fn hash_tag_keeps_only_named_entries_in_the_tag() {
        let key = encode(
            "",
            &counter(
                vec![pair("tenant_id", "acme"), pair("user", "u1")],
                Some(vec!["tenant_id"]),
            ),
        );
        assert_eq!(tag(&key), Some("dom|tenant_id=acme"));
        let missing = encode(
            "",
            &counter(vec![pair("user", "u1")], Some(vec!["tenant_id"])),
        );
        assert_eq!(
            tag(&missing),
            Some("dom|user=u1"),
            "falls back to the default tag"
        );
    }

    #[test]
    fn braces_and_separators_in_values_are_escaped() {
        let key = encode("", &counter(vec![pair("k", "}{evil|x=y:%\n")], None));
        assert_eq!(tag(&key), Some("dom|k=%7D%7Bevil%7Cx%3Dy%3A%25%0A"));
        assert_eq!(key.matches('{').count(), 1);
        assert_eq!(key.matches('}').count(), 1);
    }

    #[test]
    fn prefixes_with_braces_are_refused() {
        assert!(check_prefix("ok:").is_ok());
        assert!(check_prefix("a{b").is_err());
    }

    fn entries() -> impl Strategy<Value = Vec<(String, String)>> {
        // Arbitrary unicode, biased towards the bytes the escaping must handle.
        let text = prop_oneof![any::<String>(), "[{}|=:%a\\x00\\n]{0,6}"];
        proptest::collection::vec((text.clone(), text), 0..4)
    }

    proptest! {
        /// Keys already in Redis must keep their bytes across versions (or every
        /// counter would start again on upgrade): escaping is the one it replaced.
        #[test]
        fn escaping_writes_what_the_char_by_char_escape_wrote(text in "[{}|=:%a-z\\x00-\\x1f\\x7fé€]{0,24}") {
            let mut old = String::new();
            for ch in text.chars() {
                match ch {
                    '{' | '}' | '|' | '=' | ':' | '%' | '\u{0}'..='\u{1f}' | '\u{7f}' => {
                        old.push_str(&format!("%{:02X}", ch as u32));
                    }
                    _ => old.push(ch),
                }
            }
            let mut new = String::new();
            escape_into(&mut new, &text);
            prop_assert_eq!(new, old);
        }

        #[test]
        fn encoding_is_injective(a in entries(), b in entries(), wa in 1u64..3, wb in 1u64..3) {
            let mut ca = counter(a, None);
            ca.window_secs = wa;
            let mut cb = counter(b, None);
            cb.window_secs = wb;
            if ca != cb {
                prop_assert_ne!(encode("p:", &ca), encode("p:", &cb));
            }
        }

        #[test]
        fn slot_depends_only_on_the_tag(a in entries(), rule in any::<String>(), window in 1u64..100_000) {
            let ca = counter(a.clone(), None);
            let mut cb = counter(a, None);
            cb.rule = Arc::from(rule);
            cb.window_secs = window;
            let (ka, kb) = (encode("x", &ca), encode("y", &cb));
            prop_assert_eq!(tag(&ka), tag(&kb));
            prop_assert_eq!(
                redis::cluster_routing::Slot::for_key(ka.as_bytes()),
                redis::cluster_routing::Slot::for_key(kb.as_bytes())
            );
        }

        #[test]
        fn one_tenant_one_slot(tenant in any::<String>(), user in any::<String>(), route in any::<String>()) {
            let tag_keys = Some(vec!["tenant_id"]);
            let keys = [
                encode("", &counter(vec![pair("tenant_id", &tenant)], tag_keys.clone())),
                encode("", &counter(vec![pair("tenant_id", &tenant), pair("user", &user)], tag_keys.clone())),
                encode("", &counter(vec![pair("tenant_id", &tenant), pair("route", &route)], tag_keys)),
            ];
            let slot = redis::cluster_routing::Slot::for_key(keys[0].as_bytes());
            for key in &keys {
                prop_assert_eq!(redis::cluster_routing::Slot::for_key(key.as_bytes()), slot);
            }
        }
    }
}
