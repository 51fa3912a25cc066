//! deploy/: renders the kustomize tree with kubectl and checks what an
//! operator relies on before a rollout:
//! * every flag a manifest passes to one of our binaries is accepted by that
//!   binary's flag set, every binary is deployed, images carry the version
//!   `--version` prints, the Dockerfiles' user is the manifests' user;
//! * the probes fit the binary: proxy-server's readiness path answers 200
//!   with no agent connected, and its admin port is reachable on an address
//!   other than loopback's 127.0.0.1 (Prometheus scrapes the pod IP); the
//!   keepalive finds a frozen peer within the 30 s the docs promise;
//! * applied for real after `deploy/konnectivity/certs.sh`, every Secret,
//!   ConfigMap and ServiceAccount a workload mounts or runs as exists, the
//!   agent port has its Service, and the made certificates work;
//! * the `restricted` Pod Security Standard, enforced by a real apiserver
//!   (server-side dry run with admission) on the namespaces; the one pod that
//!   cannot meet it (tunnel-agent's, hostNetwork and KKP's NET_ADMIN
//!   containers) is refused for exactly those reasons and no other;
//! * resources, PodDisruptionBudgets, spreading and priority classes;
//! * schema validation with kubeconform against JSON schemas made from the
//!   same apiserver's OpenAPI v3 (nothing is downloaded).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use go_compat::flags::FlagSet;
use integration_tests::k8s::{Cluster, ClusterOpts, bins};
use integration_tests::watchdog;
use serde_json::{Value, json};

/// Our binaries, as deployed.
const OURS: [&str; 5] = [
    "lb-updater",
    "nodeport-proxy",
    "proxy-agent",
    "proxy-server",
    "tunnel-agent",
];

