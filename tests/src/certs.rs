//! The local stack's throw-away PKI, in a temp dir that lives as long as the
//! test's `Pki`; failures panic, which is how a test reports them.

use std::path::{Path, PathBuf};

pub use local_stack::pki::Identity;

pub struct Pki {
    inner: local_stack::pki::Pki,
    _dir: tempfile::TempDir,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let inner = local_stack::pki::Pki::create(dir.path()).unwrap();
        Pki { inner, _dir: dir }
    }

    pub fn dir(&self) -> &Path {
        self.inner.dir()
    }

    pub fn ca(&self) -> PathBuf {
        self.inner.ca()
    }

    /// A serving certificate valid for `localhost`, `127.0.0.1`, `::1` and `extra`.
    pub fn server(&self, name: &str, extra: &[&str]) -> Identity {
        self.inner.server(name, extra).unwrap()
    }

    /// A server (`server`) or client certificate valid only in 2000, or only
    /// from 2999 (`future`).
    pub fn outdated(&self, name: &str, server: bool, future: bool) -> Identity {
        self.inner.outdated(name, server, future).unwrap()
    }

    /// A client certificate with common name `name`.
    pub fn client(&self, name: &str) -> Identity {
        self.inner.client(name).unwrap()
    }

    /// proxy-server flags for a frontend on the Unix socket `socket`, this
    /// PKI's agent-listener certificate, every TCP port 0 on loopback, then
    /// `extra` (later flags win, as in Go).
    pub fn local_server_args<S: AsRef<str>>(&self, socket: &Path, extra: &[S]) -> Vec<String> {
        let id = self.server("server", &[]);
        let mut args = vec![
            format!("--uds-name={}", socket.display()),
            "--server-port=0".into(),
            format!("--cluster-cert={}", id.cert.display()),
            format!("--cluster-key={}", id.key.display()),
            format!("--cluster-ca-cert={}", self.ca().display()),
            "--agent-bind-address=127.0.0.1".into(),
            "--agent-port=0".into(),
            "--health-bind-address=127.0.0.1".into(),
            "--health-port=0".into(),
            "--admin-port=0".into(),
        ];
        args.extend(extra.iter().map(|s| s.as_ref().to_string()));
        args
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}
