//! Bounded storage for queued requests: one pool of nodes per scheduler, and any
//! number of intrusive FIFO lists threaded through it.
//!
//! Why intrusive lists: a per-tenant `VecDeque` pre-allocated to its bound costs
//! `max_tenants × bound` entries per SSD (64 × 1024 × 16 B = 1 MiB), which the
//! simulator pays for thousands of SSDs. One shared pool costs its total bound once,
//! and a per-tenant bound is then only a counter.

/// "No node": the end of a list or of the free list.
const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Node<T> {
    val: T,
    next: u32,
}

/// A FIFO of values stored in a [`ListPool`]. Only the pool that filled it may read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl List {
    pub const fn new() -> Self {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub fn len(&self) -> u32 {
        self.len
    }
}

impl Default for List {
    fn default() -> Self {
        Self::new()
    }
}

/// Fixed-capacity node storage. `prealloc` nodes are allocated up front; beyond that
/// the pool grows by amortised doubling up to `capacity` and never shrinks, so once
/// warm (or with `prealloc == capacity`) pushing and popping never allocate.
#[derive(Debug)]
pub struct ListPool<T> {
    nodes: Vec<Node<T>>,
    free: u32,
    capacity: u32,
    live: u32,
}

impl<T: Copy> ListPool<T> {
    pub fn new(capacity: u32, prealloc: u32) -> Self {
        assert!(
            capacity < NIL,
            "pool capacity must leave room for the NIL index"
        );
        ListPool {
            nodes: Vec::with_capacity(prealloc.min(capacity) as usize),
            free: NIL,
            capacity,
            live: 0,
        }
    }

    /// Values stored in all lists together.
    pub fn live(&self) -> u32 {
        self.live
    }

    /// Append `val` to `list`; false (and nothing changes) when the pool is full.
    pub fn push_back(&mut self, list: &mut List, val: T) -> bool {
        let node = Node { val, next: NIL };
        let i = if self.free != NIL {
            let i = self.free;
            self.free = self.nodes[i as usize].next;
            self.nodes[i as usize] = node;
            i
        } else if (self.nodes.len() as u32) < self.capacity {
            self.nodes.push(node);
            self.nodes.len() as u32 - 1
        } else {
            return false;
        };
        if list.tail == NIL {
            list.head = i;
        } else {
            self.nodes[list.tail as usize].next = i;
        }
        list.tail = i;
        list.len += 1;
        self.live += 1;
        true
    }

    pub fn front(&self, list: &List) -> Option<T> {
        (list.head != NIL).then(|| self.nodes[list.head as usize].val)
    }

    pub fn pop_front(&mut self, list: &mut List) -> Option<T> {
        if list.head == NIL {
            return None;
        }
        let i = list.head;
        let node = self.nodes[i as usize];
        list.head = node.next;
        if list.head == NIL {
            list.tail = NIL;
        }
        list.len -= 1;
        self.nodes[i as usize].next = self.free;
        self.free = i;
        self.live -= 1;
        Some(node.val)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_share_a_bounded_pool_and_reuse_freed_nodes() {
        let mut pool = ListPool::new(3, 0);
        let (mut a, mut b) = (List::new(), List::new());
        assert!(pool.push_back(&mut a, 1));
        assert!(pool.push_back(&mut b, 10));
        assert!(pool.push_back(&mut a, 2));
        assert!(!pool.push_back(&mut b, 11), "capacity 3 reached");
        assert_eq!(pool.pop_front(&mut a), Some(1));
        assert!(pool.push_back(&mut b, 11), "the freed node is reused");
        assert_eq!((a.len(), b.len(), pool.live()), (1, 2, 3));
        assert_eq!(pool.pop_front(&mut b), Some(10));
        assert_eq!(pool.pop_front(&mut b), Some(11));
        assert_eq!(pool.pop_front(&mut b), None);
        assert_eq!(pool.front(&a), Some(2));
        assert_eq!(pool.nodes.len(), 3, "never grew past its capacity");
    }
}
