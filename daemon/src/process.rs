//! Process-wide settings every binary applies at start.

/// What every binary does right after its logging is set up.
pub fn init() {
    raise_open_files_limit();
    return_freed_memory();
}

/// jemalloc, when the binary is built with the `jemalloc` feature (the
/// default): glibc's malloc kept what a burst of tunnels had used (a server
/// stayed at 254 MB after load that peaked there, with 0.86 MB in use), and
/// jemalloc's decay returns it. BENCHMARKS.md and RELIABILITY.md have the
/// measurements behind the choice.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Starts jemalloc's background threads, which purge pages freed for longer
/// than the decay time (10 s by default) even when the process is otherwise
/// idle; without them an idle process keeps what its last burst freed.
pub fn return_freed_memory() {
    #[cfg(feature = "jemalloc")]
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(error = %e, "jemalloc background threads not started; freed memory is returned only while allocating");
    }
}

/// Gives the pages freed so far back to the OS now, instead of after
/// jemalloc's decay (10 s): for a burst known to have ended that freed much
/// (a seed's table file reloaded, megabytes read and split), so memory
/// after a burst of reloads is memory after start. Costs a few system
/// calls and, next time, page faults: call it off the runtime's workers,
/// after large frees only.
pub fn purge_freed_memory() {
    #[cfg(feature = "jemalloc")]
    {
        use tikv_jemalloc_ctl::{Access, AsName};
        // `arena.<i>.purge` takes no value, which the safe controls cannot
        // express (and this workspace forbids `unsafe`); setting an arena's
        // dirty decay restarts its backlog, and a decay of 0 purges every
        // dirty page at once. The arena's own setting is then put back.
        let Ok(arenas) = tikv_jemalloc_ctl::arenas::narenas::read() else {
            return;
        };
        let Ok(mut mib) = b"arena.0.dirty_decay_ms\0".name().mib::<[usize; 3]>() else {
            return;
        };
        for i in 0..arenas as usize {
            mib[1] = i;
            // An arena not in use yet answers with an error: nothing to purge.
            if let Ok(decay) = Access::<isize>::update(&mib, 0) {
                let _ = Access::<isize>::write(&mib, decay);
            }
        }
    }
}

/// The allocator's own figures: bytes the program has allocated and bytes
/// of the pages the allocator holds resident (jemalloc's `stats.allocated`
/// and `stats.resident`, refreshed first); `None` without jemalloc.
pub fn allocator_bytes() -> Option<(u64, u64)> {
    #[cfg(feature = "jemalloc")]
    {
        use tikv_jemalloc_ctl::{epoch, stats};
        epoch::advance().ok()?;
        let allocated = stats::allocated::read().ok()?;
        let resident = stats::resident::read().ok()?;
        Some((allocated as u64, resident as u64))
    }
    #[cfg(not(feature = "jemalloc"))]
    None
}

/// Raises the soft limit on open files to the hard limit, as Go's runtime
/// does at start (since Go 1.19), and logs the figure: with the usual soft
/// limit of 1024, a few thousand idle connections would make every accept
/// fail with EMFILE.
pub fn raise_open_files_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::info!(limit = n, "open files limit"),
        Err(e) => tracing::warn!(error = %e, "open files limit not raised"),
    }
}

#[cfg(all(test, feature = "jemalloc"))]
mod tests {
    fn resident_mib() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096 / (1 << 20)
    }

    /// What a burst freed leaves at once, not after the 10 s decay.
    #[test]
    fn purging_gives_freed_pages_back_at_once() {
        let burst: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 1 << 20]).collect();
        let full = resident_mib();
        drop(burst);
        super::purge_freed_memory();
        let after = resident_mib();
        assert!(
            after + 48 <= full,
            "resident {full} MiB with the burst, {after} MiB after it was freed and purged"
        );
    }
}
