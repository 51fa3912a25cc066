#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| proxy_server::fuzzing::traceparent(data));
