//! The Kubernetes side of `tests/it/deploy_files.rs`: every manifest of
//! `deploy/kubernetes/` parses and is listed by `kustomization.yaml`; the Deployment's
//! ports, probes (gRPC health for startup and readiness, liveness not tied to Redis),
//! shutdown, resources, security context and config mount (a ConfigMap directory where
//! RUNTIME_ROOT/RUNTIME_SUBDIRECTORY point, never subPath); the ConfigMap is `config/`
//! verbatim; the Service is headless; PDB and HPA select the Deployment; the Envoy
//! snippet is the tested filter and cluster, aimed at the Service; the NetworkPolicy
//! admits gRPC only from Envoy's pods and HTTP only from Prometheus.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

use serde_json::Value;

use super::{endpoints, envoy, grpc_port, http_port, ratelimit_filter, strings};
use crate::common::envoy::render::{cluster, load_yaml, load_yaml_documents};
use crate::common::process::root;

fn kubernetes_dir() -> PathBuf {
    root().join("deploy/kubernetes")
}

/// Every Kubernetes resource of the kustomization, by kind.
fn resources() -> Vec<Value> {
    let dir = kubernetes_dir();
    let kustomization = load_yaml(&dir.join("kustomization.yaml"));
    let listed: BTreeSet<&str> = strings(&kustomization["resources"]).into_iter().collect();
    // Not resources of the kustomization: the Envoy snippet, and the ServiceMonitor,
    // which needs the Prometheus Operator's CRD (applied on its own where it exists).
    let unlisted = [
        "kustomization.yaml",
        "envoy-snippet.yaml",
        "servicemonitor.yaml",
    ];
    let on_disk: BTreeSet<String> = fs::read_dir(&dir)
        .expect("deploy/kubernetes")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && !unlisted.contains(&n.as_str()))
        .collect();
    assert_eq!(
        listed,
        on_disk.iter().map(String::as_str).collect(),
        "kustomization.yaml lists every manifest"
    );
    let mut all = Vec::new();
    for file in on_disk {
        for document in load_yaml_documents(&dir.join(&file)) {
            for field in ["apiVersion", "kind"] {
                assert!(document[field].is_string(), "{file}: no {field}");
            }
            assert!(
                document["metadata"]["name"].is_string(),
                "{file}: no metadata.name"
            );
            all.push(document);
        }
    }
    all
}

fn resource<'a>(all: &'a [Value], kind: &str) -> &'a Value {
    let mut found = all.iter().filter(|r| r["kind"] == kind);
    let one = found.next().unwrap_or_else(|| panic!("no {kind}"));
    assert!(found.next().is_none(), "one {kind}");
    one
}

#[test]
fn deployment_probes_ports_and_mounts_agree_with_tollgate() {
    let all = resources();
    let deployment = resource(&all, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let ports: Vec<(String, u64)> = container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().expect("named").to_owned(),
                p["containerPort"].as_u64().expect("a port"),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [
            ("grpc".to_owned(), grpc_port()),
            ("http".to_owned(), http_port())
        ]
    );

    for probe in ["startupProbe", "readinessProbe"] {
        assert_eq!(
            container[probe]["grpc"]["port"].as_u64(),
            Some(grpc_port()),
            "{probe}: grpc.health.v1"
        );
    }
    // Liveness must not follow Redis (grpc health and /healthcheck both do).
    let liveness = &container["livenessProbe"];
    assert!(liveness.is_object(), "a liveness probe");
    assert!(
        liveness["grpc"].is_null(),
        "liveness tied to Redis: {liveness}"
    );
    assert_ne!(
        liveness["httpGet"]["path"], "/healthcheck",
        "liveness tied to Redis"
    );

    let pre_stop = strings(&container["lifecycle"]["preStop"]["exec"]["command"]);
    let sleep: u64 = pre_stop
        .last()
        .and_then(|s| s.parse().ok())
        .expect("preStop: sleep N");
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("a grace period");
    // tollgate drains 5 s after SIGTERM by default; leave as much again as slack.
    assert!(grace >= sleep + 10, "grace {grace}s, preStop {sleep}s");

    for kind in ["requests", "limits"] {
        for what in ["cpu", "memory"] {
            assert!(
                container["resources"][kind][what].is_string(),
                "resources.{kind}.{what}"
            );
        }
    }
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let security = &container["securityContext"];
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);

    // The config: a ConfigMap mounted as a directory where RUNTIME_ROOT/
    // RUNTIME_SUBDIRECTORY/config points.
    let env = |name: &str| {
        container["env"]
            .as_array()
            .expect("env")
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    let root_dir = env("RUNTIME_ROOT").expect("RUNTIME_ROOT");
    let sub = env("RUNTIME_SUBDIRECTORY").expect("RUNTIME_SUBDIRECTORY");
    let config_dir = format!(
        "{}/{}/config",
        root_dir.as_str().unwrap(),
        sub.as_str().unwrap()
    );
    assert!(
        !strings(&container["args"]).contains(&"--config"),
        "--config would override RUNTIME_ROOT"
    );
    let mounts = container["volumeMounts"].as_array().expect("volumeMounts");
    assert!(
        mounts.iter().all(|m| m["subPath"].is_null()),
        "subPath mounts never see ConfigMap updates"
    );
    let mount = mounts
        .iter()
        .find(|m| m["mountPath"] == config_dir.as_str())
        .expect("config mount");
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the volume");
    assert_eq!(
        volume["configMap"]["name"],
        resource(&all, "ConfigMap")["metadata"]["name"]
    );
    assert_eq!(env("REDIS_TYPE"), Some(Value::from("cluster")));
}