fn flag_set(binary: &str) -> Option<FlagSet> {
    Some(match binary {
        "proxy-server" => proxy_server::options::flags(),
        "proxy-agent" => proxy_agent::options::flags(),
        "nodeport-proxy" => nodeport_proxy::cli::flag_set(),
        "tunnel-agent" => tunnel_agent::cli::flag_set(),
        "lb-updater" => lb_updater::flags(),
        _ => return None,
    })
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

async fn render() -> String {
    let out = tokio::process::Command::new(&bins().kubectl)
        .arg("kustomize")
        .arg(repo().join("deploy"))
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize deploy/: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn pod_spec(doc: &Value) -> Option<&Value> {
    match doc["kind"].as_str()? {
        "Deployment" | "DaemonSet" | "StatefulSet" => Some(&doc["spec"]["template"]["spec"]),
        "Pod" => Some(&doc["spec"]),
        _ => None,
    }
}

fn name_of(doc: &Value) -> String {
    format!(
        "{} {}/{}",
        doc["kind"].as_str().unwrap_or_default(),
        doc["metadata"]["namespace"].as_str().unwrap_or("-"),
        doc["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// (workload, container, binary) for every container running one of ours.
fn our_containers(docs: &[Value]) -> Vec<(&Value, &Value, String)> {
    let mut out = Vec::new();
    for doc in docs {
        let Some(spec) = pod_spec(doc) else { continue };
        let all = spec["containers"]
            .as_array()
            .into_iter()
            .chain(spec["initContainers"].as_array())
            .flatten();
        for c in all {
            let program = c["command"][0].as_str().unwrap_or_default();
            let name = program.rsplit('/').next().unwrap_or_default();
            if OURS.contains(&name) {
                out.push((doc, c, name.to_string()));
            }
        }
    }
    out
}

fn argv(c: &Value) -> Vec<String> {
    c["command"]
        .as_array()
        .into_iter()
        .chain(c["args"].as_array())
        .flatten()
        .skip(1)
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// The value a container passes for `--flag` (either dash style).
fn flag_value(c: &Value, flag: &str) -> Option<String> {
    argv(c).into_iter().find_map(|a| {
        let a = a.trim_start_matches('-');
        a.strip_prefix(flag)?.strip_prefix('=').map(str::to_string)
    })
}

/// The numeric user every Dockerfile's final stage runs as.
fn dockerfile_user() -> u64 {
    let text = std::fs::read_to_string(repo().join("deploy/docker/Dockerfile")).unwrap();
    let users: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("USER "))
        .collect();
    assert_eq!(users.len(), 1, "one USER for every image: {users:?}");
    let user = users.into_iter().next().unwrap();
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    assert_eq!(uid, gid, "USER {user}");
    uid.parse()
        .unwrap_or_else(|_| panic!("USER {user} is not numeric"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_render_and_every_flag_is_accepted() {
    // Build (or find) the harness before the clock starts.
    integration_tests::k8s::bins();
    let _w = watchdog(Duration::from_secs(300));
    let docs = documents(&render().await);
    let mut deployed = BTreeSet::new();
    let mut checked = 0;
    for (doc, c, name) in our_containers(&docs) {
        let flags = flag_set(&name).unwrap();
        let args = argv(c);
        if let Err(e) = flags.parse(args.iter().map(String::as_str)) {
            panic!("{}: {name} rejects its flags: {e}\n{args:?}", name_of(doc));
        }
        // Images are tagged with the version the binary prints.
        assert_eq!(
            c["image"].as_str().unwrap_or_default(),
            format!("{name}:{}", env!("CARGO_PKG_VERSION")),
            "{}",
            name_of(doc)
        );
        // The image's ENTRYPOINT (deploy/docker/Dockerfile).
        assert_eq!(c["command"][0], format!("/{name}"), "{}", name_of(doc));
        deployed.insert(name);
        checked += args.len();
    }
    assert_eq!(deployed.into_iter().collect::<Vec<_>>(), OURS);
    assert!(checked > 50, "only {checked} flags checked");
}

/// Every container of ours runs as the image's non-root user with nothing
/// to escalate to; every container has requests and limits; replicated
/// roles are spread and covered by a PodDisruptionBudget; roles on the
/// control path have a priority class.
#[tokio::test]
async fn workloads_are_hardened_sized_and_spread() {
    integration_tests::k8s::bins();
    let docs = documents(&render().await);
    let uid = dockerfile_user();
    assert_ne!(uid, 0);
    for (doc, c, name) in our_containers(&docs) {
        let sc = &c["securityContext"];
        let what = format!("{} container {name}", name_of(doc));
        assert_eq!(sc["runAsNonRoot"], true, "{what}");
        assert_eq!(sc["runAsUser"], uid, "{what}: the image's USER");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}");
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{what}");
        assert!(
            sc["capabilities"]["add"].is_null(),
            "{what} adds capabilities"
        );
        let seccomp = pod_spec(doc).unwrap()["securityContext"]["seccompProfile"]["type"]
            .as_str()
            .or(sc["seccompProfile"]["type"].as_str());
        assert_eq!(seccomp, Some("RuntimeDefault"), "{what}");
    }
    let pdbs: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "PodDisruptionBudget")
        .collect();
    for doc in &docs {
        let Some(spec) = pod_spec(doc) else { continue };
        let all = spec["containers"]
            .as_array()
            .into_iter()
            .chain(spec["initContainers"].as_array())
            .flatten();
        for c in all {
            let r = &c["resources"];
            let ours = OURS.iter().any(|b| {
                c["command"][0]
                    .as_str()
                    .is_some_and(|p| p.ends_with(&format!("/{b}")))
            });
            if ours {
                for k in ["requests", "limits"] {
                    for res in ["cpu", "memory"] {
                        assert!(
                            r[k][res].is_string(),
                            "{} container {}: no {k}.{res}",
                            name_of(doc),
                            c["name"]
                        );
                    }
                }
            }
        }
        if doc["kind"] == "Deployment" && doc["spec"]["replicas"].as_u64().unwrap_or(1) > 1 {
            let labels = &doc["spec"]["selector"]["matchLabels"];
            let keys: BTreeSet<&str> = spec["topologySpreadConstraints"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| &t["labelSelector"]["matchLabels"] == labels)
                .filter_map(|t| t["topologyKey"].as_str())
                .collect();
            assert_eq!(
                keys,
                BTreeSet::from(["kubernetes.io/hostname", "topology.kubernetes.io/zone"]),
                "{} is not spread over nodes and zones",
                name_of(doc)
            );
            assert!(
                pdbs.iter()
                    .any(|p| &p["spec"]["selector"]["matchLabels"] == labels
                        && p["metadata"]["namespace"] == doc["metadata"]["namespace"]),
                "no PodDisruptionBudget for {}",
                name_of(doc)
            );
        }
    }
    // The control path: the apiserver's egress, the agents, the seed's
    // nodeport-proxy and the node tunnel.
    for (doc, _, name) in our_containers(&docs) {
        if name != "lb-updater" {
            let pc = pod_spec(doc).unwrap()["priorityClassName"].as_str();
            assert!(
                matches!(pc, Some("system-cluster-critical" | "system-node-critical")),
                "{}: priority class {pc:?}",
                name_of(doc)
            );
        }
    }
}

/// The keepalive the manifests pass is the one the docs promise: a frozen
/// agent (server side) or server (agent side) is found within 30 s, PING
/// interval plus its timeout, flags as deployed over the binaries' defaults.
#[tokio::test]
async fn keepalive_as_deployed_finds_a_frozen_peer_within_30_seconds() {
    integration_tests::k8s::bins();
    let docs = documents(&render().await);
    let mut seen = BTreeSet::new();
    for (doc, c, name) in our_containers(&docs) {
        if name != "proxy-server" && name != "proxy-agent" {
            continue;
        }
        let args = argv(c);
        let v = flag_set(&name)
            .unwrap()
            .parse(args.iter().map(String::as_str))
            .unwrap();
        // The agent raises a keepalive below 10 s to 10 s, as grpc-go does.
        let ping = v.duration("keepalive-time").max(Duration::from_secs(10));
        let found = ping + v.duration("keepalive-timeout");
        assert!(
            found <= Duration::from_secs(30),
            "{} {name}: a frozen peer is found after {found:?}",
            name_of(doc)
        );
        seen.insert(name);
    }
    assert_eq!(seen.len(), 2);
}

/// The sidecar's readiness probe answers 200 on a proxy-server that has no
/// agent (a new cluster must become ready), its agent-connected readiness
/// is still there, and the admin port as deployed serves /metrics on an
/// address that is not 127.0.0.1.
#[tokio::test]
async fn proxy_server_probes_and_metrics_port_fit_the_sidecar() {
    use integration_tests::procs::loopback;
    integration_tests::k8s::bins();
    let docs = documents(&render().await);
    let (_, c, _) = our_containers(&docs)
        .into_iter()
        .find(|(_, _, n)| n == "proxy-server")
        .unwrap();
    let health_port = flag_value(c, "health-port").unwrap();
    let probe = |kind: &str| {
        let p = &c[kind]["httpGet"];
        assert_eq!(p["port"].to_string(), health_port, "{kind} port");
        p["path"].as_str().unwrap().to_string()
    };
    let (readiness, liveness) = (probe("readinessProbe"), probe("livenessProbe"));
    let admin_bind = flag_value(c, "admin-bind-address").unwrap();
    let admin_port = flag_value(c, "admin-port").unwrap();
    let ports: Vec<String> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].to_string())
        .collect();
    assert!(
        ports.contains(&admin_port),
        "admin port {admin_port} not declared: {ports:?}"
    );

    let pki = integration_tests::certs::Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (mut server, _, addrs) = integration_tests::procs::server_on_socket(
        &pki,
        dir.path(),
        &[format!("--admin-bind-address={admin_bind}")],
    )
    .await;
    let health = loopback(&addrs["health"]);
    for path in [&readiness, &liveness] {
        let (status, body) = integration_tests::http_get(health, path).await;
        assert_eq!(status, 200, "{path} without an agent: {body}");
    }
    assert_eq!(
        integration_tests::http_get(health, "/readyz").await.0,
        500,
        "agent-connected readiness is still available"
    );
    // 127.0.0.2 is a local address a socket bound to 127.0.0.1 does not
    // answer on: it stands for the pod IP.
    let mut admin = loopback(&addrs["admin"]);
    admin.set_ip([127, 0, 0, 2].into());
    let (status, body) = integration_tests::http_get(admin, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("konnectivity_network_proxy_server_ready_backends"),
        "{body}"
    );
    server.signal(15);
    assert_eq!(server.wait_exit().await, Some(0));
}

/// `kubectl <verb> --dry-run=server --validate=strict -f -`: admission and
/// strict field validation, nothing stored.
async fn dry_run(cluster: &Cluster, verb: &str, objects: &str) -> (Option<i32>, String, String) {
    cluster
        .kubectl_stdin(
            &[verb, "--dry-run=server", "--validate=strict", "-f", "-"],
            Some(objects.as_bytes()),
        )
        .await
}

/// Apiserver objects as a `List` for `kubectl ... -f -`.
fn list(items: Vec<Value>) -> String {
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// The PodSecurity violation categories in an apiserver message, e.g.
/// `host namespaces (hostNetwork=true), unrestricted capabilities (...)` →
/// {"host namespaces", "unrestricted capabilities"}.
fn violations(message: &str) -> BTreeSet<String> {
    let Some((_, rest)) = message.split_once("PodSecurity \"restricted:latest\": ") else {
        return BTreeSet::new();
    };
    let rest = rest.lines().next().unwrap_or_default();
    let mut out = BTreeSet::new();
    let mut depth = 0usize;
    let mut current = String::new();
    for ch in rest.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.insert(current.trim().to_string());
                current.clear();
            }
            _ if depth == 0 => current.push(ch),
            _ => {}
        }
    }
    if !current.trim().is_empty() {
        out.insert(current.trim().to_string());
    }
    out
}

/// What tunnel-agent's pod needs beyond `restricted`, and nothing else:
/// hostNetwork, and KKP's network-interface-manager (NET_ADMIN as root).
fn tunnel_agent_exceptions() -> BTreeSet<String> {
    [
        "host namespaces",
        "unrestricted capabilities",
        "runAsNonRoot != true",
        "runAsUser=0",
    ]
    .map(String::from)
    .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restricted_admission_and_schema_validation_on_a_real_apiserver() {
    integration_tests::k8s::bins();
    let _w = watchdog(Duration::from_secs(300));
    let text = render().await;
    let docs = documents(&text);
    let cluster = Cluster::start(ClusterOpts::default()).await;

    // Namespaces for real (a dry-run namespace admits nothing), then
    // `restricted` enforced everywhere, also where we deploy into kube-system.
    let namespaces: Vec<Value> = docs
        .iter()
        .filter(|d| d["kind"] == "Namespace")
        .cloned()
        .collect();
    assert!(!namespaces.is_empty());
    for ns in &namespaces {
        assert_eq!(
            ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
            "restricted",
            "{}",
            name_of(ns)
        );
    }
    let (code, out, err) = cluster
        .kubectl_stdin(&["apply", "-f", "-"], Some(list(namespaces).as_bytes()))
        .await;
    assert_eq!(code, Some(0), "{err}{out}");
    cluster
        .kubectl_ok(&[
            "label",
            "namespace",
            "kube-system",
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/warn=restricted",
        ])
        .await;

    let is_tunnel_agent = |d: &Value| {
        pod_spec(d).is_some_and(|s| {
            s["containers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["command"][0] == "/tunnel-agent")
        })
    };
    // Everything but the node agent: accepted, with no PodSecurity warning
    // (the apiserver warns about workload templates, it enforces on Pods).
    let rest: Vec<Value> = docs
        .iter()
        .filter(|d| d["kind"] != "Namespace" && !is_tunnel_agent(d))
        .cloned()
        .collect();
    let (code, out, err) = dry_run(&cluster, "apply", &list(rest)).await;
    assert_eq!(code, Some(0), "dry run failed:\n{err}\n{out}");
    assert!(!err.contains("Warning"), "{err}");

    // Each pod template as a Pod: enforcement proper.
    let mut refused = BTreeMap::new();
    for doc in docs.iter().filter(|d| d["kind"] != "Pod") {
        let Some(spec) = pod_spec(doc) else { continue };
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": doc["metadata"]["name"],
                "namespace": doc["metadata"]["namespace"],
                "labels": doc["spec"]["template"]["metadata"]["labels"],
            },
            "spec": spec,
        });
        let (code, out, err) = dry_run(&cluster, "create", &pod.to_string()).await;
        if code != Some(0) {
            refused.insert(name_of(doc), format!("{err}{out}"));
        } else {
            assert!(
                !is_tunnel_agent(doc),
                "{} admitted as restricted",
                name_of(doc)
            );
        }
    }
    let (who, why) = refused
        .pop_first()
        .expect("tunnel-agent's pod was admitted");
    assert!(refused.is_empty(), "refused as well: {refused:#?}");
    assert!(who.starts_with("DaemonSet kube-system/"), "{who}: {why}");
    assert_eq!(violations(&why), tunnel_agent_exceptions(), "{why}");

    // The node agent's DaemonSet itself is valid; its template draws a
    // warning naming the same exceptions.
    let ds: Vec<Value> = docs
        .iter()
        .filter(|d| is_tunnel_agent(d))
        .cloned()
        .collect();
    let (code, out, err) = dry_run(&cluster, "apply", &list(ds)).await;
    assert_eq!(code, Some(0), "{err}{out}");
    assert_eq!(violations(&err), tunnel_agent_exceptions(), "{err}");

    // Schema validation with kubeconform, schemas from this apiserver.
    let schemas = tempfile::tempdir().unwrap();
    write_schemas(&cluster, &docs, schemas.path()).await;
    let (ok, report) = kubeconform(schemas.path(), &text).await;
    assert!(ok, "kubeconform:\n{report}");
    assert!(
        report.contains(&format!("Valid: {}", docs.len())),
        "{report}"
    );
    // The validator sees a misspelt field.
    let typo = text.replacen("readOnlyRootFilesystem", "readOnlyRootFileSystem", 1);
    let (ok, report) = kubeconform(schemas.path(), &typo).await;
    assert!(!ok && report.contains("readOnlyRootFileSystem"), "{report}");

    cluster.stop().await;
}

async fn kubeconform(schemas: &Path, manifests: &str) -> (bool, String) {
    use tokio::io::AsyncWriteExt;
    let bin = &bins().kubeconform;
    let mut child = tokio::process::Command::new(bin)
        .args(["-strict", "-summary", "-schema-location"])
        .arg(format!(
            "{}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
            schemas.display()
        ))
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(manifests.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// kubeconform's file name for a kind: `deployment-apps-v1.json`,
/// `service-v1.json`, `clusterrole-rbac-v1.json`.
fn schema_file(kind: &str, api_version: &str) -> String {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let group = group.split('.').next().unwrap_or_default();
    if group.is_empty() {
        format!("{}-{version}.json", kind.to_lowercase())
    } else {
        format!("{}-{group}-{version}.json", kind.to_lowercase())
    }
}

/// Standalone JSON schemas (draft 2020-12) for every kind in `docs`, from
/// the apiserver's OpenAPI v3, in kubeconform's strict form: objects with
/// properties take no others, int-or-string fields take either.
async fn write_schemas(cluster: &Cluster, docs: &[Value], dir: &Path) {
    let get = |path: String| {
        let client = cluster.client.clone();
        async move {
            let req = http::Request::get(path).body(Vec::new()).unwrap();
            let text = client.request_text(req).await.unwrap();
            serde_json::from_str::<Value>(&text).unwrap()
        }
    };
    let index = get("/openapi/v3".into()).await;
    let kinds: BTreeSet<(String, String)> = docs
        .iter()
        .map(|d| {
            (
                d["apiVersion"].as_str().unwrap().to_string(),
                d["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (api_version, kind) in kinds {
        let path = if api_version.contains('/') {
            format!("apis/{api_version}")
        } else {
            format!("api/{api_version}")
        };
        let url = index["paths"][&path]["serverRelativeURL"]
            .as_str()
            .unwrap_or_else(|| panic!("no OpenAPI v3 document for {path}"))
            .to_string();
        let doc = get(url).await;
        let all = doc["components"]["schemas"].as_object().unwrap();
        let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
        let root = all
            .iter()
            .find(|(_, s)| {
                s["x-kubernetes-group-version-kind"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|g| g["group"] == group && g["version"] == version && g["kind"] == kind)
            })
            .map(|(n, _)| n.clone())
            .unwrap_or_else(|| panic!("no schema for {kind} {api_version}"));
        // The definitions the root refers to, transitively.
        let mut needed = BTreeSet::from([root.clone()]);
        let mut todo = vec![root.clone()];
        while let Some(n) = todo.pop() {
            let mut refs = Vec::new();
            collect_refs(&all[&n], &mut refs);
            for r in refs {
                if needed.insert(r.clone()) {
                    todo.push(r);
                }
            }
        }
        let defs: serde_json::Map<String, Value> = needed
            .iter()
            .map(|n| (n.clone(), strict(&all[n])))
            .collect();
        let mut schema = strict(&all[&root]);
        schema["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
        schema["$defs"] = Value::Object(defs);
        std::fs::write(
            dir.join(schema_file(&kind, &api_version)),
            schema.to_string(),
        )
        .unwrap();
    }
}

const REF_PREFIX: &str = "#/components/schemas/";

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref").and_then(Value::as_str)
                && let Some(n) = r.strip_prefix(REF_PREFIX)
            {
                out.push(n.to_string());
            }
            m.values().for_each(|x| collect_refs(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| collect_refs(x, out)),
        _ => {}
    }
}

fn strict(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            if m.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                return json!({"oneOf": [{"type": "string"}, {"type": "integer"}]});
            }
            let mut out: serde_json::Map<String, Value> = m
                .iter()
                .map(|(k, x)| match (k.as_str(), x.as_str()) {
                    ("$ref", Some(r)) if r.starts_with(REF_PREFIX) => (
                        k.clone(),
                        json!(format!("#/$defs/{}", &r[REF_PREFIX.len()..])),
                    ),
                    _ => (k.clone(), strict(x)),
                })
                .collect();
            if out.contains_key("properties") && !out.contains_key("additionalProperties") {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(strict).collect()),
        _ => v.clone(),
    }
}

#[test]
fn violation_categories_are_parsed() {
    let msg = r#"Error from server (Forbidden): pods "envoy-agent" is forbidden: violates PodSecurity "restricted:latest": host namespaces (hostNetwork=true), unrestricted capabilities (containers "a", "b" must not include "NET_ADMIN" in securityContext.capabilities.add), runAsUser=0 (containers "a", "b" must not set runAsUser=0)"#;
    assert_eq!(
        violations(msg),
        [
            "host namespaces",
            "runAsUser=0",
            "unrestricted capabilities"
        ]
        .map(String::from)
        .into()
    );
    assert_eq!(
        schema_file("Deployment", "apps/v1"),
        "deployment-apps-v1.json"
    );
    assert_eq!(schema_file("Service", "v1"), "service-v1.json");
    assert_eq!(
        schema_file("ClusterRole", "rbac.authorization.k8s.io/v1"),
        "clusterrole-rbac-v1.json"
    );
}

// ---------------------------------------------------------------- images

/// Docker's name for this machine's architecture.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no image architecture for {other}"),
    }
}

/// The binaries the images copy, as the Dockerfile's build stage makes them
/// (`deploy/docker/build-binaries.sh`, which scripts/test runs and names in
/// `IMAGE_BIN_DIR`; built here otherwise).
fn image_bins() -> PathBuf {
    if let Some(d) = std::env::var_os("IMAGE_BIN_DIR") {
        return PathBuf::from(d);
    }
    let status = std::process::Command::new(repo().join("deploy/docker/build-binaries.sh"))
        .status()
        .unwrap();
    assert!(status.success(), "deploy/docker/build-binaries.sh failed");
    repo().join("target/image").join(host_arch())
}

/// One `FROM … AS name` stage of the Dockerfile, its instructions with
/// continuation lines joined.
#[derive(Debug, Default)]
struct Stage {
    from: String,
    platform: String,
    lines: Vec<String>,
}

fn dockerfile_stages() -> (BTreeMap<String, String>, BTreeMap<String, Stage>) {
    let text = std::fs::read_to_string(repo().join("deploy/docker/Dockerfile")).unwrap();
    let mut joined = Vec::new();
    let mut cur = String::new();
    for l in text.lines() {
        let l = l.trim();
        if l.starts_with('#') || (l.is_empty() && cur.is_empty()) {
            continue;
        }
        if let Some(part) = l.strip_suffix('\\') {
            cur.push_str(part);
            cur.push(' ');
        } else {
            cur.push_str(l);
            joined.push(std::mem::take(&mut cur));
        }
    }
    let mut args = BTreeMap::new();
    let mut stages: BTreeMap<String, Stage> = BTreeMap::new();
    let mut current: Option<String> = None;
    for l in joined {
        let (op, rest) = l.split_once(' ').unwrap_or((&l, ""));
        match (op, &current) {
            ("ARG", None) => {
                let (k, v) = rest.split_once('=').unwrap_or((rest, ""));
                args.insert(k.to_string(), v.to_string());
            }
            ("FROM", _) => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                let name = words.last().unwrap().to_string();
                assert_eq!(words[words.len() - 2], "AS", "unnamed stage: {l}");
                stages.insert(
                    name.clone(),
                    Stage {
                        from: words[words.len() - 3].to_string(),
                        platform: words
                            .iter()
                            .find_map(|w| w.strip_prefix("--platform="))
                            .unwrap_or_default()
                            .to_string(),
                        lines: Vec::new(),
                    },
                );
                current = Some(name);
            }
            (_, Some(s)) => stages.get_mut(s).unwrap().lines.push(l.clone()),
            _ => {}
        }
    }
    (args, stages)
}

/// Section names of a 64-bit little-endian ELF file.
fn elf_sections(bytes: &[u8]) -> Vec<String> {
    assert_eq!(&bytes[..4], b"\x7fELF", "not an ELF file");
    assert_eq!((bytes[4], bytes[5]), (2, 1), "not 64-bit little-endian");
    let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let header = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(header(shstrndx) + 0x18);
    (0..shnum)
        .map(|i| {
            let start = strtab + u32_at(header(i));
            let end = start + bytes[start..].iter().position(|b| *b == 0).unwrap();
            String::from_utf8_lossy(&bytes[start..end]).into_owned()
        })
        .collect()
}

/// Docker's .dockerignore matching, for the patterns this repository uses:
/// anchored at the context root, `*` within one path element, `**/` any
/// number of leading directories; a match excludes everything below it.
fn docker_ignores(pattern: &str, path: &str) -> bool {
    fn matches(pat: &[&str], path: &[&str]) -> bool {
        match (pat.first(), path.first()) {
            (None, _) => true, // a directory excludes its contents
            (Some(&"**"), _) => (0..=path.len()).any(|skip| matches(&pat[1..], &path[skip..])),
            (Some(p), Some(s)) => glob(p, s) && matches(&pat[1..], &path[1..]),
            (Some(_), None) => false,
        }
    }
    fn glob(p: &str, s: &str) -> bool {
        match p.split_once('*') {
            None => p == s,
            Some((pre, post)) => {
                s.starts_with(pre)
                    && (post.is_empty() && !pre.is_empty() || s.len() >= pre.len() + post.len())
                    && (0..=s.len() - pre.len()).any(|i| glob(post, &s[pre.len() + i..]))
            }
        }
    }
    let pat: Vec<&str> = pattern.trim_end_matches('/').split('/').collect();
    let path: Vec<&str> = path.split('/').collect();
    matches(&pat, &path)
}

#[test]
fn dockerignore_matching_is_dockers() {
    assert!(docker_ignores("target", "target/debug/x"));
    assert!(!docker_ignores("target", "server/target/x"));
    assert!(docker_ignores("**/fuzz/target", "server/fuzz/target/a"));
    assert!(docker_ignores("**/fuzz/target", "fuzz/target"));
    assert!(!docker_ignores("**/fuzz/target", "server/fuzz/corpus/a"));
    assert!(docker_ignores("*.profraw", "default.profraw"));
    assert!(!docker_ignores("*.profraw", "server/default.profraw"));
}

/// The Dockerfile builds every binary with the script scripts/test runs,
/// copies each to the path the manifests run, as the user the manifests
/// name, with OCI labels; the binaries that script makes are stripped,
/// print the version the images are tagged with, and run as that user; the
/// build context leaves out target/ and .git but nothing the build reads.
#[test]
fn images_ship_the_binaries_the_test_command_builds() {
    let (args, stages) = dockerfile_stages();
    let build = &stages["build"];
    assert_eq!(build.from, "${RUST_IMAGE}");
    assert_eq!(
        build.platform, "$BUILDPLATFORM",
        "the build stage cross-compiles"
    );
    assert!(
        build
            .lines
            .iter()
            .any(|l| l.ends_with("deploy/docker/build-binaries.sh \"$TARGETARCH\" /out")),
        "the build stage must run deploy/docker/build-binaries.sh: {:#?}",
        build.lines
    );
    let script = std::fs::read_to_string(repo().join("deploy/docker/build-binaries.sh")).unwrap();
    let script_bins: BTreeSet<&str> = script
        .lines()
        .find_map(|l| l.strip_prefix("bins=("))
        .unwrap()
        .trim_end_matches(')')
        .split_whitespace()
        .collect();
    assert_eq!(script_bins, BTreeSet::from(OURS));

    let runtime = &stages["runtime"];
    assert_eq!(runtime.from, "${BASE_IMAGE}");
    assert!(
        args["BASE_IMAGE"].starts_with("gcr.io/distroless/"),
        "{args:?}"
    );
    assert!(args["BASE_IMAGE"].ends_with(":nonroot"), "{args:?}");
    let uid = dockerfile_user();
    assert!(runtime.lines.contains(&format!("USER {uid}:{uid}")));
    let labels = runtime.lines.join(" ");
    for l in ["version", "revision", "created", "licenses"] {
        assert!(
            labels.contains(&format!("org.opencontainers.image.{l}=")),
            "label {l}: {labels}"
        );
    }
    let targets: BTreeSet<&str> = stages
        .iter()
        .filter(|(_, s)| s.from == "runtime")
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(targets, BTreeSet::from(OURS));

    let dir = image_bins();
    for name in OURS {
        let lines = &stages[name].lines;
        assert!(
            lines.contains(&format!("COPY --from=build /out/{name} /{name}")),
            "{name}: {lines:#?}"
        );
        assert!(
            lines.contains(&format!("ENTRYPOINT [\"/{name}\"]")),
            "{name}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("org.opencontainers.image.title=\"{name}\""))),
            "{name}"
        );
        let path = dir.join(name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let sections = elf_sections(&bytes);
        assert!(
            !sections
                .iter()
                .any(|s| s == ".symtab" || s.starts_with(".debug")),
            "{name} is not stripped: {sections:?}"
        );
        eprintln!("{name}: {} bytes", bytes.len());
        // Runs as the image's user, and says the version the tag carries.
        let out = std::process::Command::new("setpriv")
            .args([
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".into(),
                "--".into(),
            ])
            .arg(&path)
            .arg("--version")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name} --version as {uid}: {out:?}");
        assert!(
            text.starts_with(&format!("{name} {} (commit ", env!("CARGO_PKG_VERSION"))),
            "{text}"
        );
    }

    // The build context.
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for must in ["target", ".git"] {
        assert!(
            patterns.contains(&must),
            ".dockerignore must leave out {must}"
        );
    }
    let tracked = std::process::Command::new("git")
        .args(["ls-files"])
        .current_dir(repo())
        .output()
        .unwrap();
    let tracked = String::from_utf8(tracked.stdout).unwrap();
    assert!(tracked.contains("Cargo.lock"), "git ls-files: {tracked}");
    for file in tracked.lines() {
        if let Some(p) = patterns.iter().find(|p| docker_ignores(p, file)) {
            panic!(".dockerignore pattern {p} leaves out {file}, which git tracks");
        }
    }
}

