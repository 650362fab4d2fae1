//! The deployment's Envoy config as the tests read it ([`render`]), shared by
//! `deploy_files` and the end-to-end stack (`tests/e2e/stack`), and the Redis timeout
//! that stack gives its replicas, which `deploy_files` checks Envoy's timeout against.

pub mod render;

/// tollgate's budget for Redis work per request in the end-to-end tests. 50 ms (the default
/// once) is exceeded under bursts of 30-100 concurrent requests on a busy 2-core machine
/// (debug and release builds alike); each such call is UNAVAILABLE, and Envoy, with
/// failure_mode_deny: false, lets the request through uncounted. These tests check
/// wiring and exactness, so they give Redis 500 ms, still below Envoy's 1 s timeout
/// (deploy/envoy/envoy.yaml), which must stay above it.
pub const REDIS_TIMEOUT_MS: u64 = 500;
