//! Keeps the soak's flooding process on a CPU of its own, so that what a
//! flood costs the attacker is not charged to the process under test: in
//! the field the flooders are other machines. Used by the `floods` and
//! `isolation` sections.

use std::path::Path;

use integration_tests::procs::Proc;

/// Keeps this process (its threads now, and what it spawns from now on) on
/// one CPU and the flooders on another, for as long as it lives; undone on
/// drop. None when there are fewer than 2 CPUs to use, `taskset` is missing
/// or `SOAK_FLOODS_UNPINNED` is set: then everything shares the CPUs, and
/// the sections' rows say so.
pub struct Pinning {
    all: String,
    pub ours: usize,
    pub flooders: usize,
}

impl Pinning {
    pub fn new() -> Option<Pinning> {
        if std::env::var_os("SOAK_FLOODS_UNPINNED").is_some() {
            return None;
        }
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let all = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
            .trim()
            .to_string();
        let cpus = cpu_list(&all);
        let (&flooders, &ours) = (cpus.first()?, cpus.get(1)?);
        taskset(&ours.to_string(), std::process::id()).then_some(Pinning {
            all,
            ours,
            flooders,
        })
    }

    /// Spawns `exe args` on the flooders' CPU (anywhere when unpinned).
    pub fn spawn_flooder(pinning: &Option<Pinning>, exe: &Path, args: &[String]) -> Proc {
        match pinning {
            Some(p) => {
                let mut a = vec!["-c".to_string(), p.flooders.to_string()];
                a.push(exe.display().to_string());
                a.extend(args.iter().cloned());
                Proc::spawn_path(Path::new("taskset"), &a)
            }
            None => Proc::spawn_path(exe, args),
        }
    }

    /// The CPU this process and the processes under test share (the
    /// destinations, the timed client, the proxies): whether it had time to
    /// spare shows whether a window's figures were bound by CPU.
    pub fn ours_ticks(&self) -> CpuTicks {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let name = format!("cpu{} ", self.ours);
        let v: Vec<u64> = stat
            .lines()
            .find(|l| l.starts_with(&name))
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        // user nice system idle iowait irq softirq steal ...
        let idle = v.get(3).unwrap_or(&0) + v.get(4).unwrap_or(&0);
        let total: u64 = v.iter().take(8).sum();
        CpuTicks {
            busy: total.saturating_sub(idle),
            total,
        }
    }
}

/// One CPU's busy and total time so far (/proc/stat, in ticks).
#[derive(Clone, Copy)]
pub struct CpuTicks {
    busy: u64,
    total: u64,
}

impl CpuTicks {
    /// The share of the time since `earlier` this CPU was busy.
    pub fn busy_since(self, earlier: CpuTicks) -> f64 {
        self.busy.saturating_sub(earlier.busy) as f64
            / self.total.saturating_sub(earlier.total).max(1) as f64
    }
}

impl Drop for Pinning {
    fn drop(&mut self) {
        taskset(&self.all, std::process::id());
    }
}

/// `0-1,4` → [0, 1, 4].
fn cpu_list(list: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in list.split(',') {
        let mut ends = part.trim().splitn(2, '-').map(|n| n.parse::<usize>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), None) => out.push(a),
            (Some(Ok(a)), Some(Ok(b))) => out.extend(a..=b),
            _ => {}
        }
    }
    out
}

/// Sets every thread of `pid` to `cpus`.
fn taskset(cpus: &str, pid: u32) -> bool {
    std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
