//! The checker on small hand-made histories: each anomaly is found, and clean histories
//! (with unknown and failed transactions, stale reads) pass.

use super::check::{check, Final, Findings};
use super::history::{Body, Listener, Mop, Op, OpError, Outcome};

fn a(key: u32, value: u64) -> Mop {
    Mop::Append { key, value }
}

fn r(key: u32, list: &[u64]) -> Mop {
    Mop::Read {
        key,
        list: Some(list.to_vec()),
    }
}

fn op(client: u32, t: u64, outcome: Outcome, mops: Vec<Mop>) -> Op {
    Op {
        client,
        listener: Listener::Main,
        prepared: false,
        explicit: true,
        start_ms: t,
        end_ms: t + 1,
        body: Body::List(mops),
        outcome,
        error: (outcome != Outcome::Ok).then(|| OpError {
            code: 1213,
            message: "Deadlock found".into(),
            at_commit: true,
        }),
    }
}

fn fin(lists: &[(u32, &[u64])]) -> Final {
    Final {
        lists: lists.iter().map(|(k, l)| (*k, l.to_vec())).collect(),
        balances: vec![50, 50],
        ledger: Vec::new(),
    }
}

fn kinds(f: &Findings) -> Vec<&'static str> {
    let mut k: Vec<_> = f
        .lost
        .iter()
        .chain(&f.duplicated)
        .chain(&f.anomalies)
        .map(|a| a.kind)
        .collect();
    k.sort_unstable();
    k.dedup();
    k
}

fn run(ops: &[Op], f: &Final) -> Vec<&'static str> {
    kinds(&check(ops, f, 100))
}

#[test]
fn a_clean_history_passes() {
    use Outcome::*;
    let ops = [
        op(0, 0, Ok, vec![a(1, 10), a(2, 20)]),
        op(1, 2, Ok, vec![r(1, &[10]), a(1, 11)]),
        // A stale read (a replica behind): a prefix, fine.
        op(2, 4, Ok, vec![r(1, &[])]),
        // Unknown: applied.
        op(3, 6, Info, vec![a(2, 21)]),
        // Unknown: not applied.
        op(3, 8, Info, vec![a(2, 22)]),
        // Failed, not applied.
        op(4, 10, Fail, vec![a(1, 12)]),
        op(5, 12, Ok, vec![r(1, &[10, 11]), r(2, &[20, 21])]),
        // Reads its own append.
        op(6, 14, Ok, vec![a(3, 30), r(3, &[30])]),
    ];
    let f = fin(&[(1, &[10, 11]), (2, &[20, 21]), (3, &[30])]);
    assert_eq!(run(&ops, &f), Vec::<&str>::new());
}

#[test]
fn lost_and_duplicated_writes() {
    use Outcome::*;
    let ops = [op(0, 0, Ok, vec![a(1, 10)]), op(1, 2, Ok, vec![a(1, 11)])];
    assert_eq!(run(&ops, &fin(&[(1, &[10])])), vec!["lost"]);
    assert_eq!(
        run(&ops, &fin(&[(1, &[10, 11, 10])])),
        vec!["G0", "duplicate"]
    );
    let read_twice = [
        op(0, 0, Ok, vec![a(1, 10)]),
        op(1, 2, Ok, vec![r(1, &[10, 10])]),
    ];
    assert_eq!(
        run(&read_twice, &fin(&[(1, &[10])])),
        vec!["duplicate", "incompatible-order"]
    );
}

#[test]
fn g1a_aborted_read_and_garbage() {
    use Outcome::*;
    let ops = [
        op(0, 0, Fail, vec![a(1, 10)]),
        op(1, 2, Ok, vec![r(1, &[10])]),
    ];
    // Seen by a read (and in the final list).
    assert_eq!(run(&ops, &fin(&[(1, &[10])])), vec!["G1a"]);
    let garbage = [op(1, 2, Ok, vec![r(1, &[99])])];
    assert_eq!(run(&garbage, &fin(&[(1, &[99])])), vec!["garbage"]);
}

#[test]
fn g1b_intermediate_read() {
    use Outcome::*;
    let ops = [
        op(0, 0, Ok, vec![a(1, 10), a(1, 11)]),
        op(1, 2, Ok, vec![r(1, &[10])]),
    ];
    assert_eq!(run(&ops, &fin(&[(1, &[10, 11])])), vec!["G1b", "G2"]);
}

#[test]
fn incompatible_order_is_divergence() {
    use Outcome::*;
    let ops = [
        op(0, 0, Ok, vec![a(1, 10)]),
        op(1, 1, Ok, vec![a(1, 11)]),
        op(2, 3, Ok, vec![r(1, &[11])]),
    ];
    assert_eq!(
        run(&ops, &fin(&[(1, &[10, 11])])),
        vec!["incompatible-order"]
    );
}

