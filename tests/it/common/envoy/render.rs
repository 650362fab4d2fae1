//! The deployment's YAML read as JSON: `deploy/envoy/envoy.yaml` (the file
//! docker-compose.yml mounts) and its clusters, for `deploy_files` and for the
//! end-to-end stack, which runs it on loopback (`tests/e2e/stack/loopback.rs`).

use std::path::{Path, PathBuf};

use serde_json::Value;

/// `deploy/envoy/envoy.yaml` in the source tree.
pub fn envoy_yaml_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/envoy/envoy.yaml")
}

/// One YAML document as JSON; panics naming the file.
pub fn load_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every YAML document of a `---`-separated file as JSON (empty documents dropped).
pub fn load_yaml_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    documents.into_iter().filter(|d| !d.is_null()).collect()
}

/// The cluster named `name` in `static_resources.clusters`.
pub fn cluster<'a>(config: &'a Value, name: &str) -> &'a Value {
    config["static_resources"]["clusters"]
        .as_array()
        .and_then(|clusters| clusters.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("envoy.yaml has no cluster named {name:?}"))
}

/// The `lb_endpoints` of a cluster's (single) locality.
pub fn lb_endpoints(cluster: &Value) -> &Vec<Value> {
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        .as_array()
        .unwrap_or_else(|| panic!("cluster {} has no lb_endpoints", cluster["name"]))
}
