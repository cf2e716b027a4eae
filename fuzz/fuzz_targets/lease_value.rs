//! A value read from the coordination store, as each kind of key and as a stored shard map.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shardline::fuzz::lease_value(data));
