//! Link-disjoint paths between two nodes of a small graph: the most paths
//! that share no link, and among those the set with the fewest hops in
//! total. Exhaustive, which is exact and fast for the testbed's handful of
//! nodes (a 2×2 torus plus the client: a few dozen simple paths).

use crate::topo::Link;

/// Longest path considered, in hops (the testbed needs at most 3).
const MAX_HOPS: usize = 6;

/// The chosen paths from `src` to `dst`, shortest first: each a list of
/// (link index, crossed from `a` to `b`).
pub fn disjoint(links: &[Link], src: &str, dst: &str) -> Vec<Vec<(usize, bool)>> {
    let mut all = Vec::new();
    let mut stack = Vec::new();
    let mut seen = vec![src.to_string()];
    walk(links, src, dst, &mut seen, &mut stack, &mut all);
    all.sort_by(|a: &Vec<(usize, bool)>, b| a.len().cmp(&b.len()).then(a.cmp(b)));
    let mut best: (usize, usize, Vec<usize>) = (0, usize::MAX, Vec::new());
    let mut chosen = Vec::new();
    search(
        &all,
        0,
        &mut chosen,
        &mut vec![false; links.len()],
        &mut best,
    );
    best.2.into_iter().map(|i| all[i].clone()).collect()
}

fn walk(
    links: &[Link],
    at: &str,
    dst: &str,
    seen: &mut Vec<String>,
    stack: &mut Vec<(usize, bool)>,
    out: &mut Vec<Vec<(usize, bool)>>,
) {
    if at == dst {
        out.push(stack.clone());
        return;
    }
    if stack.len() == MAX_HOPS {
        return;
    }
    for (i, l) in links.iter().enumerate() {
        let (next, fwd) = if l.a == at {
            (&l.b, true)
        } else if l.b == at {
            (&l.a, false)
        } else {
            continue;
        };
        if seen.iter().any(|s| s == next) {
            continue;
        }
        seen.push(next.clone());
        stack.push((i, fwd));
        walk(links, next, dst, seen, stack, out);
        stack.pop();
        seen.pop();
    }
}

/// Depth-first over subsets in path order; keeps the largest set, then the
/// shortest in total (the first found wins ties: deterministic).
fn search(
    all: &[Vec<(usize, bool)>],
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
