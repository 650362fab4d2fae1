//! Fuzz target: request to Redis keys. A request built from the input (domains,
//! keys and values drawn mostly from the config below, values free-form) goes
//! through what the limiter does before the store: the bounds check, the matcher
//! (`plan::resolve`), `replaces`, the counter key, and `keys::encode`. Checked:
//! nothing panics; every key has exactly one hash tag, and it is the one the rule
//! intends (so no value can move a counter to another slot); two different counters
//! never share a key (the encoding is injective).

#![no_main]

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;

use tollgate::config::Config;
use tollgate::limiter::{bounds, plan};
use tollgate::proto::rate_limit_descriptor::Entry;
use tollgate::proto::{RateLimitDescriptor, RateLimitRequest};
use tollgate::store::CounterKey;
use tollgate::store::redis::keys;

const YAML: &str = r#"
domain: fuzz
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value: "/api/*"
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 5, name: api}
  - key: path
    value: "/v*/users/*"
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: tenant
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 3, replaces: [{name: api}]}
      - key: user
        value: "admin"
        rate_limit: {unlimited: true}
"#;

const TAGGED: &str = r#"
domain: tagged
hash_tag: [tenant]
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 1000}
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 7}
        hash_tag: [user]
"#;

const WORDS: &[&str] = &[
    "fuzz", "tagged", "remote_address", "path", "tenant", "user", "admin", "/api/x",
    "/v1/users/7", "{", "}", "|", "=", ":", "%", "%7B", "*", "", "\u{0}",
];

fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        tollgate::config::load_sources(&[
            (Path::new("fuzz.yaml"), YAML),
            (Path::new("tagged.yaml"), TAGGED),
        ])
        .expect("the fuzz config loads")
    })
}

fn word(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
    if u.ratio(3, 4)? {
        Ok((*u.choose(WORDS)?).to_owned())
    } else {
        String::arbitrary(u)
    }
}

fn request(u: &mut Unstructured<'_>) -> arbitrary::Result<RateLimitRequest> {
    let domain = word(u)?;
    let mut descriptors = Vec::new();
    for _ in 0..u.int_in_range(0..=4)? {
        let mut entries = Vec::new();
        for _ in 0..u.int_in_range(0..=3)? {
            entries.push(Entry {
                key: word(u)?,
                value: word(u)?,
            });
        }
        descriptors.push(RateLimitDescriptor {
            entries,
            ..Default::default()
        });
    }
    Ok(RateLimitRequest {
        domain,
        descriptors,
        hits_addend: u32::arbitrary(u)?,
    })
}

/// The tag `encode` must produce: the domain and the entries the rule's hash_tag
/// names (all entries without one, or when the descriptor has none of them).
fn expected_tag(counter: &CounterKey) -> String {
    fn esc(s: &str) -> String {
        s.chars()
            .map(|c| match c {
                '{' | '}' | '|' | '=' | ':' | '%' | '\u{0}'..='\u{1f}' | '\u{7f}' => {
                    format!("%{:02X}", c as u32)
                }
                c => c.to_string(),
            })
            .collect()
    }
    let named = |k: &str| match &counter.hash_tag {
        Some(keys) => keys.iter().any(|n| &**n == k),
        None => true,
    };
    let tagged = counter.hash_tag.is_some() && counter.entries.iter().any(|(k, _)| named(k));
    let mut tag = esc(&counter.domain);
    for (k, v) in &counter.entries {
        if !tagged || named(k) {
            tag.push_str(&format!("|{}={}", esc(k), esc(v)));
        }
    }
    tag
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(request) = request(&mut u) else {
        return;
    };
    if bounds::validate(&request).is_err() {
        return;
    }
    let config = config();
    let Some(domain) = config.domain(&request.domain) else {
        return;
    };
    let mut resolved = Vec::new();
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        match plan::resolve(domain, i, descriptor) {
            Ok(r) => resolved.push(r),
            Err(_) => return,
        }
    }
    plan::apply_replaces(&mut resolved);
    let name: Arc<str> = domain.name.clone();
    let mut seen: HashMap<String, CounterKey> = HashMap::new();
    for (resolved, descriptor) in resolved.iter().zip(&request.descriptors) {
        let plan::Plan::Limited {
            limits,
            rule,
            shared,
            ..
        } = resolved
        else {
            continue;
        };
        for limit in limits.as_slice() {
            let counter = plan::counter_key(&name, *rule, descriptor, *shared, limit);
            let key = keys::encode("pfx:", &counter);
            assert_eq!(key.matches('{').count(), 1, "{key}");
            assert_eq!(key.matches('}').count(), 1, "{key}");
            assert_eq!(keys::tag(&key), Some(expected_tag(&counter).as_str()), "{key}");
            if let Some(other) = seen.insert(key.clone(), counter.clone()) {
                assert_eq!(other, counter, "two counters share the key {key}");
            }
        }
    }
});
