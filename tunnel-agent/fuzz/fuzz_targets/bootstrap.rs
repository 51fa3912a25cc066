//! Any bytes as the bootstrap file: parsing answers without panicking, and a
//! bootstrap it accepts resolves into a configuration (or a clear error)
//! without panicking either, with every listener and the seed within bounds.
#![no_main]

use tunnel_agent::bootstrap::parse;
use tunnel_agent::cli::FlagSettings;
use tunnel_agent::limits::{MAX_CONFIG_BYTES, MAX_LISTENERS};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(b) => {
            assert!(data.len() <= MAX_CONFIG_BYTES);
            assert!(!b.tunnels.is_empty() && b.tunnels.len() <= MAX_LISTENERS);
            assert!(!b.seed.host.is_empty());
            if let Ok((config, _)) = FlagSettings::default().resolve(Some(&b)) {
                assert_eq!(config.listeners.len(), b.tunnels.len());
                assert!(config.validate().is_ok());
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
