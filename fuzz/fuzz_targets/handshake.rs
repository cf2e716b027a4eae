//! The first bytes of a connection, as the acceptor's Hello and as the dialer's answer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shardline::fuzz::handshake(data));
