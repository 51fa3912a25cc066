//! A real Kubernetes control plane for the tests: etcd and kube-apiserver
//! (built by `tests/k8s/build.sh` from the Go module proxy, cached), their
//! own CA and certificates, everything on loopback with picked ports and
//! temp dirs, readiness from `/readyz` and log lines, and a kubelet stand-in
//! on 127.0.0.2 that only our Konnectivity agent is told about.
//!
//! Every child runs under `setpriv --pdeathsig KILL`, so even a test process
//! that exits abruptly leaves nothing behind; [`Cluster::stop`] and
//! [`Child::stop`] end children with SIGTERM (then SIGKILL) and reap them.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rcgen::KeyPair;
use tokio::process::Command;
use tokio::sync::mpsc;

/// The address of the kubelet stand-in: loopback, but only the agent is told
/// about it (kube-apiserver reaches it through the tunnel).
pub const KUBELET_IP: &str = "127.0.0.2";
/// Longest a test waits for a child's readiness line.
const PATIENCE: Duration = Duration::from_secs(90);

/// Paths of the harness binaries.
#[derive(Debug, Clone)]
pub struct Bins {
    pub kube_apiserver: PathBuf,
    pub kubectl: PathBuf,
    pub etcd: PathBuf,
    pub kubelet: PathBuf,
    /// The schema validator for deploy/'s manifests.
    pub kubeconform: PathBuf,
    /// kube-apiserver's minor version (`--version`), for the flags that
    /// differ between the releases of the version matrix.
    pub apiserver_minor: u32,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Builds (once per process; Go's cache makes it quick after the first
/// time) and returns the harness binaries. `K8S_BIN_DIR` points at a
/// prebuilt set; `K8S_APISERVER_DIR`, at a kube-apiserver and kubectl of
/// another release (tests/k8s/build-matrix.sh) used instead of its own.
pub fn bins() -> &'static Bins {
    static BINS: OnceLock<Bins> = OnceLock::new();
    BINS.get_or_init(|| {
        let dir = match std::env::var_os("K8S_BIN_DIR") {
            Some(d) => PathBuf::from(d),
            None => {
                let dir = repo_root().join("tests/k8s/bin");
                let status = std::process::Command::new(repo_root().join("tests/k8s/build.sh"))
                    .env("K8S_BIN_DIR", &dir)
                    .status()
                    .expect("running tests/k8s/build.sh");
                assert!(status.success(), "tests/k8s/build.sh failed");
                dir
            }
        };
        // The version matrix (tests/k8s/matrix.sh): kube-apiserver and
        // kubectl of another Kubernetes release, the rest from `dir`.
        let apiserver_dir = std::env::var_os("K8S_APISERVER_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.clone());
        let b = Bins {
            kube_apiserver: apiserver_dir.join("kube-apiserver"),
            kubectl: apiserver_dir.join("kubectl"),
            etcd: dir.join("etcd"),
            kubelet: dir.join("kubelet"),
            kubeconform: dir.join("kubeconform"),
            apiserver_minor: 0,
        };
        for p in [
            &b.kube_apiserver,
            &b.kubectl,
            &b.etcd,
            &b.kubelet,
            &b.kubeconform,
        ] {
            assert!(p.exists(), "{} missing", p.display());
        }
        let out = std::process::Command::new(&b.kube_apiserver)
            .arg("--version")
            .output()
            .expect("kube-apiserver --version");
        let text = String::from_utf8_lossy(&out.stdout);
        // "Kubernetes v1.37.2"
        let minor = text
            .trim()
            .rsplit(' ')
            .next()
            .and_then(|v| v.split('.').nth(1))
            .and_then(|m| m.parse().ok());
        Bins {
            apiserver_minor: minor
                .unwrap_or_else(|| panic!("kube-apiserver --version printed {text:?}")),
            ..b
        }
    })
}

/// A binary of this workspace (`target/<profile>/<name>`).
pub fn ours(name: &str) -> PathBuf {
    crate::procs::binary(name)
}

/// A free loopback port (bound and released; the caller binds it next).
pub fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// ---------------------------------------------------------------- PKI

/// The cluster's CA and the certificates of everything around it: the
/// local stack's PKI, panicking instead of returning errors.
pub struct Pki(local_stack::pki::Pki);

pub type Cert = local_stack::pki::Identity;

impl Pki {
    pub fn new(dir: &Path) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        Pki(local_stack::pki::Pki::create(dir).unwrap())
    }

    pub fn ca(&self) -> PathBuf {
        self.0.ca()
    }

    /// A serving certificate for `localhost`, `127.0.0.1`, `::1` and `extra`.
    pub fn server(&self, file: &str, extra: &[&str]) -> Cert {
        self.0.server(file, extra).unwrap()
    }

    /// A client certificate: user `cn` in groups `orgs`.
    pub fn client(&self, file: &str, cn: &str, orgs: &[&str]) -> Cert {
        self.0.user(file, cn, orgs).unwrap()
    }
}

// ---------------------------------------------------------------- children

/// A child process with its output captured line by line (also kept for
/// failure messages).
pub struct Child {
    pub name: String,
    child: Option<tokio::process::Child>,
    pid: u32,
    lines: mpsc::UnboundedReceiver<String>,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Child {
    /// Starts `program` under `setpriv --pdeathsig KILL`.
    pub fn spawn(name: &str, program: &Path, args: &[String]) -> Child {
        Self::spawn_env(name, program, args, &[])
    }

    pub fn spawn_env(name: &str, program: &Path, args: &[String], env: &[(&str, &str)]) -> Child {
        let mut cmd = Command::new("setpriv");
        cmd.arg("--pdeathsig")
            .arg("KILL")
            .arg("--")
            .arg(program)
            .args(args)
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        let pid = child.id().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = {
            let log = log.clone();
            crate::procs::output_lines(&mut child, move |l| log.lock().unwrap().push(l.to_string()))
        };
        Child {
            name: name.to_string(),
            child: Some(child),
            pid,
            lines,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn log_text(&self) -> String {
        let log = self.log.lock().unwrap();
        let start = log.len().saturating_sub(200);
        log[start..].join("\n")
    }

    /// Waits for an output line containing `needle` (lines already consumed
    /// by an earlier wait are not seen again).
    pub async fn wait_line(&mut self, needle: &str) -> String {
        self.wait_line_within(needle, PATIENCE).await
    }

    pub async fn wait_line_within(&mut self, needle: &str, patience: Duration) -> String {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(l)) if l.contains(needle) => return l,
                Ok(Some(_)) => {}
                Ok(None) => panic!(
                    "{} ended before printing {needle:?}:\n{}",
                    self.name,
                    self.log_text()
                ),
                Err(_) => panic!(
                    "{} printed no {needle:?} within {patience:?}:\n{}",
                    self.name,
                    self.log_text()
                ),
            }
        }
    }

