//! The fuzz targets' seed corpus (`fuzz/corpus`) is the current encoding of what nodes and
//! stores exchange, and every target takes every seed, each of its prefixes and each one-byte
//! change of it without panicking: the fuzzers' ground, walked deterministically under
//! `cargo test` (the fuzzers themselves run from the README's test command).
//!
//! After a change of the wire format: `SHARDLINE_WRITE_FUZZ_SEEDS=1 cargo test -p shardline
//! --test fuzz_corpus` writes the seeds again.

use std::path::PathBuf;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus")
}

fn target(name: &str) -> fn(&[u8]) {
    match name {
        "frames" => shardline::fuzz::frames,
        "message" => shardline::fuzz::message,
        "handshake" => shardline::fuzz::handshake,
        "lease_value" => shardline::fuzz::lease_value,
        other => panic!("no fuzz target {other}"),
    }
}

#[test]
fn the_seed_corpus_is_the_current_encoding() {
    let seeds = shardline::fuzz::seeds();
    let write = std::env::var_os("SHARDLINE_WRITE_FUZZ_SEEDS").is_some();
    for t in shardline::fuzz::TARGETS {
        assert!(seeds.iter().any(|(st, ..)| *st == t), "target {t} has seeds");
    }
    for (t, name, bytes) in &seeds {
        let path = corpus().join(t).join(name);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, bytes).unwrap();
            continue;
        }
        let stored = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (write the seeds again)", path.display()));
        assert_eq!(&stored, bytes, "{} is not the current encoding (write the seeds again)", path.display());
    }
}

#[test]
fn every_target_takes_every_seed_its_prefixes_and_its_one_byte_changes() {
    let seeds = shardline::fuzz::seeds();
    for t in shardline::fuzz::TARGETS {
        let run = target(t);
        // Every seed to every target: a frame body is also garbage as a stream, and so on.
        for (_, _, seed) in &seeds {
            for end in 0..=seed.len() {
                run(&seed[..end]);
            }
            for i in 0..seed.len() {
                for flip in [0x01u8, 0x80, 0xff] {
                    let mut changed = seed.clone();
                    changed[i] ^= flip;
                    run(&changed);
                }
            }
        }
    }
}

#[test]
fn the_message_seeds_are_messages_the_node_reads() {
    // A seed the node refuses would start the fuzzer off the path it should explore.
    for (t, name, bytes) in shardline::fuzz::seeds() {
        if t == "message" {
            assert!(shardline::fuzz::decodes(&bytes), "{name} decodes");
        }
    }
}
