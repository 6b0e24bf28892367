//! Dual token bucket, Algorithm 4 of the Gimbal appendix (§1.d).

use trellis_units::{IoDir, Nanos};

#[derive(Debug)]
pub struct DualTokenBucket {
    pub read_tokens: u64,
    pub write_tokens: u64,
    max_tokens: u64,
    last_ns: u64,
    /// Sub-byte remainder of rate × Δt (units: B·ns/s, < 10⁹), so frequent refills lose nothing.
    carry: u64,
}

const NS_PER_S: u128 = 1_000_000_000;

impl DualTokenBucket {
    /// Both buckets start full [G].
    pub fn new(max_tokens: u64, now_ns: Nanos) -> Self {
        DualTokenBucket {
            read_tokens: max_tokens,
            write_tokens: max_tokens,
            max_tokens,
            last_ns: now_ns,
            carry: 0,
        }
    }

    pub fn refill(&mut self, rate_bytes_per_s: u64, wc_fp10: u64, now_ns: Nanos) {
        if now_ns <= self.last_ns {
            return;
        }
        let dt = now_ns - self.last_ns;
        // u64 unless rate × Δt overflows it (Δt of seconds at GB/s): the
        // u128 division is a library call, and this runs once per dispatch.
        let avail = match rate_bytes_per_s
            .checked_mul(dt)
            .and_then(|x| x.checked_add(self.carry))
        {
            Some(num) => {
                self.carry = num % NS_PER_S as u64;
                num / NS_PER_S as u64
            }
            None => {
                let num = rate_bytes_per_s as u128 * dt as u128 + self.carry as u128;
                self.carry = (num % NS_PER_S) as u64;
                (num / NS_PER_S) as u64
            }
        };
        self.last_ns = now_ns;
        self.add(avail, wc_fp10);
    }

    /// Lines 4-11 of Algorithm 4: split by write cost, overflow moves to the other bucket.
    pub fn add(&mut self, avail: u64, wc_fp10: u64) {
        let den = wc_fp10 + 1024;
        let to_read = match avail.checked_mul(wc_fp10) {
            // A power-of-two divisor (write cost 1.0, the steady state of a
            // read-only load) is a shift: the same quotient without the
            // 64-bit division that is most of this function's cost.
            Some(p) if den.is_power_of_two() => p >> den.trailing_zeros(),
            Some(p) => p / den,
            None => (avail as u128 * wc_fp10 as u128 / (wc_fp10 as u128 + 1024)) as u64,
        };
        self.read_tokens = self.read_tokens.saturating_add(to_read);
        // [R] The write share is the remainder, so truncation never loses a byte
        // (Algorithm 4 truncates both shares; identical on the worked examples).
        self.write_tokens = self.write_tokens.saturating_add(avail - to_read);
        let max = self.max_tokens;
        if self.read_tokens > max {
            self.write_tokens = self
                .write_tokens
                .saturating_add(self.read_tokens - max)
                .min(max);
            self.read_tokens = max;
        }
        if self.write_tokens > max {
            self.read_tokens = self
                .read_tokens
                .saturating_add(self.write_tokens - max)
                .min(max);
            self.write_tokens = max;
        }
    }

    /// Tokens a request of `len` bytes takes (at most a full bucket).
    #[inline]
    pub fn need(&self, len: u32) -> u64 {
        (len as u64).min(self.max_tokens)
    }

    /// Tokens in `dir`'s bucket.
    #[inline]
    pub fn tokens(&self, dir: IoDir) -> u64 {
        match dir {
            IoDir::Write => self.write_tokens,
            IoDir::Read => self.read_tokens,
        }
    }

    /// `try_take`s that all succeed, `bytes` in all (the lane's deferred passes).
    pub fn take_n(&mut self, dir: IoDir, bytes: u64) {
        let b = match dir {
            IoDir::Write => &mut self.write_tokens,
            IoDir::Read => &mut self.read_tokens,
        };
        debug_assert!(*b >= bytes, "the lane's room ends before the bucket does");
        *b = b.saturating_sub(bytes);
    }

    /// Whether `try_take(dir, len)` would succeed now.
    pub fn can_take(&self, dir: IoDir, len: u32) -> bool {
        let need = (len as u64).min(self.max_tokens);
        match dir {
            IoDir::Write => self.write_tokens >= need,
            IoDir::Read => self.read_tokens >= need,
        }
    }

    /// Take the raw length from the matching bucket. [R] An I/O larger than the bucket
    /// needs only a full bucket, or it could never pass.
    pub fn try_take(&mut self, dir: IoDir, len: u32) -> bool {
        let need = (len as u64).min(self.max_tokens);
        let b = match dir {
            IoDir::Write => &mut self.write_tokens,
            IoDir::Read => &mut self.read_tokens,
        };
        if *b < need {
            return false;
        }
        *b -= need;
        true
    }

    /// Time of the last refill: the "now" that `wait_ns` counts from.
    pub fn last_refill_ns(&self) -> u64 {
        self.last_ns
    }

    /// OVERLOADED empties both buckets [G].
    pub fn zero(&mut self) {
        self.read_tokens = 0;
        self.write_tokens = 0;
    }

    /// Conservative time until `dir` has `len` tokens, ignoring overflow from the other bucket.
    pub fn wait_ns(&self, dir: IoDir, len: u32, rate: u64, wc_fp10: u64) -> u64 {
        let need = (len as u64).min(self.max_tokens);
        let (have, share_num) = match dir {
            IoDir::Write => (self.write_tokens, 1024u128),
            IoDir::Read => (self.read_tokens, wc_fp10 as u128),
        };
        let missing = need.saturating_sub(have) as u128;
        let per_s = rate as u128 * share_num / (wc_fp10 as u128 + 1024);
        if per_s == 0 {
            return 1_000_000;
        }
        ((missing * NS_PER_S).div_ceil(per_s) as u64).max(1)
    }
}
