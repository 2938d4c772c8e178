//! The dependency graph between transactions (Elle's ww, wr and rw edges) and its cycles:
//! strongly connected components by Tarjan's algorithm, then one cycle inside each.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The kind of a dependency edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Edge {
    /// T2 appended right after T1's element.
    Ww,
    /// T2 read a list whose last element T1 appended.
    Wr,
    /// T1 read a list that T2's append later extended (anti-dependency).
    Rw,
}

/// Edges between operations (by index in the history).
#[derive(Default, Debug)]
pub struct Graph {
    edges: BTreeMap<usize, BTreeMap<usize, BTreeSet<Edge>>>,
}

impl Graph {
    pub fn add(&mut self, from: usize, to: usize, kind: Edge) {
        if from != to {
            self.edges
                .entry(from)
                .or_default()
                .entry(to)
                .or_default()
                .insert(kind);
        }
    }

    fn next<'a>(&'a self, n: usize, allowed: &'a [Edge]) -> impl Iterator<Item = usize> + 'a {
        self.edges
            .get(&n)
            .into_iter()
            .flatten()
            .filter(|(_, kinds)| kinds.iter().any(|k| allowed.contains(k)))
            .map(|(to, _)| *to)
    }

    /// One cycle (a list of operations, each with the edge to the next) in each strongly
    /// connected component of the graph restricted to `allowed` edges.
    pub fn cycles(&self, allowed: &[Edge]) -> Vec<Vec<(usize, Edge)>> {
        self.components(allowed)
            .into_iter()
            .filter_map(|c| self.cycle_in(&c, allowed))
            .collect()
    }

    /// Strongly connected components with more than one operation (iterative Tarjan).
    fn components(&self, allowed: &[Edge]) -> Vec<BTreeSet<usize>> {
        let nodes: BTreeSet<usize> = self
            .edges
            .iter()
            .flat_map(|(f, tos)| std::iter::once(*f).chain(tos.keys().copied()))
            .collect();
        let mut index: BTreeMap<usize, usize> = BTreeMap::new();
        let mut low: BTreeMap<usize, usize> = BTreeMap::new();
        let mut on_stack = BTreeSet::new();
        let mut stack = Vec::new();
        let mut out = Vec::new();
        let mut counter = 0;
        for &root in &nodes {
            if index.contains_key(&root) {
                continue;
            }
            // (node, its successors, position in them)
            let mut work: Vec<(usize, Vec<usize>, usize)> = Vec::new();
            index.insert(root, counter);
            low.insert(root, counter);
            counter += 1;
            stack.push(root);
            on_stack.insert(root);
            work.push((root, self.next(root, allowed).collect(), 0));
            while let Some((n, succ, pos)) = work.last_mut() {
                let n = *n;
                if let Some(&m) = succ.get(*pos) {
                    *pos += 1;
                    match index.entry(m) {
                        Entry::Vacant(e) => {
                            e.insert(counter);
                            low.insert(m, counter);
                            counter += 1;
                            stack.push(m);
                            on_stack.insert(m);
                            work.push((m, self.next(m, allowed).collect(), 0));
                        }
                        Entry::Occupied(e) => {
                            if on_stack.contains(&m) {
                                let lm = (*e.get()).min(low[&n]);
                                low.insert(n, lm);
                            }
                        }
                    }
                    continue;
                }
                work.pop();
                if let Some((parent, _, _)) = work.last() {
                    let lp = low[parent].min(low[&n]);
                    low.insert(*parent, lp);
                }
                if low[&n] == index[&n] {
                    let mut comp = BTreeSet::new();
                    while let Some(m) = stack.pop() {
                        on_stack.remove(&m);
                        comp.insert(m);
                        if m == n {
                            break;
                        }
                    }
                    if comp.len() > 1 {
                        out.push(comp);
                    }
                }
            }
        }
        out
    }

    /// A shortest cycle through the component's first operation (breadth-first inside it).
    fn cycle_in(&self, comp: &BTreeSet<usize>, allowed: &[Edge]) -> Option<Vec<(usize, Edge)>> {
        let start = *comp.iter().next()?;
        let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        while let Some(n) = queue.pop_front() {
            for m in self.next(n, allowed).filter(|m| comp.contains(m)) {
                if m == start {
                    let mut path = vec![n];
                    let mut at = n;
                    while at != start {
                        at = *came_from.get(&at)?;
                        path.push(at);
                    }
                    path.reverse();
                    let mut cycle = Vec::new();
                    for (i, &a) in path.iter().enumerate() {
                        let b = path.get(i + 1).copied().unwrap_or(start);
                        cycle.push((a, self.kind(a, b, allowed)?));
                    }
                    return Some(cycle);
                }
                if m != start && !came_from.contains_key(&m) {
                    came_from.insert(m, n);
                    queue.push_back(m);
                }
            }
        }
        None
    }

    fn kind(&self, from: usize, to: usize, allowed: &[Edge]) -> Option<Edge> {
        self.edges
            .get(&from)?
            .get(&to)?
            .iter()
            .copied()
            .find(|k| allowed.contains(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_cycle_and_only_with_its_edges() {
        let mut g = Graph::default();
        g.add(1, 2, Edge::Ww);
        g.add(2, 3, Edge::Wr);
        g.add(3, 1, Edge::Ww);
        g.add(3, 4, Edge::Ww);
        assert!(g.cycles(&[Edge::Ww]).is_empty());
        let c = g.cycles(&[Edge::Ww, Edge::Wr]);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0], vec![(1, Edge::Ww), (2, Edge::Wr), (3, Edge::Ww)]);
    }

    #[test]
    fn no_cycle_in_a_chain() {
        let mut g = Graph::default();
        for i in 0..100 {
            g.add(i, i + 1, Edge::Ww);
            g.add(i, i + 2, Edge::Rw);
        }
        assert!(g.cycles(&[Edge::Ww, Edge::Wr, Edge::Rw]).is_empty());
    }
}
