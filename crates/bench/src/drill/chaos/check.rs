//! The history checker (Elle's inference for list-append, and the bank's invariant): from
//! the operations the clients recorded and a final read of every key on the final primary.
//!
//! List-append: every acknowledged append is in the final list exactly once (lost,
//! duplicate); no read or final list holds a value nobody wrote (garbage) or one of a
//! failed transaction (G1a); every read is a prefix of its key's final list (incompatible
//! order: divergence); no read ends inside another transaction's appends to the key (G1b);
//! a transaction reads its own appends (internal); an unknown transaction is all or
//! nothing (partial); a client reads its own acknowledged appends (read-your-writes); and
//! the ww / wr / rw graph has no cycle (G0: ww; G1c: ww+wr; G2: with rw). Bank: every
//! read and the final state sum to the initial total; each transfer's two legs are in the
//! ledger if it was acknowledged (lost otherwise), absent if it failed (G1a), both or
//! neither if its outcome is unknown (never half: partial); no leg of a transfer nobody
//! made; and each account's balance is its start plus its legs (a leg applied twice).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::graph::{Edge, Graph};
use super::history::{Body, Mop, Op, Outcome};
use super::workload::INITIAL_BALANCE;

/// What the final primary holds at the end.
#[derive(Debug, Default, Clone)]
pub struct Final {
    pub lists: BTreeMap<u32, Vec<u64>>,
    /// Every account's balance, in account order.
    pub balances: Vec<i64>,
    /// The ledger: (transfer, account, delta), one row per leg.
    pub ledger: Vec<(u64, u32, i64)>,
}

/// One violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anomaly {
    pub kind: &'static str,
    pub detail: String,
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Findings {
    /// Acknowledged appends missing from the final list.
    pub lost: Vec<Anomaly>,
    /// Values present twice in a list.
    pub duplicated: Vec<Anomaly>,
    /// Everything else (G0, G1a, G1b, G1c, G2, incompatible order, ...).
    pub anomalies: Vec<Anomaly>,
}

impl Findings {
    fn note(&mut self, kind: &'static str, detail: String) {
        let a = Anomaly { kind, detail };
        match kind {
            "lost" => self.lost.push(a),
            "duplicate" => self.duplicated.push(a),
            _ => self.anomalies.push(a),
        }
    }

