//! The batch scripts as a function library (`src/store/redis/scripts/library.rs`),
//! on private servers whose command counts are this test's alone: a store's calls go
//! by FCALL; a server that lost the library (`FUNCTION FLUSH`) gets it again from
//! the next call, which is answered; and a server without functions (Redis before 7,
//! here FCALL and FUNCTION renamed away) is served by EVALSHA, the same answers.

use crate::common;

use std::sync::Arc;

use tollgate::algorithm::{Algorithm, Params};
use tollgate::store::redis::connect::RedisTarget;
use tollgate::store::{CounterKey, CounterOp, Store};

use common::redis::command_calls as calls;

fn op(tenant: &str) -> CounterOp {
    let params = Params {
        algorithm: Algorithm::FixedWindow,
        limit: 3,
        window_ms: 365 * 86_400_000,
        burst: 3,
        max_delay_ms: None,
        calendar: None,
    };
    CounterOp {
        key: CounterKey {
            domain: Arc::from("library"),
            rule: Arc::from("tenant"),
            entries: [("tenant".into(), tenant.into())].into_iter().collect(),
            algorithm: Algorithm::FixedWindow,
            window_secs: 365 * 86_400,
            time_zone: None,
            hash_tag: None,
        },
        params,
        cost: 1,
        vetoes: true,
        mode: tollgate::algorithm::Mode::Limit,
        lease: None,
    }
}

/// Four requests on a limit of 3: admitted, admitted, admitted, denied.
async fn four_on_three(store: &dyn Store, tenant: &str) {
    let mut allowed = Vec::new();
    for _ in 0..4 {
        let decisions = store.decide(&[op(tenant)]).await.expect("decided");
        allowed.push(decisions[0].allowed);
    }
    assert_eq!(allowed, [true, true, true, false], "{tenant}");
}

#[tokio::test]
async fn calls_go_by_fcall_and_a_flushed_library_is_loaded_again() {
    let redis = common::redis::custom::private_standalone("library").expect("private redis");
    let port = redis.port();
    let store = common::stores::connect(&common::stores::options(
        RedisTarget::Standalone(redis.url()),
        "library",
    ))
    .await;
    four_on_three(&store, "a").await;
    assert_eq!(calls(port, "fcall"), 4, "one FCALL per request");
    assert_eq!(calls(port, "evalsha"), 0, "no EVALSHA");
    common::redis::redis_cli(port, &["FUNCTION", "FLUSH"]);
    four_on_three(&store, "b").await;
    // The first FCALL after the flush failed ("Function not found"), the library was
    // loaded again on that connection, and the call went once more.
    assert_eq!(calls(port, "fcall"), 9);
    let list = common::redis::redis_cli(port, &["FUNCTION", "LIST"]);
    assert!(list.contains("tollgate_batch_"), "{list}");
}

#[tokio::test]
async fn a_server_without_functions_is_served_by_evalsha() {
    let server = common::redis::custom::start_servers(
        "library_none",
        1,
        &[
            "--rename-command",
            "FCALL",
            "",
            "--rename-command",
            "FUNCTION",
            "",
        ],
    )
    .expect("a server without functions")
    .remove(0);
    let store = common::stores::connect(&common::stores::options(
        RedisTarget::Standalone(format!("redis://{}/", server.addr())),
        "library_none",
    ))
    .await;
    four_on_three(&store, "a").await;
    assert_eq!(calls(server.port, "evalsha"), 4, "one EVALSHA per request");
    assert_eq!(calls(server.port, "fcall"), 0);
}
