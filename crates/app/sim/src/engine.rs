//! Event queue, slab and RNG: the allocation-free core of the discrete-event engine.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A popped event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ev {
    pub t: u64,
    pub kind: u8,
    pub a: u32,
}

/// An event beyond the wheel's horizon. Ordered by time, then by insertion sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Far {
    t: u64,
    seq: u64,
    kind: u8,
    a: u32,
}

impl Ord for Far {
    fn cmp(&self, o: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap and we want the earliest event first.
        (o.t, o.seq).cmp(&(self.t, self.seq))
    }
}

impl PartialOrd for Far {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Wheel: `WHEEL` buckets of `2^GRAIN_BITS` ns; events whose bucket is less than `WHEEL`
/// buckets ahead of `now`'s go into the wheel (horizon ≈ 131 µs).
const GRAIN_BITS: u32 = 4;
const WHEEL_BITS: u32 = 13;
const WHEEL: usize = 1 << WHEEL_BITS;
const WMASK: u64 = WHEEL as u64 - 1;
const WWORDS: usize = WHEEL / 64;
const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node {
    t: u64,
    a: u32,
    next: u32,
    kind: u8,
}

/// The event queue: pops in (time, insertion order), exactly like a (time, seq) heap.
///
/// Near events sit in a timing wheel of 16 ns buckets, each a list sorted by time with
/// equal times in insertion order (a new event goes after every event not later than it;
/// usually that is the tail), found through a two-level occupancy bitmap. Far events sit
/// in a binary heap keyed on (time, seq) and move into the wheel, in that order, as soon
/// as `now` brings their bucket within the horizon, before any later push can target the
/// same time, so equal-time events still pop in insertion order. The wheel's bucket
/// array is small enough (64 KiB) to stay in cache.
pub struct EventQueue {
    /// Per bucket: (head, tail) of its list.
    slots: Vec<[u32; 2]>,
    bits: Vec<u64>,
    summary: Vec<u64>,
    nodes: Vec<Node>,
    free: u32,
    near: usize,
    far: BinaryHeap<Far>,
    seq: u64,
    pub now: u64,
    pub processed: u64,
}

impl EventQueue {
    pub fn new() -> Self {
        EventQueue {
            slots: vec![[NIL; 2]; WHEEL],
            bits: vec![0; WWORDS],
            summary: vec![0; WWORDS.div_ceil(64)],
            nodes: Vec::with_capacity(1 << 16),
            free: NIL,
            near: 0,
            far: BinaryHeap::new(),
            seq: 0,
            now: 0,
            processed: 0,
        }
    }

    #[inline]
    fn is_near(&self, t: u64) -> bool {
        (t >> GRAIN_BITS) - (self.now >> GRAIN_BITS) < WHEEL as u64
    }

    #[inline]
    pub fn push(&mut self, t: u64, kind: u8, a: u32) {
        debug_assert!(t >= self.now, "event in the past: {t} < {}", self.now);
        if self.is_near(t) {
            self.push_near(t, kind, a);
        } else {
            self.seq += 1;
            self.far.push(Far {
                t,
                seq: self.seq,
                kind,
                a,
            });
        }
    }

    #[inline]
    fn push_near(&mut self, t: u64, kind: u8, a: u32) {
        let n = Node {
            t,
            a,
            next: NIL,
            kind,
        };
        let i = if self.free != NIL {
            let i = self.free;
            self.free = self.nodes[i as usize].next;
            self.nodes[i as usize] = n;
            i
        } else {
            self.nodes.push(n);
            self.nodes.len() as u32 - 1
        };
        let s = ((t >> GRAIN_BITS) & WMASK) as usize;
        let [hd, tl] = self.slots[s];
        if tl == NIL {
            self.slots[s] = [i, i];
            self.bits[s / 64] |= 1 << (s % 64);
            self.summary[s / 4096] |= 1 << (s / 64 % 64);
        } else if self.nodes[tl as usize].t <= t {
            self.nodes[tl as usize].next = i;
            self.slots[s][1] = i;
        } else if self.nodes[hd as usize].t > t {
            self.nodes[i as usize].next = hd;
            self.slots[s][0] = i;
        } else {
            // After the last event not later than t (the tail is later, so one exists).
            let mut p = hd;
            loop {
                let nx = self.nodes[p as usize].next;
                if self.nodes[nx as usize].t > t {
                    self.nodes[i as usize].next = nx;
                    self.nodes[p as usize].next = i;
                    break;
                }
                p = nx;
            }
        }
        self.near += 1;
    }

