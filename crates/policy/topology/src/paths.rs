//! Link-disjoint paths between two nodes of a small graph: the most paths
//! that share no link, and among those the set with the fewest hops in
//! total. Exhaustive, which is exact and fast for the testbed's handful of
//! nodes (a 2×2 torus plus the client: a few dozen simple paths). A path
//! never passes through a host (hosts do not forward), as in the simulator's
//! routing.

use crate::{NodeKind, Topology};

/// Longest path considered, in hops (the testbed needs at most 3).
pub const MAX_HOPS: usize = 6;

/// One hop: (link index, whether the link is crossed from `a` to `b`).
pub type Hop = (usize, bool);

/// The chosen paths from `src` to `dst`, shortest first.
pub fn disjoint(t: &Topology, src: u32, dst: u32) -> Vec<Vec<Hop>> {
    let mut all = Vec::new();
    let mut walk = Walk {
        t,
        src,
        dst,
        seen: vec![src],
        stack: Vec::new(),
        out: &mut all,
    };
    walk.from(src);
    all.sort_by(|a: &Vec<Hop>, b| a.len().cmp(&b.len()).then(a.cmp(b)));
    let mut best: (usize, usize, Vec<usize>) = (0, usize::MAX, Vec::new());
    let mut chosen = Vec::new();
    search(
        &all,
        0,
        &mut chosen,
        &mut vec![false; t.links.len()],
        &mut best,
    );
    best.2.into_iter().map(|i| all[i].clone()).collect()
}

/// The nodes a path visits, from its source.
pub fn nodes_of(t: &Topology, src: u32, hops: &[Hop]) -> Vec<u32> {
    let mut v = vec![src];
    for &(l, fwd) in hops {
        let link = &t.links[l];
        v.push(if fwd { link.b.node } else { link.a.node });
    }
    v
}

struct Walk<'a> {
    t: &'a Topology,
    src: u32,
    dst: u32,
    seen: Vec<u32>,
    stack: Vec<Hop>,
    out: &'a mut Vec<Vec<Hop>>,
}

impl Walk<'_> {
    fn from(&mut self, at: u32) {
        if at == self.dst {
            self.out.push(self.stack.clone());
            return;
        }
        // Hosts do not forward: only the source may be left from.
        if self.stack.len() == MAX_HOPS || (at != self.src && self.t.kind(at) == NodeKind::Host) {
            return;
        }
        for (i, l) in self.t.links.iter().enumerate() {
            let (next, fwd) = if l.a.node == at {
                (l.b.node, true)
            } else if l.b.node == at {
                (l.a.node, false)
            } else {
                continue;
            };
            if self.seen.contains(&next) {
                continue;
            }
            self.seen.push(next);
            self.stack.push((i, fwd));
            self.from(next);
            self.stack.pop();
            self.seen.pop();
        }
    }
}

/// Depth-first over subsets in path order; keeps the largest set, then the
/// shortest in total (the first found wins ties: deterministic).
fn search(
    all: &[Vec<Hop>],
    from: usize,
    chosen: &mut Vec<usize>,
    used: &mut Vec<bool>,
    best: &mut (usize, usize, Vec<usize>),
) {
    let total: usize = chosen.iter().map(|&i| all[i].len()).sum();
    if chosen.len() > best.0 || (chosen.len() == best.0 && total < best.1) {
        *best = (chosen.len(), total, chosen.clone());
    }
    for i in from..all.len() {
        if all[i].iter().any(|&(l, _)| used[l]) {
            continue;
        }
        for &(l, _) in &all[i] {
            used[l] = true;
        }
        chosen.push(i);
        search(all, i + 1, chosen, used, best);
        chosen.pop();
        for &(l, _) in &all[i] {
            used[l] = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testbed;

    #[test]
    fn the_torus_client_has_four_disjoint_paths_of_one_two_two_and_three_hops() {
        let t = testbed::torus2d();
        let h0 = t.find("h0").unwrap();
        for s in 0..testbed::STORAGE_NODES {
            let ps = disjoint(&t, h0, s);
            let lens: Vec<usize> = ps.iter().map(|p| p.len()).collect();
            assert_eq!(lens, vec![1, 2, 2, 3], "st{s}");
            for p in &ps {
                assert_eq!(nodes_of(&t, h0, p).last(), Some(&s));
            }
        }
    }

    #[test]
    fn switched_has_one_path_through_the_tor_and_none_through_a_host() {
        let mut t = testbed::switched();
        let (h0, tor) = (t.find("h0").unwrap(), t.find("tor").unwrap());
        let ps = disjoint(&t, h0, 2);
        assert_eq!(ps.len(), 1);
        assert_eq!(nodes_of(&t, h0, &ps[0]), vec![h0, tor, 2]);
        // A second client on the ToR is not a way around: h0 → h1 → tor is no path.
        let h1 = t.add_node(NodeKind::Host, "h1");
        t.link(h0, h1, 1, 1);
        t.link(h1, tor, 1, 1);
        assert_eq!(disjoint(&t, h0, 2).len(), 1);
    }
}
