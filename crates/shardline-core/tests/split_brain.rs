use shardline_core::{Member, MemberStatus, NodeId, SplitBrainDecision as D, SplitBrainPolicy as P};

fn m(name: &str, age: u64) -> Member {
    Member::new(NodeId::new(name, 1), age).with_status(MemberStatus::Up)
}

/// Members by name; age follows the alphabet (a is oldest).
fn side(names: &[&str]) -> Vec<Member> {
    names.iter().map(|n| m(n, u64::from(n.as_bytes()[0]))).collect()
}

#[test]
fn keep_majority() {
    let p = P::KeepMajority;
    assert_eq!(p.decide(&side(&["a", "b", "c"]), &side(&["d"]), None), D::DownUnreachable);
    assert_eq!(p.decide(&side(&["d"]), &side(&["a", "b", "c"]), None), D::DownReachable);
    // Tie: the side with the lowest address survives.
    assert_eq!(p.decide(&side(&["a", "d"]), &side(&["b", "c"]), None), D::DownUnreachable);
    assert_eq!(p.decide(&side(&["b", "c"]), &side(&["a", "d"]), None), D::DownReachable);
}

#[test]
fn keep_oldest() {
    let p = P::KeepOldest { down_if_alone: false };
    assert_eq!(p.decide(&side(&["a"]), &side(&["b", "c"]), None), D::DownUnreachable);
    assert_eq!(p.decide(&side(&["b", "c"]), &side(&["a"]), None), D::DownReachable);
    let p = P::KeepOldest { down_if_alone: true };
    assert_eq!(p.decide(&side(&["a"]), &side(&["b", "c"]), None), D::DownReachable);
    assert_eq!(p.decide(&side(&["b", "c"]), &side(&["a"]), None), D::DownUnreachable);
}

#[test]
fn static_quorum() {
    let p = P::StaticQuorum { quorum: 2 };
    assert_eq!(p.decide(&side(&["a", "b"]), &side(&["c"]), None), D::DownUnreachable);
    assert_eq!(p.decide(&side(&["c"]), &side(&["a", "b"]), None), D::DownReachable);
}

#[test]
fn lease_majority_delays_the_smaller_side() {
    let all: Vec<Member> = (0..5).map(|i| m(&format!("n{i}"), i)).collect();
    let p = P::LeaseMajority { acquire_delay_ms: 1_000 };
    let big = p.decide(&all[..3], &all[3..], None);
    let small = p.decide(&all[3..], &all[..3], None);
    let one = p.decide(&all[4..], &all[..4], None);
    let delay = |d: D| match d {
        D::AcquireLease { delay_ms } => delay_ms,
        other => panic!("expected AcquireLease, got {other:?}"),
    };
    let (big, small, one) = (delay(big), delay(small), delay(one));
    assert_eq!(big, 0);
    assert!(small > big && one > small, "{big} < {small} < {one}");
    assert_eq!(p.decide(&all[3..], &all[..3], Some(true)), D::DownUnreachable);
    assert_eq!(p.decide(&all[..3], &all[3..], Some(false)), D::DownReachable);
}

#[test]
fn nothing_unreachable_means_nothing_to_down() {
    for p in [P::KeepMajority, P::KeepOldest { down_if_alone: true }, P::StaticQuorum { quorum: 9 }] {
        assert_eq!(p.decide(&[m("a", 0)], &[], None), D::DownUnreachable);
    }
}
