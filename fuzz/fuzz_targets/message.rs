//! One frame body: decoded, and if it decodes, encoded and decoded again to the same bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shardline::fuzz::message(data));
