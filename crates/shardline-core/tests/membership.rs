use shardline_core::{AppVersion, Member, MemberStatus, MembershipError, MembershipView, NodeId};

fn up(name: &str, age: u64) -> Member {
    Member::new(NodeId::new(name, 1), age).with_status(MemberStatus::Up)
}

#[test]
fn only_legal_transitions() {
    use MemberStatus::*;
    let all = [Joining, Up, Leaving, Exiting, Removed, Down];
    let legal = [
        (Joining, Up),
        (Joining, Leaving),
        (Joining, Down),
        (Up, Leaving),
        (Up, Down),
        (Leaving, Exiting),
        (Leaving, Down),
        (Exiting, Removed),
        (Exiting, Down),
        (Down, Removed),
    ];
    for a in all {
        for b in all {
            assert_eq!(a.can_become(b), legal.contains(&(a, b)), "{a:?} -> {b:?}");
        }
    }
}

#[test]
fn view_refuses_illegal_changes_and_fences_leader() {
    let mut v = MembershipView::new();
    let a = NodeId::new("a", 1);
    v.add(Member::new(a.clone(), 0)).unwrap();
    assert_eq!(v.add(Member::new(a.clone(), 0)), Err(MembershipError::AlreadyMember(a.clone())));
    v.set_status(&a, MemberStatus::Up).unwrap();
    v.set_leader(Some(a.clone())).unwrap();
    v.set_status(&a, MemberStatus::Down).unwrap();
    assert_eq!(v.leader(), None, "a down node cannot stay leader");
    let err = v.set_status(&a, MemberStatus::Up).unwrap_err();
    assert!(matches!(err, MembershipError::IllegalTransition { .. }));
    assert!(v.set_leader(Some(a.clone())).is_err());
    assert!(matches!(v.set_status(&NodeId::new("ghost", 1), MemberStatus::Up), Err(MembershipError::UnknownMember(_))));
}

#[test]
fn hosts_and_oldest() {
    let mut v = MembershipView::new();
    v.add(up("b", 2)).unwrap();
    v.add(up("a", 5).with_role("web")).unwrap();
    v.add(Member::new(NodeId::new("c", 1), 1)).unwrap(); // joining
    assert_eq!(v.hosts(None).len(), 2);
    assert_eq!(v.hosts(Some("web")).len(), 1);
    assert_eq!(v.oldest_up().map(|m| m.node.name.to_string()), Some("b".into()));
}

#[test]
fn newer_incarnation_fences_older() {
    let mut v = MembershipView::new();
    v.add(up("a", 0)).unwrap();
    v.add(Member::new(NodeId::new("a", 9), 1).with_status(MemberStatus::Up)).unwrap();
    assert!(!v.is_fenced(&NodeId::new("a", 1)));
    v.set_status(&NodeId::new("a", 1), MemberStatus::Down).unwrap();
    v.prune_removed();
    assert!(v.is_fenced(&NodeId::new("a", 1)));
    assert!(v.is_fenced(&NodeId::new("a", 3)), "an unknown older incarnation is fenced by the newer one");
    assert!(!v.is_fenced(&NodeId::new("zzz", 1)), "an unknown name is not known to be stopped");
}

#[test]
fn versions_compare_numerically() {
    assert!(AppVersion::new("1.10") > AppVersion::new("1.9"));
    assert!(AppVersion::new("2") > AppVersion::new("1.99.99"));
    assert!(AppVersion::new("1.2.0") > AppVersion::new("1.2"));
    assert_eq!(AppVersion::new("1.02"), AppVersion::new("1.2"));
    assert!(
        AppVersion::new("1.2-rc") > AppVersion::new("1.10-rc")
            || AppVersion::new("1.2-rc") < AppVersion::new("1.10-rc")
    );
}
