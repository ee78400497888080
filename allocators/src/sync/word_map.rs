//! [`WordMap`]: the hash map of the allocators' own bookkeeping, keyed by addresses and sizes.
//!
//! The standard library's SipHash would cost more than the allocator operation around it, and
//! these keys come from the allocator itself (no untrusted input to defend against). The keys
//! have low bits that are all zero (addresses aligned to 256 bytes or more, sizes in multiples of
//! a class), and hashbrown picks the bucket from a hash's low bits, so a plain multiply would put
//! every key in the same few buckets. One folded 64x64-bit multiply per word (the high and low
//! halves of the product xored) makes every bit of the hash depend on every bit of the key.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes machine words with a folded multiply (see the [module docs](self)).
#[derive(Default)]
pub(crate) struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Keys here are words; this keeps the hasher total for any other key.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let p = u128::from(self.0 ^ n) * 0x9E37_79B9_7F4A_7C15;
        self.0 = (p >> 64) as u64 ^ p as u64;
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A `HashMap` hashed by [`WordHasher`].
pub(crate) type WordMap<K, V> = HashMap<K, V, BuildHasherDefault<WordHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    /// hashbrown takes the bucket from the low bits and a 7-bit tag from the top ones.
    fn spread(hashes: &[u64]) -> (usize, usize) {
        let buckets: HashSet<u64> = hashes.iter().map(|h| h & 4095).collect();
        let tags: HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        (buckets.len(), tags.len())
    }

    #[test]
    fn aligned_addresses_spread_over_buckets_and_tags() {
        let build = BuildHasherDefault::<WordHasher>::default();
        let hashes: Vec<u64> = (0..4096usize).map(|i| build.hash_one(0x7f12_3400_0000 + i * 256)).collect();
        let (buckets, tags) = spread(&hashes);
        assert!(buckets > 2500, "{buckets} distinct buckets of 4096");
        assert_eq!(tags, 128, "every tag value used");
    }

    #[test]
    fn size_and_alignment_pairs_spread_too() {
        let build = BuildHasherDefault::<WordHasher>::default();
        let hashes: Vec<u64> = (0..4096usize).map(|i| build.hash_one((4096 * (i / 4 + 1), 64 << (i % 4)))).collect();
        let (buckets, tags) = spread(&hashes);
        assert!(buckets > 2500, "{buckets} distinct buckets of 4096");
        assert_eq!(tags, 128, "every tag value used");
    }
}
