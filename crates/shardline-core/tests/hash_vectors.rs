//! The entity → shard mapping is a wire contract: if it changed, two versions of a node would
//! route the same entity to two places. These vectors were checked against an independent
//! xxh3-64 implementation.

use shardline_core::{shard_of, EntityId, ShardId};

const VECTORS: &[(&str, u32, u32)] = &[
    // (entity id, shard of 100, shard of 1024)
    ("acct-42", 34, 526),
    ("user-1", 57, 457),
    ("device-00000001", 99, 707),
    ("room/lobby", 67, 891),
    ("", 38, 194),
    ("ü-unicode-ß", 23, 1023),
    ("0123456789abcdef", 49, 301),
    ("order-99999", 0, 384),
    ("session:7f3a", 84, 556),
    ("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 36, 580),
];

#[test]
fn shard_of_is_pinned() {
    for &(id, s100, s1024) in VECTORS {
        assert_eq!(shard_of(id, 100), ShardId(s100), "{id:?} over 100 shards");
        assert_eq!(shard_of(id, 1024), ShardId(s1024), "{id:?} over 1024 shards");
        assert_eq!(EntityId::new(id).shard(1024), ShardId(s1024));
    }
}

#[test]
fn shard_of_stays_in_range_and_tolerates_zero() {
    for n in [1u32, 2, 3, 7, 1000, u32::MAX] {
        for id in ["a", "b", "acct-1", ""] {
            assert!(shard_of(id, n).0 < n);
        }
    }
    assert_eq!(shard_of("anything", 0), ShardId(0));
}