    /// The first occupied wheel slot at or cyclically after `now`'s.
    #[inline]
    fn first_slot(&self) -> usize {
        let s0 = ((self.now >> GRAIN_BITS) & WMASK) as usize;
        let w0 = s0 / 64;
        let m = self.bits[w0] & (!0u64 << (s0 % 64));
        if m != 0 {
            return w0 * 64 + m.trailing_zeros() as usize;
        }
        // Later words, then wrap around (at most one full turn).
        let mut w = w0 + 1;
        for _ in 0..2 {
            while w < WWORDS {
                let sw = w / 64;
                let sm = self.summary[sw] & (!0u64 << (w % 64));
                if sm != 0 {
                    let w1 = sw * 64 + sm.trailing_zeros() as usize;
                    return w1 * 64 + self.bits[w1].trailing_zeros() as usize;
                }
                w = (sw + 1) * 64;
            }
            w = 0;
        }
        // Only the part of word w0 before s0 is left.
        w0 * 64 + self.bits[w0].trailing_zeros() as usize
    }

    #[inline]
    pub fn pop(&mut self) -> Option<Ev> {
        self.pop_until(u64::MAX)
    }

    /// Pop the next event if its time is at most `until` (one bucket search for both).
    #[inline]
    pub fn pop_until(&mut self, until: u64) -> Option<Ev> {
        let e = if self.near > 0 {
            let s = self.first_slot();
            let i = self.slots[s][0];
            let n = self.nodes[i as usize];
            if n.t > until {
                return None;
            }
            self.slots[s][0] = n.next;
            if n.next == NIL {
                self.slots[s][1] = NIL;
                self.bits[s / 64] &= !(1 << (s % 64));
                if self.bits[s / 64] == 0 {
                    self.summary[s / 4096] &= !(1 << (s / 64 % 64));
                }
            }
            self.nodes[i as usize].next = self.free;
            self.free = i;
            self.near -= 1;
            Ev {
                t: n.t,
                kind: n.kind,
                a: n.a,
            }
        } else {
            if self.far.peek()?.t > until {
                return None;
            }
            let f = self.far.pop()?;
            Ev {
                t: f.t,
                kind: f.kind,
                a: f.a,
            }
        };
        self.now = e.t;
        self.processed += 1;
        // Far events now within the horizon join the wheel before anything else is pushed.
        while let Some(f) = self.far.peek() {
            if !self.is_near(f.t) {
                break;
            }
            let f = self.far.pop().unwrap();
            self.push_near(f.t, f.kind, f.a);
        }
        Some(e)
    }

    pub fn peek_t(&self) -> Option<u64> {
        if self.near > 0 {
            let s = self.first_slot();
            Some(self.nodes[self.slots[s][0] as usize].t)
        } else {
            self.far.peek().map(|f| f.t)
        }
    }

