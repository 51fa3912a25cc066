//! Process-wide settings every binary applies at start.

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
