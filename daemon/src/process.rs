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