    pub fn signal(&self, sig: &str) {
        let _ = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid.to_string())
            .status();
    }

    /// Waits for the child to exit; returns its exit code.
    pub async fn wait_exit(&mut self, patience: Duration) -> Option<i32> {
        let child = self.child.as_mut()?;
        let status = tokio::time::timeout(patience, child.wait())
            .await
            .ok()?
            .ok()?;
        self.child = None;
        status.code()
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL; always reaped.
    pub async fn stop_within(&mut self, grace: Duration) -> Option<i32> {
        self.child.as_ref()?;
        self.signal("TERM");
        let child = self.child.as_mut()?;
        let code = match tokio::time::timeout(grace, child.wait()).await {
            Ok(Ok(s)) => s.code(),
            _ => {
                let _ = child.kill().await;
                None
            }
        };
        self.child = None;
        code
    }

    pub async fn stop(&mut self) -> Option<i32> {
        self.stop_within(Duration::from_secs(10)).await
    }
}

/// Whether a process with this pid still exists (zombies count as gone).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Fails the test if any of these processes still runs.
pub fn assert_gone(pids: &[(String, u32)]) {
    let left: Vec<_> = pids.iter().filter(|(_, p)| alive(*p)).collect();
    assert!(left.is_empty(), "processes left running: {left:?}");
}

// ---------------------------------------------------------------- cluster

/// How kube-apiserver reaches the cluster network.
#[derive(Debug, Clone)]
pub enum Egress {
    /// No egress configuration: kube-apiserver dials directly.
    Direct,
    /// `cluster` → our proxy-server on this Unix socket.
    Grpc(PathBuf),
    HttpConnect(PathBuf),
}

#[derive(Debug, Clone)]
pub struct ClusterOpts {
    pub egress: Egress,
    /// Extra names on the apiserver's serving certificate (SNI tests).
    pub apiserver_names: Vec<String>,
}

impl Default for ClusterOpts {
    fn default() -> Self {
        ClusterOpts {
            egress: Egress::Direct,
            apiserver_names: Vec::new(),
        }
    }
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub pki: Pki,
    pub etcd: Child,
    pub apiserver: Child,
    pub port: u16,
    pub admin_kubeconfig: PathBuf,
    pub client: kube::Client,
    pub sa_key: KeyPair,
    pub issuer: String,
    node_port_range: (u16, u16),
}

fn kubeconfig_text(server: &str, ca: &Path, cert: &Cert, tls_server_name: Option<&str>) -> String {
    let sni = tls_server_name
        .map(|n| format!("    tls-server-name: {n}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {}\n{sni}users:\n- name: u\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
        ca.display(),
        cert.cert.display(),
        cert.key.display()
    )
}

/// A window of 100 node ports per cluster, so clusters of parallel tests do
/// not hand out the same node port for listeners bound on one host.
fn node_port_window() -> (u16, u16) {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let slot = (u32::from(n) + std::process::id()) % 27;
    let start = 30000 + (slot as u16) * 100;
    (start, start + 99)
}

impl Cluster {
    pub async fn start(opts: ClusterOpts) -> Cluster {
        let bins = bins();
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new(&dir.path().join("pki"));
        let mut names: Vec<&str> = vec![
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "10.96.0.1",
        ];
        names.extend(opts.apiserver_names.iter().map(String::as_str));
        let serving = pki.server("apiserver", &names);
        let admin = pki.client("admin", "admin", &["system:masters"]);
        let kubelet_client = pki.client(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
        );
        let sa_key = KeyPair::generate().unwrap();
        std::fs::write(dir.path().join("sa.key"), sa_key.serialize_pem()).unwrap();
        std::fs::write(dir.path().join("sa.pub"), sa_key.public_key_pem()).unwrap();

        let mut etcd = Child::spawn(
            "etcd",
            &bins.etcd,
            &[format!("--data-dir={}", dir.path().join("etcd").display())],
        );
        let line = etcd.wait_line("etcd ready").await;
        let etcd_url = line.split("client=").nth(1).unwrap().trim().to_string();

        let egress_file = dir.path().join("egress.yaml");
        let egress = match &opts.egress {
            Egress::Direct => None,
            Egress::Grpc(p) => Some(("GRPC", p)),
            Egress::HttpConnect(p) => Some(("HTTPConnect", p)),
        };
        if let Some((protocol, uds)) = egress {
            std::fs::write(
                &egress_file,
                format!(
                    "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n- name: cluster\n  connection:\n    proxyProtocol: {protocol}\n    transport:\n      uds:\n        udsName: {}\n- name: controlplane\n  connection:\n    proxyProtocol: Direct\n- name: etcd\n  connection:\n    proxyProtocol: Direct\n",
                    uds.display()
                ),
            )
            .unwrap();
        }
        let issuer = "https://kubernetes.default.svc.cluster.local".to_string();
        let node_port_range = node_port_window();
        let mut attempt = 0;
        let (apiserver, port) = loop {
            attempt += 1;
            let port = free_port();
            let d = dir.path();
            let mut args = vec![
                format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", d.join("certs").display()),
                format!("--tls-cert-file={}", serving.cert.display()),
                format!("--tls-private-key-file={}", serving.key.display()),
                format!("--client-ca-file={}", pki.ca().display()),
                format!("--service-account-issuer={issuer}"),
                format!("--service-account-key-file={}", d.join("sa.pub").display()),
                format!(
                    "--service-account-signing-key-file={}",
                    d.join("sa.key").display()
                ),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                format!(
                    "--service-node-port-range={}-{}",
                    node_port_range.0, node_port_range.1
                ),
                "--authorization-mode=Node,RBAC".into(),
                "--disable-admission-plugins=ServiceAccount".into(),
                format!(
                    "--kubelet-client-certificate={}",
                    kubelet_client.cert.display()
                ),
                format!("--kubelet-client-key={}", kubelet_client.key.display()),
                format!("--kubelet-certificate-authority={}", pki.ca().display()),
                "--kubelet-preferred-address-types=InternalIP".into(),
                "--enable-priority-and-fairness=false".into(),
                "--profiling=false".into(),
                "--v=1".into(),
            ];
            if bins.apiserver_minor >= 37 {
                // 1.37 refuses a loopback --advertise-address with the
                // lease endpoint reconciler; no test reads the `kubernetes`
                // Service's endpoints.
                args.push("--endpoint-reconciler-type=none".into());
            }
            if egress.is_some() {
                args.push(format!(
                    "--egress-selector-config-file={}",
                    egress_file.display()
                ));
            }
            let mut apiserver = Child::spawn("kube-apiserver", &bins.kube_apiserver, &args);
            // Readiness below is /readyz; this only catches a lost port race.
            match tokio::time::timeout(
                Duration::from_secs(60),
                apiserver.wait_line("Serving securely on"),
            )
            .await
            {
                Ok(_) => break (apiserver, port),
                Err(_) if attempt < 3 => {
                    apiserver.stop().await;
                }
                Err(_) => panic!("kube-apiserver did not start:\n{}", apiserver.log_text()),
            }
        };
        let admin_kubeconfig = dir.path().join("admin.kubeconfig");
        std::fs::write(
            &admin_kubeconfig,
            kubeconfig_text(
                &format!("https://127.0.0.1:{port}"),
                &pki.ca(),
                &admin,
                None,
            ),
        )
        .unwrap();
        let client = client_for(&admin_kubeconfig).await;
        wait_ready(&client).await;
        Cluster {
            dir,
            pki,
            etcd,
            apiserver,
            port,
            admin_kubeconfig,
            client,
            sa_key,
            issuer,
            node_port_range,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn node_port_range(&self) -> (u16, u16) {
        self.node_port_range
    }

    /// A kubeconfig for user `cn` (groups `orgs`) at `server` (default: the
    /// apiserver), optionally with a TLS server name (SNI).
    pub fn kubeconfig_for(
        &self,
        file: &str,
        cn: &str,
        orgs: &[&str],
        server: Option<&str>,
        tls_server_name: Option<&str>,
    ) -> PathBuf {
        let cert = self.pki.client(file, cn, orgs);
        let path = self.dir.path().join(format!("{file}.kubeconfig"));
        let url = self.url();
        std::fs::write(
            &path,
            kubeconfig_text(
                server.unwrap_or(&url),
                &self.pki.ca(),
                &cert,
                tls_server_name,
            ),
        )
        .unwrap();
        path
    }

    /// The admin kubeconfig pointed elsewhere (same credentials).
    pub fn admin_kubeconfig_at(
        &self,
        file: &str,
        server: &str,
        tls_server_name: Option<&str>,
    ) -> PathBuf {
        self.kubeconfig_for(
            file,
            "admin",
            &["system:masters"],
            Some(server),
            tls_server_name,
        )
    }

    /// Runs kubectl with the admin kubeconfig; returns (exit code, stdout, stderr).
    pub async fn kubectl(&self, args: &[&str]) -> (Option<i32>, String, String) {
        self.kubectl_stdin(args, None).await
    }

    pub async fn kubectl_stdin(
        &self,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> (Option<i32>, String, String) {
        kubectl_with(&self.admin_kubeconfig, args, stdin).await
    }

    /// kubectl that must succeed; returns stdout.
    pub async fn kubectl_ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.kubectl(args).await;
        assert_eq!(code, Some(0), "kubectl {args:?} failed: {err}{out}");
        out
    }

    /// `kubectl apply -f -` of a YAML text.
    pub async fn apply(&self, yaml: &str) {
        let (code, out, err) = self
            .kubectl_stdin(&["apply", "-f", "-"], Some(yaml.as_bytes()))
            .await;
        assert_eq!(code, Some(0), "kubectl apply failed: {err}{out}\n{yaml}");
    }

    /// A ServiceAccount token (TokenRequest) for `ns/sa` with `audience`.
    pub async fn token(&self, ns: &str, sa: &str, audience: &str) -> String {
        self.kubectl_ok(&[
            "create",
            "token",
            sa,
            "-n",
            ns,
            "--audience",
            audience,
            "--duration=1h",
        ])
        .await
        .trim()
        .to_string()
    }

    /// A token signed with the cluster's service-account key, for claims
    /// TokenRequest will not issue (e.g. already expired).
    pub fn sign_token(&self, claims: &serde_json::Value) -> String {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = b64.encode(br#"{"alg":"ES256","typ":"JWT"}"#);
        let payload = b64.encode(serde_json::to_vec(claims).unwrap());
        let input = format!("{header}.{payload}");
        let rng = ring::rand::SystemRandom::new();
        let key = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &self.sa_key.serialize_der(),
            &rng,
        )
        .unwrap();
        let sig = key.sign(&rng, input.as_bytes()).unwrap();
        format!("{input}.{}", b64.encode(sig.as_ref()))
    }

    /// Sends `/metrics` of kube-apiserver; returns the text.
    pub async fn apiserver_metrics(&self) -> String {
        let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
        self.client.request_text(req).await.unwrap()
    }

    /// Ends every process of the cluster and checks none is left.
    pub async fn stop(mut self) {
        let pids = vec![
            ("kube-apiserver".to_string(), self.apiserver.pid()),
            ("etcd".to_string(), self.etcd.pid()),
        ];
        self.apiserver.stop().await;
        self.etcd.stop().await;
        assert_gone(&pids);
    }
}

pub async fn kubectl_with(
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&[u8]>,
) -> (Option<i32>, String, String) {
    use tokio::io::AsyncWriteExt;
    let mut cmd = Command::new(&bins().kubectl);
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    if let Some(input) = stdin {
        let mut w = child.stdin.take().unwrap();
        let input = input.to_vec();
        tokio::spawn(async move {
            let _ = w.write_all(&input).await;
            let _ = w.shutdown().await;
        });
    }
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish in 120s"))
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A kube client from a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// Polls `/readyz` until it answers `ok`.
pub async fn wait_ready(client: &kube::Client) {
    let deadline = Instant::now() + PATIENCE;
    let mut pause = Duration::from_millis(50);
    loop {
        let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
        match client.request_text(req).await {
            Ok(body) if body.trim() == "ok" => return,
            r if Instant::now() > deadline => panic!("kube-apiserver not ready: {r:?}"),
            _ => {}
        }
        // Polling the readiness endpoint: there is no push signal.
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// State only visible through the API is waited on with the shared poll.
pub use crate::eventually;

// ---------------------------------------------------------------- konnectivity

/// Our proxy-server as a process, with the addresses it logged.
pub struct ProxyServer {
    pub child: Child,
    pub uds: PathBuf,
    pub agent_addr: SocketAddr,
    pub health_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub id: String,
}

/// Certificates for a server/agent pair, from the cluster's PKI.
pub struct KonnectivityCerts {
    pub server: Cert,
    pub agent: Cert,
}

impl Cluster {
    pub fn konnectivity_certs(&self) -> KonnectivityCerts {
        KonnectivityCerts {
            server: self.pki.server("konnectivity-server", &[]),
            agent: self
                .pki
                .client("konnectivity-agent", "konnectivity-agent", &[]),
        }
    }
}

/// The loopback address of the `addr=` field of a logged listener line.
pub fn logged_addr(l: &str) -> SocketAddr {
    let a = crate::procs::log_field(l, "addr").unwrap();
    crate::procs::loopback(&a)
}

impl ProxyServer {
    /// Starts `proxy-server` with a Unix-socket frontend in `mode`; `extra`
    /// flags are appended.
    pub async fn start(
        dir: &Path,
        id: &str,
        mode: &str,
        certs: &Cert,
        extra: &[String],
    ) -> ProxyServer {
        let uds = dir.join(format!("konnectivity-{id}.socket"));
        let mut args = vec![
            format!("--uds-name={}", uds.display()),
            "--server-port=0".into(),
            format!("--mode={mode}"),
            format!("--server-id={id}"),
            format!("--cluster-cert={}", certs.cert.display()),
            format!("--cluster-key={}", certs.key.display()),
            "--agent-port=0".into(),
            "--health-port=0".into(),
            "--admin-port=0".into(),
            "--agent-bind-address=127.0.0.1".into(),
            "--health-bind-address=127.0.0.1".into(),
        ];
        args.extend_from_slice(extra);
        let mut child = Child::spawn_env(
            &format!("proxy-server {id}"),
            &ours("proxy-server"),
            &args,
            &[("RUST_LOG", "info")],
        );
        let mut addrs = BTreeMap::new();
        while addrs.len() < 4 {
            let l = child.wait_line("listening").await;
            let name = l
                .split_whitespace()
                .find_map(|w| w.strip_prefix("listener="))
                .unwrap()
                .trim_matches('"')
                .to_string();
            if name == "frontend" {
                addrs.insert(name, SocketAddr::from(([0, 0, 0, 0], 0)));
            } else {
                addrs.insert(name, logged_addr(&l));
            }
        }
        ProxyServer {
            child,
            uds,
            agent_addr: addrs["agent"],
            health_addr: addrs["health"],
            admin_addr: addrs["admin"],
            id: id.to_string(),
        }
    }

    pub async fn metrics(&self) -> String {
        crate::http_get(self.health_addr, "/metrics").await.1
    }

    /// Sum of a metric's samples whose line contains every one of `labels`.
    pub async fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        metric_sum(&self.metrics().await, name, labels)
    }
}

/// Sum of the samples of `name` (exact metric name) whose label set
/// contains every string in `labels`.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Our proxy-agent as a process.
pub struct ProxyAgent {
    pub child: Child,
    pub health_addr: SocketAddr,
}

impl ProxyAgent {
    pub async fn start(name: &str, server: SocketAddr, ca: &Path, extra: &[String]) -> ProxyAgent {
        let mut args = vec![
            "--proxy-server-host=127.0.0.1".into(),
            format!("--proxy-server-port={}", server.port()),
            format!("--ca-cert={}", ca.display()),
            "--health-server-port=0".into(),
            "--health-server-host=127.0.0.1".into(),
            "--admin-server-port=0".into(),
            format!("--agent-id={name}"),
        ];
        args.extend_from_slice(extra);
        let mut child = Child::spawn_env(
            &format!("proxy-agent {name}"),
            &ours("proxy-agent"),
            &args,
            &[("RUST_LOG", "info")],
        );
        let l = child.wait_line("listener=\"health\"").await;
        ProxyAgent {
            health_addr: logged_addr(&l),
            child,
        }
    }

    /// Stops the agent as an operator would: SIGTERM (drain), then SIGTERM
    /// again (exit).
    pub async fn stop(&mut self) -> Option<i32> {
        self.child.signal("TERM");
        self.child.wait_line("draining").await;
        self.child.stop().await
    }

    pub async fn metric(&self, name: &str) -> f64 {
        self.metric_with(name, &[]).await
    }

    /// Sum of a metric's samples whose line contains every one of `labels`.
    pub async fn metric_with(&self, name: &str, labels: &[&str]) -> f64 {
        let text = crate::http_get(self.health_addr, "/metrics").await.1;
        metric_sum(&text, name, labels)
    }

    /// Waits until the agent holds streams to `n` servers.
    pub async fn wait_servers(&self, n: usize, patience: Duration) {
        eventually(
            &format!("agent connected to {n} servers"),
            patience,
            || async {
                self.metric("konnectivity_network_proxy_agent_open_server_connections")
                    .await as usize
                    == n
            },
        )
        .await;
    }
}

// ---------------------------------------------------------------- kubelet

pub struct Kubelet {
    pub child: Child,
    pub addr: SocketAddr,
    pub node: String,
}

impl Kubelet {
    /// Starts the stand-in on [`KUBELET_IP`] and waits until its Node is
    /// registered.
    pub async fn start(cluster: &Cluster, node: &str) -> Kubelet {
        let serving = cluster
            .pki
            .server(&format!("kubelet-{node}"), &[KUBELET_IP, node]);
        let args = vec![
            format!("--kubeconfig={}", cluster.admin_kubeconfig.display()),
            format!("--node-name={node}"),
            format!("--address={KUBELET_IP}"),
            "--port=0".into(),
            format!("--tls-cert-file={}", serving.cert.display()),
            format!("--tls-private-key-file={}", serving.key.display()),
            format!("--client-ca-file={}", cluster.pki.ca().display()),
        ];
        let mut child = Child::spawn("kubelet stand-in", &bins().kubelet, &args);
        let l = child.wait_line("kubelet ready").await;
        let addr = l
            .split_whitespace()
            .find_map(|w| w.strip_prefix("addr="))
            .unwrap()
            .parse()
            .unwrap();
        Kubelet {
            child,
            addr,
            node: node.to_string(),
        }
    }

    /// Creates a Pod bound to this Node and waits until the stand-in marked
    /// it Running.
    pub async fn pod(&mut self, cluster: &Cluster, ns: &str, name: &str) {
        cluster
            .apply(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  nodeName: {}\n  containers:\n  - name: main\n    image: standin\n",
                self.node
            ))
            .await;
        self.child
            .wait_line(&format!("event: pod running {ns}/{name}"))
            .await;
    }
}

// ---------------------------------------------------------------- load balancer

/// A round-robin TCP load balancer on loopback, as in front of HA servers;
/// its backends can change while it runs.
pub struct LoadBalancer {
    pub addr: SocketAddr,
    backends: Arc<Mutex<Vec<SocketAddr>>>,
}

impl LoadBalancer {
    pub async fn start(backends: Vec<SocketAddr>) -> LoadBalancer {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let backends = Arc::new(Mutex::new(backends));
        let b = backends.clone();
        tokio::spawn(async move {
            let mut next = 0usize;
            while let Ok((mut down, _)) = l.accept().await {
                let target = {
                    let list = b.lock().unwrap();
                    if list.is_empty() {
                        continue;
                    }
                    next = next.wrapping_add(1);
                    list[next % list.len()]
                };
                tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
            }
        });
        LoadBalancer { addr, backends }
    }

    pub fn set(&self, backends: Vec<SocketAddr>) {
        *self.backends.lock().unwrap() = backends;
    }
}

// ---------------------------------------------------------------- test network

/// EndpointSlices may not point into 127.0.0.0/8, so endpoints need another
/// address. This creates a network namespace of the test's own with a veth
/// pair in a /30 of 198.18.0.0/15 (RFC 2544, for tests); the near end's
/// address is local to this host, so traffic to it never leaves the machine.
/// Everything is removed on drop. Needs root (as the test machine has).
pub struct TestNet {
    ns: String,
    pub host_ip: std::net::IpAddr,
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestNet {
    pub fn create() -> TestNet {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let ns = format!("kh{}x{n}", pid % 1_000_000);
        let third = (pid % 250) as u8;
        let fourth = ((n % 64) * 4) as u8;
        let host = format!("198.18.{third}.{}", fourth + 1);
        let peer = format!("198.18.{third}.{}", fourth + 2);
        let (h, p) = (format!("{ns}h"), format!("{ns}n"));
        ip(&["netns", "add", &ns]);
        let net = TestNet {
            ns: ns.clone(),
            host_ip: host.parse().unwrap(),
        };
        ip(&[
            "link", "add", &h, "type", "veth", "peer", "name", &p, "netns", &ns,
        ]);
        ip(&["addr", "add", &format!("{host}/30"), "dev", &h]);
        ip(&["link", "set", &h, "up"]);
        ip(&["-n", &ns, "addr", "add", &format!("{peer}/30"), "dev", &p]);
        ip(&["-n", &ns, "link", "set", &p, "up"]);
        net
    }

    /// A TCP forwarder on this network's host address to `to`.
    pub async fn forward_to(&self, to: SocketAddr) -> SocketAddr {
        let l = tokio::net::TcpListener::bind((self.host_ip, 0))
            .await
            .unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut down, _)) = l.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
            }
        });
        addr
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // Deleting the namespace removes the veth pair with it.
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.ns])
            .status();
    }
}
