//! The hasher of the maps and caches a request reads: the config's domain and
//! descriptor tables, the rule metrics' handles and the counter caches.
//!
//! Why not std's SipHash: a request hashes its domain, each entry key and value, its
//! rule's path and its counter key, and SipHash is a slow hash for short keys
//! (BENCHMARKS.md, "Instructions per request of `tollgate serve`", counts the
//! change). foldhash is what hashbrown itself defaults to. Its seed
//! is random per process, so a client choosing descriptor values (the counter caches'
//! keys) cannot aim at collisions without knowing it; the config tables' keys come
//! from the config, never from requests.

/// A `HashMap` with the fast hasher.
pub type FastMap<K, V> = std::collections::HashMap<K, V, FastState>;

/// The fast hasher's builder (randomly seeded per map).
pub type FastState = foldhash::fast::RandomState;