#[test]
fn configmap_is_config_dir_verbatim() {
    let all = resources();
    let data = resource(&all, "ConfigMap")["data"]
        .as_object()
        .expect("data");
    let mut files = BTreeSet::new();
    for entry in fs::read_dir(root().join("config")).expect("config/") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = fs::read_to_string(&path).expect("a config file");
        assert_eq!(
            data.get(&name).and_then(Value::as_str),
            Some(text.as_str()),
            "deploy/kubernetes/configmap.yaml: {name} differs from config/{name}; regenerate it \
             (see the comment at its top)"
        );
        files.insert(name);
    }
    assert_eq!(data.keys().cloned().collect::<BTreeSet<_>>(), files);
}

#[test]
fn service_pdb_and_hpa_select_the_deployment() {
    let all = resources();
    let deployment = resource(&all, "Deployment");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&deployment["spec"]["selector"]["matchLabels"], labels);

    let service = resource(&all, "Service");
    assert_eq!(
        service["spec"]["clusterIP"], "None",
        "headless, for Envoy's STRICT_DNS"
    );
    assert_eq!(&service["spec"]["selector"], labels);
    let ports: Vec<(u64, &str)> = service["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| {
            (
                p["port"].as_u64().unwrap(),
                p["targetPort"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(ports, [(grpc_port(), "grpc"), (http_port(), "http")]);

    let pdb = resource(&all, "PodDisruptionBudget");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], labels);
    let hpa = resource(&all, "HorizontalPodAutoscaler");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        deployment["metadata"]["name"]
    );
    let min = hpa["spec"]["minReplicas"].as_u64().expect("minReplicas");
    let available = pdb["spec"]["minAvailable"].as_u64().expect("minAvailable");
    assert!(
        min >= 2 && available < min,
        "a drain must be possible: min {min}, PDB {available}"
    );
}

#[test]
fn envoy_snippet_is_the_tested_filter_and_cluster_aimed_at_the_service() {
    let snippet = load_yaml(&kubernetes_dir().join("envoy-snippet.yaml"));
    let envoy_config = envoy();
    assert_eq!(&snippet["http_filters"][0], ratelimit_filter(&envoy_config));

    let mut ours = snippet["clusters"][0].clone();
    let mut tested = cluster(&envoy_config, "tollgate").clone();
    let address = endpoints(&ours);
    for cluster in [&mut ours, &mut tested] {
        let map = cluster.as_object_mut().expect("a cluster");
        map.remove("load_assignment");
        map.remove("dns_refresh_rate");
    }
    assert_eq!(
        ours, tested,
        "the snippet's cluster differs from envoy.yaml's beyond addresses"
    );

    let all = resources();
    let service = resource(&all, "Service")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let kustomization = load_yaml(&kubernetes_dir().join("kustomization.yaml"));
    let namespace = kustomization["namespace"].as_str().expect("a namespace");
    let host = format!("{service}.{namespace}.svc.cluster.local");
    assert_eq!(address, [(host, grpc_port())]);
}

/// The ports (numbers) of one NetworkPolicy ingress rule.
fn rule_ports(rule: &Value) -> Vec<u64> {
    rule["ports"]
        .as_array()
        .expect("a rule without ports admits every port")
        .iter()
        .map(|p| {
            assert_eq!(p["protocol"], "TCP", "{p}");
            p["port"].as_u64().expect("a port number")
        })
        .collect()
}

#[test]
fn network_policy_admits_grpc_from_envoy_and_http_from_prometheus() {
    let all = resources();
    let deployment = resource(&all, "Deployment");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let policy = resource(&all, "NetworkPolicy");
    assert_eq!(policy["apiVersion"], "networking.k8s.io/v1");
    let spec = &policy["spec"];
    assert_eq!(&spec["podSelector"]["matchLabels"], labels);
    assert!(strings(&spec["policyTypes"]).contains(&"Ingress"));

    let rules = spec["ingress"].as_array().expect("ingress rules");
    let mut admitted = BTreeSet::new();
    for rule in rules {
        let ports = rule_ports(rule);
        let from = rule["from"]
            .as_array()
            .expect("a rule without from admits anyone");
        assert!(!from.is_empty(), "an empty from admits anyone: {rule}");
        let peers: Vec<&Value> = from
            .iter()
            .map(|peer| {
                // Each peer names pods; an ipBlock or a bare namespace would admit more.
                assert!(peer["ipBlock"].is_null(), "{peer}");
                let pods = &peer["podSelector"]["matchLabels"];
                assert!(pods.as_object().is_some_and(|m| !m.is_empty()), "{peer}");
                pods
            })
            .collect();
        for port in ports {
            let expected = if port == grpc_port() {
                ("tollgate.io/client", "envoy")
            } else if port == http_port() {
                ("app.kubernetes.io/name", "prometheus")
            } else {
                panic!("port {port} is neither gRPC nor HTTP")
            };
            for pods in &peers {
                assert_eq!(pods[expected.0], expected.1, "port {port}: {pods}");
            }
            admitted.insert(port);
        }
    }
    assert_eq!(admitted, BTreeSet::from([grpc_port(), http_port()]));
}
