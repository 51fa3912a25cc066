//! An HTTP proxy's answer to the CONNECT that opens the seed connection, and
//! a NO_PROXY value (tunnel_agent::http_proxy::fuzz_one).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tunnel_agent::http_proxy::fuzz_one(data));
