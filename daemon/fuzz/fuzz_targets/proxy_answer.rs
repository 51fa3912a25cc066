//! An egress HTTP proxy's answer to the CONNECT that opens a peer
//! connection, and a NO_PROXY value (daemon::egress_proxy::fuzz_one).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| daemon::egress_proxy::fuzz_one(data));
