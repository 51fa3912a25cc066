//! A client's first bytes on a listener given -accept-proxy-protocol (v1 or
//! v2 PROXY header), and the same bytes as a source-ranges annotation
//! (nodeport_proxy::fuzzing).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeport_proxy::fuzzing::proxy_header(data));