    /// Anomalies by kind: `G1c x2, incompatible-order x1`.
    pub fn anomaly_kinds(&self) -> String {
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for a in &self.anomalies {
            *kinds.entry(a.kind).or_default() += 1;
        }
        kinds
            .iter()
            .map(|(k, n)| format!("{k} x{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Checks the history against the final state; `bank_total` is the sum the accounts
/// started with.
pub fn check(ops: &[Op], fin: &Final, bank_total: i64) -> Findings {
    let mut f = Findings::default();
    check_lists(ops, fin, &mut f);
    check_bank(ops, fin, bank_total, &mut f);
    check_ledger(ops, fin, &mut f);
    f
}

/// Each transfer against the ledger, and the balances against the ledger's legs.
fn check_ledger(ops: &[Op], fin: &Final, f: &mut Findings) {
    let mut legs: HashMap<u64, Vec<(u32, i64)>> = HashMap::new();
    for &(t, account, delta) in &fin.ledger {
        legs.entry(t).or_default().push((account, delta));
    }
    let mut made = HashSet::new();
    for (i, op) in ops.iter().enumerate() {
        let Body::Transfer {
            id,
            from,
            to,
            amount,
        } = op.body
        else {
            continue;
        };
        made.insert(id);
        let mut got = legs.get(&id).cloned().unwrap_or_default();
        got.sort_unstable();
        let mut want = vec![(from, -amount), (to, amount)];
        want.sort_unstable();
        let what = format!(
            "{}: transfer {id} of {amount} from {from} to {to}",
            op.label(i)
        );
        match op.outcome {
            Outcome::Ok if got.is_empty() => {
                f.note("lost", format!("{what}: acknowledged, not in the ledger"))
            }
            Outcome::Fail if !got.is_empty() => f.note(
                "G1a",
                format!(
                    "{what}: failed ({}), yet in the ledger: {got:?}",
                    op.error
                        .as_ref()
                        .map_or(String::new(), |e| format!("{} {}", e.code, e.message))
                ),
            ),
            _ if !got.is_empty() && got != want => f.note(
                "partial",
                format!("{what}: the ledger holds {got:?}, not both legs {want:?}"),
            ),
            _ => {}
        }
    }
    let mut unknown: Vec<&u64> = legs.keys().filter(|t| !made.contains(*t)).collect();
    unknown.sort_unstable();
    if let Some(t) = unknown.first() {
        f.note(
            "garbage",
            format!(
                "the ledger holds {} transfers nobody made, e.g. {t}",
                unknown.len()
            ),
        );
    }
    if made.is_empty() && fin.ledger.is_empty() {
        return;
    }
    for (account, balance) in fin.balances.iter().enumerate() {
        let moved: i64 = fin
            .ledger
            .iter()
            .filter(|(_, a, _)| *a as usize == account)
            .map(|(_, _, d)| d)
            .sum();
        let expected = INITIAL_BALANCE + moved;
        if *balance != expected {
            f.note(
                "bank-balance",
                format!(
                    "account {account} holds {balance}, its legs in the ledger make {expected}"
                ),
            );
        }
    }
}

/// Who appended each value: (operation, key).
fn writers(ops: &[Op]) -> HashMap<u64, (usize, u32)> {
    let mut w = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        for (k, v) in op.appends() {
            w.insert(v, (i, k));
        }
    }
    w
}

/// The reads of acknowledged operations: (operation, key, list, position in its mops).
fn ok_reads(ops: &[Op]) -> impl Iterator<Item = (usize, u32, &[u64], usize)> {
    ops.iter()
        .enumerate()
        .filter(|(_, op)| op.outcome == Outcome::Ok)
        .flat_map(|(i, op)| {
            let mops: &[Mop] = match &op.body {
                Body::List(m) => m,
                _ => &[],
            };
            mops.iter().enumerate().filter_map(move |(pos, m)| match m {
                Mop::Read { key, list: Some(l) } => Some((i, *key, l.as_slice(), pos)),
                _ => None,
            })
        })
}

fn has_duplicates(list: &[u64]) -> Option<u64> {
    let mut seen = HashSet::new();
    list.iter().copied().find(|v| !seen.insert(*v))
}

fn check_lists(ops: &[Op], fin: &Final, f: &mut Findings) {
    let writer = writers(ops);
    let empty = Vec::new();
    let final_of = |k: u32| fin.lists.get(&k).unwrap_or(&empty);
    // Values in the final lists and where they are.
    let mut present: HashSet<u64> = HashSet::new();
    for (k, list) in &fin.lists {
        if let Some(v) = has_duplicates(list) {
            f.note(
                "duplicate",
                format!("key {k}: value {v} twice in the final list"),
            );
        }
        for v in list {
            present.insert(*v);
            see_value(ops, &writer, *v, &format!("the final list of key {k}"), f);
        }
    }
    for (i, op) in ops.iter().enumerate() {
        let appends: Vec<(u32, u64)> = op.appends().collect();
        let there = appends.iter().filter(|(_, v)| present.contains(v)).count();
        match op.outcome {
            Outcome::Ok => {
                for (k, v) in appends.iter().filter(|(_, v)| !present.contains(v)) {
                    f.note(
                        "lost",
                        format!(
                            "{}: append {v} to key {k} missing from the final list",
                            op.label(i)
                        ),
                    );
                }
            }
            Outcome::Info if there > 0 && there < appends.len() => f.note(
                "partial",
                format!(
                    "{}: {there} of its {} appends applied",
                    op.label(i),
                    appends.len()
                ),
            ),
            _ => {}
        }
    }
    for (i, k, list, pos) in ok_reads(ops) {
        let op = &ops[i];
        let what = format!("{}'s read of key {k}", op.label(i));
        if let Some(v) = has_duplicates(list) {
            f.note("duplicate", format!("{what}: value {v} twice"));
        }
        for v in list {
            see_value(ops, &writer, *v, &what, f);
        }
        let fl = final_of(k);
        if !fl.starts_with(list) {
            f.note(
                "incompatible-order",
                format!("{what}: {list:?} is not a prefix of the final {fl:?}"),
            );
        }
        // Its own earlier appends to the key come last, in order.
        let own: Vec<u64> = match &op.body {
            Body::List(m) => m[..pos]
                .iter()
                .filter_map(|m| match m {
                    Mop::Append { key, value } if *key == k => Some(*value),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        if !own.is_empty() && !list.ends_with(&own) {
            f.note(
                "internal",
                format!("{what}: {list:?} does not end with its own {own:?}"),
            );
        }
        // G1b: the last element is not the last its writer appended to the key.
        if let Some(&(w, _)) = list.last().and_then(|last| writer.get(last)) {
            if w != i {
                let last_of_writer = ops[w].appends().filter(|(kk, _)| *kk == k).last();
                if last_of_writer.map(|(_, v)| v) != list.last().copied() {
                    f.note(
                        "G1b",
                        format!("{what} ends inside {}'s appends: {list:?}", ops[w].label(w)),
                    );
                }
            }
        }
    }
    read_your_writes(ops, f);
    cycles(ops, fin, &writer, &present, f);
}

/// A value seen somewhere: written by someone, and not by a failed transaction.
fn see_value(
    ops: &[Op],
    writer: &HashMap<u64, (usize, u32)>,
    v: u64,
    what: &str,
    f: &mut Findings,
) {
    match writer.get(&v) {
        None => f.note("garbage", format!("{what}: value {v} was never written")),
        Some(&(w, _)) if ops[w].outcome == Outcome::Fail => f.note(
            "G1a",
            format!(
                "{what}: value {v} of the failed {} ({})",
                ops[w].label(w),
                ops[w]
                    .error
                    .as_ref()
                    .map_or(String::new(), |e| format!("{} {}", e.code, e.message))
            ),
        ),
        Some(_) => {}
    }
}

/// Each client's reads see the appends it had acknowledged before.
fn read_your_writes(ops: &[Op], f: &mut Findings) {
    let mut by_client: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        by_client.entry(op.client).or_default().push(i);
    }
    for list in by_client.values_mut() {
        list.sort_by_key(|&i| (ops[i].start_ms, i));
        let mut acked: HashMap<u32, u64> = HashMap::new();
        for &i in list.iter() {
            let op = &ops[i];
            if op.outcome != Outcome::Ok {
                continue;
            }
            let Body::List(mops) = &op.body else { continue };
            for m in mops {
                match m {
                    Mop::Read { key, list: Some(l) } => {
                        if let Some(v) = acked.get(key) {
                            if !l.contains(v) {
                                f.note(
                                    "read-your-writes",
                                    format!("{}'s read of key {key} misses its client's acknowledged {v}: {l:?}", op.label(i)),
                                );
                            }
                        }
                    }
                    Mop::Append { .. } | Mop::Read { .. } => {}
                }
            }
            for (k, v) in op.appends() {
                acked.insert(k, v);
            }
        }
    }
}

/// The ww / wr / rw graph of the operations that took effect, and its cycles.
fn cycles(
    ops: &[Op],
    fin: &Final,
    writer: &HashMap<u64, (usize, u32)>,
    present: &HashSet<u64>,
    f: &mut Findings,
) {
    let committed = |i: usize| match ops[i].outcome {
        Outcome::Ok => true,
        Outcome::Info => ops[i].appends().any(|(_, v)| present.contains(&v)),
        Outcome::Fail => false,
    };
    let w = |v: &u64| writer.get(v).map(|&(i, _)| i).filter(|&i| committed(i));
    let mut g = Graph::default();
    for list in fin.lists.values() {
        for pair in list.windows(2) {
            if let (Some(a), Some(b)) = (w(&pair[0]), w(&pair[1])) {
                g.add(a, b, Edge::Ww);
            }
        }
    }
    for (i, k, list, _) in ok_reads(ops) {
        if let Some(a) = list.last().and_then(w) {
            g.add(a, i, Edge::Wr);
        }
        let fl = fin.lists.get(&k).map_or(&[][..], |l| l.as_slice());
        if fl.starts_with(list) {
            if let Some(b) = fl.get(list.len()).and_then(w) {
                g.add(i, b, Edge::Rw);
            }
        }
    }
    let levels: [(&'static str, &[Edge]); 3] = [
        ("G0", &[Edge::Ww]),
        ("G1c", &[Edge::Ww, Edge::Wr]),
        ("G2", &[Edge::Ww, Edge::Wr, Edge::Rw]),
    ];
    for (name, edges) in levels {
        let found = g.cycles(edges);
        for c in &found {
            let path: Vec<String> = c
                .iter()
                .map(|(op, e)| format!("{} -{e:?}->", ops[*op].label(*op)))
                .collect();
            f.note(name, format!("cycle: {} back", path.join(" ")));
        }
        if !found.is_empty() {
            // The wider graphs hold the same cycles: report the narrowest kind only.
            break;
        }
    }
}

fn check_bank(ops: &[Op], fin: &Final, total: i64, f: &mut Findings) {
    for (i, op) in ops.iter().enumerate() {
        if let (Body::Balances(Some(b)), Outcome::Ok) = (&op.body, op.outcome) {
            let sum: i64 = b.iter().sum();
            if sum != total || b.len() != fin.balances.len() {
                f.note(
                    "bank-total",
                    format!(
                        "{} read {} accounts summing to {sum}, not {total}: {b:?}",
                        op.label(i),
                        b.len()
                    ),
                );
            }
        }
    }
    let sum: i64 = fin.balances.iter().sum();
    if sum != total {
        f.note(
            "bank-total",
            format!(
                "the final balances sum to {sum}, not {total}: {:?}",
                fin.balances
            ),
        );
    }
}
