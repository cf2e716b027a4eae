//! A connection's bytes after the handshake: frames, the messages in them, gossip and the encodings nested in messages.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shardline::fuzz::frames(data));
