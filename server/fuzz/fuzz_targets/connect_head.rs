#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| proxy_server::fuzzing::connect_head(data));
