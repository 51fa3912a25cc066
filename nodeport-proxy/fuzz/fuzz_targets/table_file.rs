//! Any table file (JSON or YAML): parsing must answer without panicking, and
//! what parses must build a consistent plan (nodeport_proxy::fuzzing).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeport_proxy::fuzzing::table_file(data));
