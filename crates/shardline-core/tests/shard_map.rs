use shardline_core::{Epoch, MapError, Member, MemberStatus, MembershipView, NodeId, ShardHome, ShardId, ShardMap};

#[test]
fn epochs_grow_across_terms_and_versions_count_changes() {
    let mut m = ShardMap::new(3).unwrap();
    let a = NodeId::new("a", 1);
    let e1 = m.assign(ShardId(0), a.clone(), 5).unwrap();
    assert_eq!(e1, Epoch { term: 5, seq: 1 });
    let e2 = m.assign(ShardId(0), a.clone(), 5).unwrap();
    assert_eq!(e2, Epoch { term: 5, seq: 2 });
    let e3 = m.assign(ShardId(0), a.clone(), 6).unwrap();
    assert!(e3 > e2 && e3.term == 6);
    assert_eq!(m.version(), 3);
    assert_eq!(m.unassign(ShardId(0)).unwrap(), Some(a.clone()));
    assert_eq!(m.slot(ShardId(0)).unwrap().epoch, e3, "the epoch survives unassignment");
    let e4 = m.assign(ShardId(0), a, 6).unwrap();
    assert!(e4 > e3);
}

#[test]
fn adopt_keeps_newest() {
    let mut m = ShardMap::new(1).unwrap();
    let (a, b) = (NodeId::new("a", 1), NodeId::new("b", 1));
    assert!(m.adopt(ShardId(0), ShardHome { owner: a.clone(), epoch: Epoch { term: 2, seq: 3 } }).unwrap());
    assert!(!m.adopt(ShardId(0), ShardHome { owner: b.clone(), epoch: Epoch { term: 2, seq: 1 } }).unwrap());
    assert_eq!(m.owner(ShardId(0)), Some(&a));
    assert!(m.adopt(ShardId(0), ShardHome { owner: b.clone(), epoch: Epoch { term: 3, seq: 1 } }).unwrap());
    assert_eq!(m.owner(ShardId(0)), Some(&b));
}

#[test]
fn range_and_validation_errors() {
    assert_eq!(ShardMap::new(0), Err(MapError::Empty));
    let mut m = ShardMap::new(2).unwrap();
    let a = NodeId::new("a", 1);
    assert!(matches!(m.assign(ShardId(2), a.clone(), 1), Err(MapError::ShardOutOfRange { .. })));
    m.assign(ShardId(1), a.clone(), 1).unwrap();
    let mut v = MembershipView::new();
    assert!(matches!(m.validate(&v, None), Err(MapError::OwnerCannotHost { .. })));
    v.add(Member::new(a.clone(), 0).with_status(MemberStatus::Up)).unwrap();
    assert!(m.validate(&v, None).is_ok());
    assert!(m.validate(&v, Some("gpu")).is_err(), "owner lacks the role");
}

#[test]
fn serde_round_trip() {
    let mut m = ShardMap::new(4).unwrap();
    m.assign(ShardId(3), NodeId::new("a", 7), 2).unwrap();
    let json = serde_json::to_string(&m).unwrap();
    let back: ShardMap = serde_json::from_str(&json).unwrap();
    assert_eq!(back, m);
    assert!(serde_json::from_str::<ShardMap>("{\"version\":1}").is_err());
}