#[test]
fn g0_write_cycle() {
    use Outcome::*;
    // T1 before T2 on key 1, T2 before T1 on key 2.
    let ops = [
        op(0, 0, Ok, vec![a(1, 10), a(2, 21)]),
        op(1, 0, Ok, vec![a(1, 11), a(2, 20)]),
    ];
    assert_eq!(
        run(&ops, &fin(&[(1, &[10, 11]), (2, &[20, 21])])),
        vec!["G0"]
    );
}

#[test]
fn g1c_circular_information_flow() {
    use Outcome::*;
    // T1 reads T2's append to key 2; T2 appended after T1 on key 1.
    let ops = [
        op(0, 0, Ok, vec![a(1, 10), r(2, &[20])]),
        op(1, 0, Ok, vec![a(1, 11), a(2, 20)]),
    ];
    assert_eq!(run(&ops, &fin(&[(1, &[10, 11]), (2, &[20])])), vec!["G1c"]);
}

#[test]
fn g2_anti_dependency_cycle() {
    use Outcome::*;
    // Write skew: each reads the other's key empty, then appends to its own.
    let ops = [
        op(0, 0, Ok, vec![r(1, &[]), a(2, 20)]),
        op(1, 0, Ok, vec![r(2, &[]), a(1, 10)]),
    ];
    assert_eq!(run(&ops, &fin(&[(1, &[10]), (2, &[20])])), vec!["G2"]);
}

#[test]
fn internal_partial_and_read_your_writes() {
    use Outcome::*;
    let internal = [op(0, 0, Ok, vec![a(1, 10), r(1, &[])])];
    assert_eq!(run(&internal, &fin(&[(1, &[10])])), vec!["internal"]);
    let partial = [op(0, 0, Info, vec![a(1, 10), a(2, 20)])];
    assert_eq!(run(&partial, &fin(&[(1, &[10])])), vec!["partial"]);
    let stale_own = [op(0, 0, Ok, vec![a(1, 10)]), op(0, 5, Ok, vec![r(1, &[])])];
    assert_eq!(
        run(&stale_own, &fin(&[(1, &[10])])),
        vec!["read-your-writes"]
    );
    // Another client's stale read is allowed.
    let stale_other = [op(0, 0, Ok, vec![a(1, 10)]), op(1, 5, Ok, vec![r(1, &[])])];
    assert_eq!(run(&stale_other, &fin(&[(1, &[10])])), Vec::<&str>::new());
}

#[test]
fn bank_totals() {
    let read = |b: Vec<i64>| Op {
        body: Body::Balances(Some(b)),
        ..op(0, 0, Outcome::Ok, Vec::new())
    };
    let f = fin(&[]);
    assert_eq!(run(&[read(vec![60, 40])], &f), Vec::<&str>::new());
    assert_eq!(run(&[read(vec![60, 50])], &f), vec!["bank-total"]);
    let mut wrong_final = fin(&[]);
    wrong_final.balances = vec![50, 40];
    assert_eq!(run(&[], &wrong_final), vec!["bank-total"]);
}

#[test]
fn each_transfer_against_the_ledger() {
    use super::workload::INITIAL_BALANCE as B;
    let transfer = |id: u64, outcome: Outcome| Op {
        body: Body::Transfer {
            id,
            from: 0,
            to: 1,
            amount: 5,
        },
        ..op(0, id, outcome, Vec::new())
    };
    // The ledger holds `legs` (transfer, account, delta); balances follow from them.
    let with = |legs: &[(u64, u32, i64)]| {
        let mut f = fin(&[]);
        f.balances = vec![B, B];
        for &(_, a, d) in legs {
            f.balances[a as usize] += d;
        }
        f.ledger = legs.to_vec();
        f
    };
    let both = |id| [(id, 0, -5), (id, 1, 5)];
    let total = 2 * B;
    let run = |ops: &[Op], f: &Final| kinds(&check(ops, f, total));
    use Outcome::*;
    // Acknowledged and present; failed and absent; unknown either way: clean.
    let ops = [
        transfer(1, Ok),
        transfer(2, Fail),
        transfer(3, Info),
        transfer(4, Info),
    ];
    let legs: Vec<_> = both(1).into_iter().chain(both(3)).collect();
    assert_eq!(run(&ops, &with(&legs)), Vec::<&str>::new());
    // Acknowledged, absent.
    assert_eq!(run(&[transfer(1, Ok)], &with(&[])), vec!["lost"]);
    // Failed, present.
    assert_eq!(run(&[transfer(2, Fail)], &with(&both(2))), vec!["G1a"]);
    // Half of an unknown one.
    assert_eq!(
        run(&[transfer(3, Info)], &with(&[(3, 0, -5)])),
        vec!["bank-total", "partial"]
    );
    // A leg nobody made.
    assert_eq!(run(&[], &with(&both(9))), vec!["garbage"]);
    // A leg applied twice to the balance (the ledger row once).
    let mut twice = with(&both(1));
    twice.balances[0] -= 5;
    twice.balances[1] += 5;
    assert_eq!(run(&[transfer(1, Ok)], &twice), vec!["bank-balance"]);
}
