//! Any bytes on the SNI port: the parser must answer without panicking, and
//! a complete answer must not change when more bytes follow.
#![no_main]

use nodeport_proxy::relay::client_hello::{Hello, parse};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let first = parse(data);
    if let Ok(Hello::Complete { .. }) = &first {
        let mut longer = data.to_vec();
        longer.extend_from_slice(b"trailing application data");
        assert_eq!(parse(&longer), first);
    }
});
