//! tollgate's integration tests, one binary: each suite is a module (a test is named
//! `suite::test`, e.g. `reload::sighup_reloads_tollgate_serve`), and all share
//! [`common`], whose Redis harness starts one standalone server and one cluster for
//! the whole binary; the suites isolate themselves by key prefix, and a test that
//! pauses, kills or reshards a server, or counts its calls server-wide, starts one of
//! its own (`common::redis::custom`).
//!
//! Only suites that need a process of their own are other binaries: `tests/e2e/`
//! (Envoy and the Python client from the venv), and `tests/alloc_free_matching.rs` and
//! `tests/alloc_per_request.rs` (each a counting global allocator): four binaries.

mod common;

mod admin;
mod answers;
mod bench_tool;
mod budget_overdraw;
mod calendar_periods;
mod charges;
mod cli;
mod cli_check;
mod cli_inspect;
mod cli_pipe;
mod cli_redis;
mod cluster_batching;
mod cluster_faults;
mod cluster_reshard;
mod concurrency;
mod config_algorithms;
mod config_dirs;
mod config_errors;
mod config_mistakes;
mod config_watch;
mod connections;
mod cross_slot;
mod cross_slot_latency;
mod deploy_files;
mod deploy_metrics;
mod differential;
mod doc_samples;
mod fail_fast;
mod function_library;
mod global_ledger;
mod global_regions;
mod global_rules;
mod global_sim;
mod grpc;
mod http_json;
mod increment_first;
mod lease_churn;
mod limiter;
mod local_fallback;
mod logs;
mod matching;
mod memory_store;
mod memory_usage;
mod metric_cardinality;
mod metrics;
mod migrate_check;
mod node_isolation;
mod quota_mode;
mod ratelimit_env;
mod redis_concurrency;
mod redis_failure;
mod redis_harness;
mod redis_restart;
mod redis_tls;
mod reload;
mod resilience;
mod rlqs;
mod rlqs_lua;
mod rlqs_scale;
mod script_calls;
mod script_work;
mod scripts;
mod secrets;
mod sentinel;
mod shaping;
mod shutdown;
mod simulate;
mod start_without_redis;
mod startup_health;
mod store_contract;
mod stuck_stderr;
mod tls;
mod token_quota;
mod tracing_b3;
mod tracing_otlp;
mod upgrade;
mod upstream_metrics;
mod upstream_schema;