/// The volumes of a pod spec, by name.
fn volumes(spec: &Value) -> BTreeMap<String, Value> {
    spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| (v["name"].as_str().unwrap().to_string(), v.clone()))
        .collect()
}

/// (kind, name) of every Secret and ConfigMap a volume draws from.
fn volume_objects(v: &Value) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let mut add = |src: &Value| {
        if let Some(n) = src["secret"]["secretName"]
            .as_str()
            .or(src["secret"]["name"].as_str())
        {
            out.push(("secret", n.to_string()));
        }
        if let Some(n) = src["configMap"]["name"].as_str() {
            out.push(("configmap", n.to_string()));
        }
    };
    add(v);
    for s in v["projected"]["sources"].as_array().into_iter().flatten() {
        add(s);
    }
    out
}

/// What an operator runs, unedited, on a fresh cluster (docs/kubernetes.md,
/// "Deployment"): `deploy/konnectivity/certs.sh`, then `kubectl apply -k
/// deploy/`, for real, not a dry run. Then: every Secret, ConfigMap and
/// ServiceAccount a workload mounts or runs as exists, holding every key a
/// flag names under its mount path; the agent port's Service selects the
/// kube-apiserver pods, targets the sidecar's `--agent-port`, publishes
/// not-ready addresses and is what the agents dial; the certificate names
/// that Service; and proxy-server and proxy-agent started on those very
/// files (the agent port reached by an extra address given to the script)
/// connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_unedited_every_mounted_object_exists() {
    integration_tests::k8s::bins();
    let _w = watchdog(Duration::from_secs(300));
    let docs = documents(&render().await);
    let cluster = Cluster::start(ClusterOpts::default()).await;
    let script = tokio::process::Command::new(repo().join("deploy/konnectivity/certs.sh"))
        .arg("127.0.0.1")
        .env("KUBECTL", &bins().kubectl)
        .env("KUBECONFIG", &cluster.admin_kubeconfig)
        .output()
        .await
        .unwrap();
    assert!(script.status.success(), "certs.sh: {script:?}");
    let (code, out, err) = cluster
        .kubectl(&["apply", "-k", repo().join("deploy").to_str().unwrap()])
        .await;
    assert_eq!(code, Some(0), "kubectl apply -k deploy/: {err}{out}");
    // A second run of the script keeps what exists.
    let again = tokio::process::Command::new(repo().join("deploy/konnectivity/certs.sh"))
        .env("KUBECTL", &bins().kubectl)
        .env("KUBECONFIG", &cluster.admin_kubeconfig)
        .output()
        .await
        .unwrap();
    assert!(
        again.status.success() && String::from_utf8_lossy(&again.stderr).contains("left as it is"),
        "{again:?}"
    );

    let get = |kind: &'static str, ns: String, name: String| {
        let cluster = &cluster;
        async move {
            let (code, out, err) = cluster
                .kubectl(&["-n", &ns, "get", kind, &name, "-o", "json"])
                .await;
            assert_eq!(
                code,
                Some(0),
                "{kind} {ns}/{name} is mounted but missing: {err}"
            );
            serde_json::from_str::<Value>(&out).unwrap()
        }
    };
    let mut checked = BTreeSet::new();
    for doc in &docs {
        let Some(spec) = pod_spec(doc) else { continue };
        let ns = doc["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        if let Some(sa) = spec["serviceAccountName"].as_str() {
            get("serviceaccount", ns.clone(), sa.to_string()).await;
            checked.insert(format!("serviceaccount {ns}/{sa}"));
        }
        let vols = volumes(spec);
        for v in vols.values() {
            for (kind, name) in volume_objects(v) {
                get(kind, ns.clone(), name.clone()).await;
                checked.insert(format!("{kind} {ns}/{name}"));
            }
        }
        // Every file a flag names under a Secret or ConfigMap mount is a
        // key of that object.
        let containers = spec["containers"]
            .as_array()
            .into_iter()
            .chain(spec["initContainers"].as_array())
            .flatten();
        for c in containers {
            let mounts: Vec<(&str, &str)> = c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| {
                    (
                        m["mountPath"].as_str().unwrap(),
                        m["name"].as_str().unwrap(),
                    )
                })
                .collect();
            for arg in argv(c) {
                let Some((_, path)) = arg.split_once("=/") else {
                    continue;
                };
                let path = format!("/{path}");
                let Some((dir, vol)) = mounts
                    .iter()
                    .filter(|(dir, _)| path.starts_with(&format!("{dir}/")))
                    .max_by_key(|(dir, _)| dir.len())
                else {
                    continue;
                };
                let key = &path[dir.len() + 1..];
                for (kind, name) in volume_objects(&vols[*vol]) {
                    let obj = get(kind, ns.clone(), name.clone()).await;
                    assert!(
                        obj["data"].get(key).is_some(),
                        "{} passes {arg}: {kind} {ns}/{name} has no key {key}",
                        name_of(doc)
                    );
                }
            }
        }
    }
    for want in [
        "secret kube-system/konnectivity-server-tls",
        "configmap kube-system/konnectivity-ca",
        "configmap kube-system/egress-selector-configuration",
        "serviceaccount kube-system/konnectivity-server",
        "serviceaccount nodeport-proxy/nodeport-proxy",
    ] {
        assert!(checked.contains(want), "{want} not mounted: {checked:#?}");
    }

    // The agent port's Service, as applied.
    let (doc, server, _) = our_containers(&docs)
        .into_iter()
        .find(|(_, _, n)| n == "proxy-server")
        .unwrap();
    let (_, agent, _) = our_containers(&docs)
        .into_iter()
        .find(|(_, _, n)| n == "proxy-agent")
        .unwrap();
    assert_eq!(server["restartPolicy"], "Always", "a native sidecar");
    let agent_port = flag_value(server, "agent-port").unwrap();
    let host = flag_value(agent, "proxy-server-host").unwrap();
    let (svc_name, svc_ns) = host
        .strip_suffix(".svc")
        .and_then(|h| h.split_once('.'))
        .unwrap_or_else(|| panic!("agents dial {host}, not a Service"));
    let svc = get("service", svc_ns.to_string(), svc_name.to_string()).await;
    assert_eq!(svc["spec"]["publishNotReadyAddresses"], true, "{svc}");
    let labels = &doc["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "the Service selects the kube-apiserver pods");
    }
    let dialed: u64 = flag_value(agent, "proxy-server-port")
        .unwrap()
        .parse()
        .unwrap();
    let port = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"].as_u64() == Some(dialed))
        .unwrap_or_else(|| panic!("no Service port the agents dial: {svc}"));
    let target = server["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port["targetPort"])
        .unwrap();
    assert_eq!(target["containerPort"].to_string(), agent_port);

    // The certificate names that Service, and the agents' CA verifies it.
    let dir = tempfile::tempdir().unwrap();
    let tls = get(
        "secret",
        "kube-system".into(),
        "konnectivity-server-tls".into(),
    )
    .await;
    let ca = get("configmap", "kube-system".into(), "konnectivity-ca".into()).await;
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    for key in ["tls.crt", "tls.key"] {
        let bytes = b64.decode(tls["data"][key].as_str().unwrap()).unwrap();
        std::fs::write(dir.path().join(key), bytes).unwrap();
    }
    std::fs::write(
        dir.path().join("ca.crt"),
        ca["data"]["ca.crt"].as_str().unwrap(),
    )
    .unwrap();
    let sans = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
        .arg(dir.path().join("tls.crt"))
        .output()
        .unwrap();
    let sans = String::from_utf8_lossy(&sans.stdout).to_string();
    assert!(
        sans.contains(&format!("DNS:{host}")) && sans.contains("IP Address:127.0.0.1"),
        "{sans}"
    );
    let identity = integration_tests::k8s::Cert {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    let mut server =
        integration_tests::k8s::ProxyServer::start(dir.path(), "deployed", "grpc", &identity, &[])
            .await;
    let mut agent = integration_tests::k8s::ProxyAgent::start(
        "deployed",
        server.agent_addr,
        &dir.path().join("ca.crt"),
        &[],
    )
    .await;
    agent.wait_servers(1, Duration::from_secs(30)).await;
    agent.stop().await;
    server.child.stop().await;
    cluster.stop().await;
}
