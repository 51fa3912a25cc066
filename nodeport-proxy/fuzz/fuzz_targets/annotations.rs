//! Any `port-mapping` and `expose` annotation values: accepted ones must
//! keep their promises (nodeport_proxy::fuzzing).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeport_proxy::fuzzing::annotations(data));