    pub fn len(&self) -> usize {
        self.near + self.far.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.nodes.capacity() + self.far.capacity()
    }
}

impl Default for EventQueue {
    fn default() -> Self {
        Self::new()
    }
}

/// Fixed-type slab with a free list: indices stay valid until freed; no per-object allocation
/// once warm.
pub struct Slab<T> {
    items: Vec<T>,
    free: Vec<u32>,
    live: usize,
    limit: usize,
}

impl<T> Slab<T> {
    pub fn new(limit: usize) -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
            live: 0,
            limit,
        }
    }

    pub fn insert(&mut self, v: T) -> u32 {
        self.live += 1;
        assert!(
            self.live <= self.limit,
            "slab limit {} exceeded",
            self.limit
        );
        if let Some(i) = self.free.pop() {
            self.items[i as usize] = v;
            i
        } else {
            self.items.push(v);
            self.items.len() as u32 - 1
        }
    }

    pub fn remove(&mut self, i: u32) {
        self.live -= 1;
        self.free.push(i);
    }

    pub fn get(&self, i: u32) -> &T {
        &self.items[i as usize]
    }

    pub fn get_mut(&mut self, i: u32) -> &mut T {
        &mut self.items[i as usize]
    }

    pub fn live(&self) -> usize {
        self.live
    }

    pub fn capacity(&self) -> usize {
        self.items.capacity()
    }
}

/// xoshiro256** seeded by splitmix64: small, fast, and ours (bit-identical everywhere).
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with the given mean (Poisson inter-arrivals).
    pub fn exp_ns(&mut self, mean_ns: f64) -> u64 {
        let u = 1.0 - self.unit();
        (-u.ln() * mean_ns) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_pops_in_time_then_insertion_order() {
        let mut q = EventQueue::new();
        q.push(10, 1, 1);
        q.push(5, 1, 2);
        q.push(10, 1, 3);
        q.push(5, 1, 4);
        let order: Vec<u32> = std::iter::from_fn(|| q.pop().map(|e| e.a)).collect();
        assert_eq!(order, vec![2, 4, 1, 3]);
        assert_eq!(q.now, 10);
    }

    /// The wheel + far heap against a plain (time, seq) sort, with far events that join
    /// the wheel and then tie with events pushed directly.
    #[test]
    fn queue_matches_time_seq_order_across_the_horizon() {
        let mut q = EventQueue::new();
        let mut rng = Rng::new(3);
        let mut reference: Vec<(u64, u64, u32)> = Vec::new();
        let mut seq = 0u64;
        let mut got = Vec::new();
        let mut want = Vec::new();
        for round in 0..20_000u32 {
            let n = rng.below(3);
            for _ in 0..n {
                let d = match rng.below(4) {
                    0 => rng.below(4),
                    1 => rng.below(1000),
                    2 => ((WHEEL as u64 - 1) << GRAIN_BITS) + rng.below(64),
                    _ => rng.below((3 * (WHEEL as u64)) << GRAIN_BITS),
                };
                // Coarse times so that ties are common.
                let t = (q.now + d) / 4 * 4;
                let t = t.max(q.now);
                seq += 1;
                q.push(t, 0, round);
                reference.push((t, seq, round));
            }
            if rng.below(2) == 0 {
                if let Some(pt) = q.peek_t() {
                    let e = q.pop().unwrap();
                    assert_eq!(pt, e.t);
                    got.push((e.t, e.a));
                    reference.sort();
                    let r = reference.remove(0);
                    want.push((r.0, r.2));
                }
            }
        }
        while let Some(e) = q.pop() {
            got.push((e.t, e.a));
        }
        reference.sort();
        want.extend(reference.iter().map(|r| (r.0, r.2)));
        assert_eq!(got, want);
    }

    #[test]
    fn rng_is_reproducible_and_uniform_enough() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        let xs: Vec<u64> = (0..100).map(|_| a.below(10)).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.below(10)).collect();
        assert_eq!(xs, ys);
        let mut c = Rng::new(1);
        let mut hist = [0u32; 4];
        for _ in 0..40_000 {
            hist[c.below(4) as usize] += 1;
        }
        for h in hist {
            assert!((9_000..11_000).contains(&h), "{hist:?}");
        }
    }

    #[test]
    fn slab_reuses_freed_slots() {
        let mut s = Slab::new(2);
        let a = s.insert(1);
        let _b = s.insert(2);
        s.remove(a);
        assert_eq!(s.insert(3), a);
        assert_eq!(*s.get(a), 3);
    }
}
