//! Network namespaces of the tests' own, with processes started inside them
//! (tests that use them need root, as the Kubernetes tests do).

use std::path::Path;

use crate::procs::Proc;

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

/// The addresses of a [`Netns::with_veth`] pair.
pub struct Veth {
    pub host: std::net::Ipv4Addr,
    pub inner: std::net::Ipv4Addr,
    pub inner6: std::net::Ipv6Addr,
}

/// A namespace deleted on drop (its veth pair with it).
pub struct Netns {
    name: String,
}

impl Netns {
    /// A namespace whose loopback has `::1` and no IPv4 address at all, and
    /// whose `/etc/hosts` (bind-mounted by `ip netns exec`) names both
    /// loopbacks `localhost`, as a kubelet-managed pod's does.
    pub fn ipv6_only() -> Netns {
        let ns = Self::with_loopback("v6x");
        ip(&["-n", &ns.name, "addr", "del", "127.0.0.1/8", "dev", "lo"]);
        ns
    }

    /// A namespace with nothing but its loopback (127.0.0.1 and ::1, both
    /// named `localhost`): fixed ports a test must use (a rendered
    /// configuration's) collide with nothing there.
    pub fn loopback_only() -> Netns {
        Self::with_loopback("lo")
    }

    /// A namespace with its loopback and a veth pair to this one: this
    /// side is `host`, the namespace's side `inner` (IPv4 in 198.19.0.0/16,
    /// RFC 2544's test space) and `inner6` (IPv6 in fd33::/16, a ULA), so a
    /// client here reaches the namespace's listeners from outside its
    /// loopback, and nothing leaves the machine.
    pub fn with_veth() -> (Netns, Veth) {
        let ns = Self::with_loopback("dv");
        let n = ns
            .name
            .rsplit('x')
            .next()
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0);
        let pid = std::process::id();
        let (third, fourth) = (pid % 250, (n % 64) * 4);
        let host: std::net::Ipv4Addr = format!("198.19.{third}.{}", fourth + 1).parse().unwrap();
        let inner: std::net::Ipv4Addr = format!("198.19.{third}.{}", fourth + 2).parse().unwrap();
        let net6 = format!("fd33:{:x}:{n:x}", pid % 0xffff);
        let inner6: std::net::Ipv6Addr = format!("{net6}::2").parse().unwrap();
        let (h, p) = (format!("{}h", ns.name), format!("{}n", ns.name));
        ip(&[
            "link", "add", &h, "type", "veth", "peer", "name", &p, "netns", &ns.name,
        ]);
        ip(&["addr", "add", &format!("{host}/30"), "dev", &h]);
        ip(&[
            "-6",
            "addr",
            "add",
            &format!("{net6}::1/64"),
            "dev",
            &h,
            "nodad",
        ]);
        ip(&["link", "set", &h, "up"]);
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{inner}/30"),
            "dev",
            &p,
        ]);
        ip(&[
            "-n",
            &ns.name,
            "-6",
            "addr",
            "add",
            &format!("{inner6}/64"),
            "dev",
            &p,
            "nodad",
        ]);
        ip(&["-n", &ns.name, "link", "set", &p, "up"]);
        (
            ns,
            Veth {
                host,
                inner,
                inner6,
            },
        )
    }

    fn with_loopback(prefix: &str) -> Netns {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{prefix}x{}x{n}", std::process::id() % 1_000_000);
        ip(&["netns", "add", &name]);
        let ns = Netns { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        let etc = ns.etc();
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(
            etc.join("hosts"),
            "127.0.0.1 localhost\n::1 localhost ip6-localhost\n",
        )
        .unwrap();
        ns
    }

    /// Names `ip` `name` in the namespace's `/etc/hosts`, which `ip netns
    /// exec` shows the processes started inside it (a server name that is
    /// not `localhost` but still a loopback address there).
    pub fn add_host(&self, ip: &str, name: &str) {
        use std::io::Write;
        let mut hosts = std::fs::OpenOptions::new()
            .append(true)
            .open(self.etc().join("hosts"))
            .unwrap();
        writeln!(hosts, "{ip} {name}").unwrap();
    }

    fn etc(&self) -> std::path::PathBuf {
        Path::new("/etc/netns").join(&self.name)
    }

    /// Starts `program` inside the namespace (killed with the test).
    pub fn spawn(&self, program: &Path, args: &[String]) -> Proc {
        let mut all: Vec<String> = [
            "netns",
            "exec",
            &self.name,
            "setpriv",
            "--pdeathsig",
            "KILL",
            "--",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        all.push(program.display().to_string());
        all.extend(args.iter().cloned());
        Proc::spawn_path(Path::new("ip"), &all)
    }

    /// Runs a command inside the namespace to completion: (success, stdout).
    pub fn run(&self, args: &[&str]) -> (bool, String) {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// An echo server on `[::1]` inside the namespace; returns its process
    /// and port.
    pub async fn echo(&self) -> (Proc, u16) {
        const ECHO: &str = r#"
import socket, threading
s = socket.socket(socket.AF_INET6)
s.bind(('::1', 0))
s.listen(64)
print('echo port', s.getsockname()[1], flush=True)
def serve(c):
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;
        let mut p = self.spawn(Path::new("python3"), &["-c".into(), ECHO.into()]);
        let line = p.wait_line("echo port").await;
        let port = line
            .rsplit(' ')
            .next()
            .and_then(|s| s.trim().parse().ok())
            .unwrap();
        (p, port)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.etc());
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
