//! Event queue, slab and RNG: the allocation-free core of the discrete-event engine.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A compact event: 24 bytes. Ordered by time, then by insertion sequence, so that
/// runs are deterministic whatever the heap's internal layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ev {
    pub t: u64,
    pub seq: u64,
    pub kind: u8,
    pub a: u32,
}

impl Ord for Ev {
    fn cmp(&self, o: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap and we want the earliest event first.
        (o.t, o.seq).cmp(&(self.t, self.seq))
    }
}

impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

pub struct EventQueue {
    heap: BinaryHeap<Ev>,
    seq: u64,
    pub now: u64,
    pub processed: u64,
}

impl EventQueue {
    pub fn new() -> Self {
        EventQueue {
            heap: BinaryHeap::with_capacity(1 << 16),
            seq: 0,
            now: 0,
            processed: 0,
        }
    }

    pub fn push(&mut self, t: u64, kind: u8, a: u32) {
        debug_assert!(t >= self.now, "event in the past: {t} < {}", self.now);
        self.seq += 1;
        self.heap.push(Ev {
            t,
            seq: self.seq,
            kind,
            a,
        });
    }

    pub fn pop(&mut self) -> Option<Ev> {
        let e = self.heap.pop()?;
        self.now = e.t;
        self.processed += 1;
        Some(e)
    }

    pub fn peek_t(&self) -> Option<u64> {
        self.heap.peek().map(|e| e.t)
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.heap.capacity()
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
