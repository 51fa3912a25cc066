//! The `process_*` families client_golang's process collector reports for a
//! Go program, read the same way from `/proc` for this one: CPU time,
//! resident and virtual memory, open and maximum file descriptors, the
//! virtual memory limit, start time and the network namespace's IP bytes.
//! A figure that cannot be read is left out, as the Go collector leaves it
//! out (it logs the error instead).

use crate::exposition::ConstFamily;

/// `USER_HZ`: Linux reports CPU times in 1/100 s to user space whatever the
/// kernel's tick; prometheus/procfs fixes it at 100 for the same reason.
const USER_HZ: f64 = 100.0;

/// The fields of `/proc/self/stat` after the command name.
fn stat_fields() -> Option<Vec<String>> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// A soft limit from `/proc/self/limits`; "unlimited" is Go's `^uint64(0)`.
fn soft_limit(name: &str) -> Option<f64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with(name))?;
    let soft = line[name.len()..].split_whitespace().next()?;
    Some(if soft == "unlimited" {
        u64::MAX as f64
    } else {
        soft.parse::<u64>().ok()? as f64
    })
}

fn boot_time() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// `IpExt: InOctets` and `OutOctets` of `/proc/self/net/netstat`.
fn ip_octets() -> Option<(f64, f64)> {
    let text = std::fs::read_to_string("/proc/self/net/netstat").ok()?;
    let mut lines = text.lines().filter(|l| l.starts_with("IpExt:"));
    let names: Vec<&str> = lines.next()?.split_whitespace().collect();
    let values: Vec<&str> = lines.next()?.split_whitespace().collect();
    let get = |key: &str| -> Option<f64> {
        let i = names.iter().position(|n| *n == key)?;
        values.get(i)?.parse().ok()
    };
    Some((get("InOctets")?, get("OutOctets")?))
}

/// `VmRSS` of `/proc/self/status` in bytes: the kernel's RSS counters, the
/// same figure as `stat`'s rss field times the page size.
fn resident_bytes() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024.0)
}

fn open_fds() -> Option<f64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as f64)
}

/// The families, in client_golang's names and HELP texts.
pub fn families() -> Vec<ConstFamily> {
    let mut out = Vec::with_capacity(9);
    let mut add = |name, help, kind, value: Option<f64>| {
        if let Some(value) = value {
            out.push(ConstFamily {
                name,
                help,
                kind,
                value,
            });
        }
    };
    let stat = stat_fields();
    // After the command: state is field 0, utime 11, stime 12, starttime
    // 19, vsize 20 (proc(5) numbers them 3, 14, 15, 22 and 23).
    let field = |i: usize| -> Option<f64> { stat.as_ref()?.get(i)?.parse().ok() };
    add(
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        "counter",
        field(11).zip(field(12)).map(|(u, s)| (u + s) / USER_HZ),
    );
    add(
        "process_max_fds",
        "Maximum number of open file descriptors.",
        "gauge",
        soft_limit("Max open files"),
    );
    let octets = ip_octets();
    add(
        "process_network_receive_bytes_total",
        "Number of bytes received by the process over the network.",
        "counter",
        octets.map(|o| o.0),
    );
    add(
        "process_network_transmit_bytes_total",
        "Number of bytes sent by the process over the network.",
        "counter",
        octets.map(|o| o.1),
    );
    add(
        "process_open_fds",
        "Number of open file descriptors.",
        "gauge",
        open_fds(),
    );
    add(
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
        "gauge",
        resident_bytes(),
    );
    add(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        "gauge",
        field(19)
            .zip(boot_time())
            .map(|(start, boot)| boot + start / USER_HZ),
    );
    add(
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
        "gauge",
        field(20),
    );
    add(
        "process_virtual_memory_max_bytes",
        "Maximum amount of virtual memory available in bytes.",
        "gauge",
        soft_limit("Max address space"),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let f = families();
        assert_eq!(f.len(), 9, "{f:?}");
        let get = |n: &str| {
            families()
                .into_iter()
                .find(|x| x.name == n)
                .map(|x| x.value)
        };
        let rss = get("process_resident_memory_bytes").unwrap_or(0.0);
        let vsz = get("process_virtual_memory_bytes").unwrap_or(0.0);
        assert!(rss > 1e6 && vsz > rss, "rss {rss} vsz {vsz}");
        let fds = get("process_open_fds").unwrap_or(0.0);
        let file = std::fs::File::open("/proc/self/stat");
        assert!(get("process_open_fds").unwrap_or(0.0) > fds, "a file more");
        drop(file);
        assert!(get("process_max_fds").unwrap_or(0.0) >= fds);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let start = get("process_start_time_seconds").unwrap_or(0.0);
        assert!(
            start <= now + 1.0 && start > now - 3600.0,
            "{start} vs {now}"
        );
        let cpu0 = get("process_cpu_seconds_total").unwrap_or(0.0);
        let end = std::time::Instant::now() + std::time::Duration::from_millis(300);
        let mut x = 0u64;
        while std::time::Instant::now() < end {
            x = x.wrapping_add(1);
        }
        assert!(x > 0);
        assert!(get("process_cpu_seconds_total").unwrap_or(0.0) > cpu0);
    }
}
