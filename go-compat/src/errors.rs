//! Error text a user reads: one sentence naming the thing to fix.

/// An I/O error's reason in Go's words, without Rust's ` (os error N)`:
/// "address already in use", "no such file or directory".
pub fn io_reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_lowercase(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_the_os_error_number() {
        let e = std::io::Error::from_raw_os_error(98);
        assert_eq!(io_reason(&e), "address already in use");
        let custom = std::io::Error::other("Something Else");
        assert_eq!(io_reason(&custom), "Something Else");
    }
}
