//! What `tollgate bench` sends: requests for one domain with D descriptors each, every
//! descriptor's entries carrying a value drawn from N distinct keys, uniformly or by a
//! Zipf law (a few hot keys, a long tail); and, as Envoy sends them, entries shared by
//! all of a request's descriptors (one `tenant_id` in each), drawn once per request.

use crate::proto::rate_limit_descriptor::Entry;
use crate::proto::{RateLimitDescriptor, RateLimitRequest};

/// How a descriptor's key is drawn from `0..keys`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    Uniform,
    /// Key `i` (0-based) has weight `1 / (i + 1)^s`.
    Zipf(f64),
}

impl std::str::FromStr for Distribution {
    type Err = String;

    /// `uniform`, `zipf` (s = 1.0) or `zipf:S`.
    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            None if text == "uniform" => Ok(Self::Uniform),
            None if text == "zipf" => Ok(Self::Zipf(1.0)),
            Some(("zipf", s)) => match s.parse::<f64>() {
                Ok(s) if s.is_finite() && s > 0.0 && s <= 10.0 => Ok(Self::Zipf(s)),
                _ => Err(format!("zipf exponent '{s}' must be a number in (0, 10]")),
            },
            _ => Err(format!(
                "unknown distribution '{text}' (expected uniform, zipf or zipf:S)"
            )),
        }
    }
}

impl std::fmt::Display for Distribution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Uniform => f.write_str("uniform"),
            Self::Zipf(s) => write!(f, "zipf:{s}"),
        }
    }
}

/// An entry every descriptor of a request carries with the same value, drawn once per
/// request from `values` distinct ones (by the workload's distribution): Envoy's shape
/// when each of a route's rate-limit actions starts with the tenant, so a request's
/// counters are one tenant's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SharedEntry {
    pub key: String,
    pub values: u64,
}

impl std::str::FromStr for SharedEntry {
    type Err = String;

    /// `KEY=N`.
    fn from_str(text: &str) -> Result<Self, String> {
        let Some((key, values)) = text.rsplit_once('=') else {
            return Err(format!("shared entry '{text}' must be KEY=N"));
        };
        match values.parse::<u64>() {
            Ok(values) if !key.is_empty() => Ok(Self {
                key: key.to_owned(),
                values,
            }),
            _ => Err(format!(
                "shared entry '{text}' must be KEY=N, a non-empty key and a number of values"
            )),
        }
    }
}

impl std::fmt::Display for SharedEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.key, self.values)
    }
}

/// The request shape.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    pub domain: String,
    /// Descriptors per request.
    pub descriptors: usize,
    /// Entries every descriptor of a request shares, before its own (in this order).
    pub shared: Vec<SharedEntry>,
    /// Entry keys of every descriptor, in order (nested descriptors have several).
    pub entry_keys: Vec<String>,
    /// Distinct values per descriptor.
    pub keys: u64,
    pub distribution: Distribution,
    /// Request-level `hits_addend` (0: one hit).
    pub hits_addend: u32,
    /// Seeds the draws: runs with the same seed send the same keys in the same order;
    /// another seed draws fresh ones (the long tail of a Zipf load stays cold).
    pub seed: u64,
}

/// Values to draw from, and how.
struct Pool {
    values: Vec<String>,
    /// Cumulative Zipf weights, normalised to end at 1.0; empty for uniform.
    cdf: Vec<f64>,
}

impl Pool {
    fn new(count: u64, distribution: Distribution) -> Self {
        let count = usize::try_from(count.max(1)).unwrap_or(usize::MAX);
        let values = (0..count).map(|i| format!("v{i}")).collect();
        let cdf = match distribution {
            Distribution::Uniform => Vec::new(),
            Distribution::Zipf(s) => zipf_cdf(count, s),
        };
        Self { values, cdf }
    }

