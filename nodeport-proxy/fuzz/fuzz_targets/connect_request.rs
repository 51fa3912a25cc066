//! Any bytes on the tunneling port: the request parser must answer without
//! panicking, a parsed head must lie within the input, and every refusal
//! maps to a 4xx/5xx status.
#![no_main]

use nodeport_proxy::relay::connect_request::{Parsed, parse};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(Parsed::Connect(head)) => assert!(head.head_len <= data.len()),
        Ok(Parsed::Incomplete) => {}
        Err(e) => assert!((400..600).contains(&e.status())),
    }
});
