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

    /// A client certificate with common name `name`.
    pub fn client(&self, name: &str) -> Identity {
        self.inner.client(name).unwrap()
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}
