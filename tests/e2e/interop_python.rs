//! Wire compatibility with an independent client: the real server on the
//! `tests/fixtures/interop/` config, driven by `tests/python/interop.py` (grpcio plus
//! the stubs `xds-protos` generates from Envoy's own protos). Its memory store runs on
//! a clock that stands still mid-day, so no day, week or hour ends between the calls
//! the script counts across. Needs `TOLLGATE_PYTHON`, which `scripts/test` sets;
//! without it the test fails, never skips.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::server::TestServer;
use tollgate::limiter::LimiterOptions;

const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_client_agrees_with_envoys_schema() {
    let python = std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| {
        panic!(
            "TOLLGATE_PYTHON is not set: run the tests with scripts/test, which builds the \
             Python venv (grpcio, xds-protos) and exports it, or export \
             TOLLGATE_PYTHON=<repo>/.venv/bin/python yourself"
        )
    });
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = tollgate::config::load_path(&root.join("tests/fixtures/interop"))
        .unwrap_or_else(|e| panic!("interop fixture does not load: {e}"));
    let store = common::stores::still_memory_store();
    let server = TestServer::start(config, store, LimiterOptions::default()).await;

    let script = root.join("tests/python/interop.py");
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(server.grpc_addr.to_string())
        .current_dir(root)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(SCRIPT_DEADLINE, run)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{} did not finish within {SCRIPT_DEADLINE:?}",
                script.display()
            )
        })
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{python} {} {} exited with {}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        script.display(),
        server.grpc_addr,
        output.status
    );
    assert!(
        stdout.contains(" passed, 0 failed"),
        "unexpected output:\n{stdout}"
    );
    server.stop().await;
}