    fn sample(&self, rng: &mut fastrand::Rng) -> usize {
        if self.cdf.is_empty() {
            return rng.usize(..self.values.len());
        }
        let u = rng.f64();
        self.cdf
            .partition_point(|&c| c < u)
            .min(self.values.len() - 1)
    }

    fn draw(&self, rng: &mut fastrand::Rng) -> &str {
        &self.values[self.sample(rng)]
    }
}

/// Builds requests; cheap to share between workers (the values and the Zipf tables are
/// computed once).
pub struct Workload {
    spec: WorkloadSpec,
    /// Each descriptor's own values.
    keys: Pool,
    /// The values of each shared entry, in the spec's order.
    shared: Vec<Pool>,
}

impl Workload {
    pub fn new(spec: WorkloadSpec) -> Self {
        let keys = Pool::new(spec.keys, spec.distribution);
        let shared = spec
            .shared
            .iter()
            .map(|entry| Pool::new(entry.values, spec.distribution))
            .collect();
        Self { spec, keys, shared }
    }

    pub fn spec(&self) -> &WorkloadSpec {
        &self.spec
    }

    /// The random source of one sender (`stream`: a closed-loop task's index, say):
    /// every stream draws its own sequence, all of them set by the spec's seed.
    pub fn rng(&self, stream: u64) -> fastrand::Rng {
        let mixed = stream.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        fastrand::Rng::with_seed(self.spec.seed ^ mixed ^ 0x7011_6a7e)
    }

    /// One key index, from `rng`.
    pub fn sample(&self, rng: &mut fastrand::Rng) -> usize {
        self.keys.sample(rng)
    }

    /// A fresh request: the shared entries drawn once, then each descriptor draws its
    /// own key.
    pub fn request(&self, rng: &mut fastrand::Rng) -> RateLimitRequest {
        let shared: Vec<Entry> = self
            .spec
            .shared
            .iter()
            .zip(&self.shared)
            .map(|(entry, pool)| Entry {
                key: entry.key.clone(),
                value: pool.draw(rng).to_owned(),
            })
            .collect();
        let descriptors = (0..self.spec.descriptors)
            .map(|d| {
                let value = self.keys.draw(rng);
                let own = self.spec.entry_keys.iter().map(|key| Entry {
                    key: descriptor_key(key, d),
                    value: value.to_owned(),
                });
                RateLimitDescriptor {
                    entries: shared.iter().cloned().chain(own).collect(),
                    ..Default::default()
                }
            })
            .collect();
        RateLimitRequest {
            domain: self.spec.domain.clone(),
            descriptors,
            hits_addend: self.spec.hits_addend,
        }
    }
}

/// A `{d}` in an entry key becomes the descriptor's index, so one request can address
/// several rules (`key{d}` gives `key0`, `key1`, ...); otherwise the key is as given.
fn descriptor_key(template: &str, index: usize) -> String {
    if template.contains("{d}") {
        template.replace("{d}", &index.to_string())
    } else {
        template.to_owned()
    }
}

fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let mut cdf = Vec::with_capacity(n);
    let mut total = 0.0;
    for i in 0..n {
        total += 1.0 / ((i + 1) as f64).powf(s);
        cdf.push(total);
    }
    for c in &mut cdf {
        *c /= total;
    }
    cdf
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(distribution: Distribution, keys: u64) -> WorkloadSpec {
        WorkloadSpec {
            domain: "bench".into(),
            descriptors: 3,
            shared: Vec::new(),
            entry_keys: vec!["key".into(), "sub{d}".into()],
            keys,
            distribution,
            hits_addend: 0,
            seed: 0,
        }
    }

    #[test]
    fn distributions_parse() {
        assert_eq!("uniform".parse(), Ok(Distribution::Uniform));
        assert_eq!("zipf".parse(), Ok(Distribution::Zipf(1.0)));
        assert_eq!("zipf:1.2".parse(), Ok(Distribution::Zipf(1.2)));
        assert!("zipf:-1".parse::<Distribution>().is_err());
        assert!("normal".parse::<Distribution>().is_err());
    }

    #[test]
    fn requests_have_the_asked_shape() {
        let workload = Workload::new(spec(Distribution::Uniform, 10));
        let request = workload.request(&mut fastrand::Rng::with_seed(7));
        assert_eq!(request.domain, "bench");
        assert_eq!(request.descriptors.len(), 3);
        let entries = &request.descriptors[2].entries;
        assert_eq!(entries[0].key, "key");
        assert_eq!(entries[1].key, "sub2");
        assert_eq!(entries[0].value, entries[1].value);
    }

    #[test]
    fn zipf_favours_the_first_keys() {
        let workload = Workload::new(spec(Distribution::Zipf(1.0), 1000));
        let mut rng = fastrand::Rng::with_seed(1);
        let mut hits = vec![0u32; 1000];
        for _ in 0..20_000 {
            hits[workload.sample(&mut rng)] += 1;
        }
        // H(1000) ~ 7.49: key 0 gets ~13%, key 999 ~0.013%.
        assert!(hits[0] > 2000 && hits[0] < 3400, "{}", hits[0]);
        assert!(hits[0] > hits[9] * 5);
        let uniform = Workload::new(spec(Distribution::Uniform, 1000));
        assert!((0..20_000).all(|_| uniform.sample(&mut rng) < 1000));
    }

    #[test]
    fn a_seed_sets_every_stream() {
        let draws = |seed: u64, stream: u64| {
            let workload = Workload::new(WorkloadSpec {
                seed,
                ..spec(Distribution::Uniform, 1_000_000)
            });
            let mut rng = workload.rng(stream);
            (0..8)
                .map(|_| workload.sample(&mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(1, 0), draws(1, 0), "the same seed, the same keys");
        assert_ne!(draws(1, 0), draws(2, 0), "another seed, other keys");
        assert_ne!(draws(1, 0), draws(1, 1), "each stream its own keys");
    }

    #[test]
    fn shared_entries_parse() {
        let entry: SharedEntry = "tenant_id=100".parse().expect("parses");
        assert_eq!(entry.key, "tenant_id");
        assert_eq!(entry.values, 100);
        assert_eq!(entry.to_string(), "tenant_id=100");
        for bad in ["tenant_id", "=5", "tenant_id=", "tenant_id=many", "t=-1"] {
            assert!(bad.parse::<SharedEntry>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_shared_entry_is_drawn_once_per_request() {
        let workload = Workload::new(WorkloadSpec {
            shared: vec![SharedEntry {
                key: "tenant_id".into(),
                values: 5,
            }],
            ..spec(Distribution::Uniform, 1_000_000)
        });
        let mut rng = fastrand::Rng::with_seed(3);
        let mut tenants = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let request = workload.request(&mut rng);
            let tenant = &request.descriptors[0].entries[0];
            assert_eq!(tenant.key, "tenant_id");
            for (d, descriptor) in request.descriptors.iter().enumerate() {
                // The tenant first, the same in every descriptor, then its own entries.
                let keys: Vec<&str> = descriptor.entries.iter().map(|e| e.key.as_str()).collect();
                assert_eq!(keys, ["tenant_id", "key", &format!("sub{d}")]);
                assert_eq!(&descriptor.entries[0], tenant);
            }
            // Each descriptor still draws its own key (a million: equal ones are rare).
            let own: std::collections::BTreeSet<&str> = request
                .descriptors
                .iter()
                .map(|d| d.entries[1].value.as_str())
                .collect();
            assert!(own.len() > 1, "{request:?}");
            tenants.insert(tenant.value.clone());
        }
        let expected: std::collections::BTreeSet<String> =
            (0..5).map(|i| format!("v{i}")).collect();
        assert_eq!(tenants, expected, "every tenant drawn, none outside 0..5");
    }
}
