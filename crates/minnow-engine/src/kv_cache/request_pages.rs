//! One request's share of the [`BlockPool`]: its block table (page `i` holds canvas block `i`),
//! the chain hashes of its committed blocks (each computed once, as the block commits), and how
//! many of those blocks are published for other requests to share.
//!
//! The table grows as the request reaches new blocks ([`RequestPages::grow_to`]) and can lose
//! all its pages to a preemption ([`RequestPages::release`]); the hashes stay, so the resumed
//! request finds what the cache kept of its blocks ([`RequestPages::take_cached`]).

use minnow_model::PageId;

use super::block_pool::{BlockHash, BlockPool};

pub(crate) struct RequestPages {
    /// The block table.
    pages: Vec<PageId>,
    /// Where the request's hash chain starts; `None` when it opted out of the prefix cache.
    root: Option<BlockHash>,
    /// Chain hashes of the request's committed blocks, in order.
    hashes: Vec<BlockHash>,
    /// Leading pages of the table that are published (or were found in the cache).
    published: usize,
}

impl RequestPages {
    pub fn new(root: Option<BlockHash>) -> Self {
        RequestPages {
            pages: Vec::new(),
            root,
            hashes: Vec::new(),
            published: 0,
        }
    }

    /// The block table.
    pub fn pages(&self) -> &[PageId] {
        &self.pages
    }

    /// Extends the hash chain over the complete blocks of `committed` (the request's committed
    /// ids from position 0) that have none yet.
    pub fn hash_committed(&mut self, committed: &[u32], block: usize) {
        let Some(root) = self.root else {
            return;
        };
        let complete = committed.len() / block;
        while self.hashes.len() < complete {
            let i = self.hashes.len();
            let parent = self.hashes.last().copied().unwrap_or(root);
            self.hashes
                .push(parent.child(&committed[i * block..(i + 1) * block]));
        }
    }

    /// Starts an empty block table with the longest run of the request's hashed blocks that the
    /// cache holds (each held once more); returns how many blocks it found.
    pub fn take_cached(&mut self, pool: &mut BlockPool) -> usize {
        debug_assert!(self.pages.is_empty(), "a cache hit starts the table");
        self.pages = pool.lookup(&self.hashes);
        self.published = self.pages.len();
        self.pages.len()
    }

    /// Grows the table to `n` pages with fresh ones (free pages first, then evicted cached
    /// ones). `false`, and nothing taken, when the pool cannot give them now.
    pub fn grow_to(&mut self, pool: &mut BlockPool, n: usize) -> bool {
        if self.pages.len() >= n {
            return true;
        }
        match pool.allocate(n - self.pages.len()) {
            Some(fresh) => {
                self.pages.extend(fresh);
                true
            }
            None => false,
        }
    }

    /// Gives back the pages beyond the first `n` (an unused reserve: never written, never
    /// published); returns how many.
    pub fn shrink_to(&mut self, pool: &mut BlockPool, n: usize) -> usize {
        if self.pages.len() <= n {
            return 0;
        }
        debug_assert!(self.published <= n, "a published page is never a reserve");
        let extra = self.pages.split_off(n);
        pool.release(&extra);
        extra.len()
    }

    /// Publishes the hashed blocks among the first `blocks` of the table (those whose K/V are
    /// final in their pages) that are not published yet.
    pub fn publish(&mut self, pool: &mut BlockPool, blocks: usize) {
        let end = blocks.min(self.hashes.len()).min(self.pages.len());
        while self.published < end {
            pool.publish(self.pages[self.published], self.hashes[self.published]);
            self.published += 1;
        }
    }

    /// Gives every page back (in block order, so eviction takes the chain's tail first); the
    /// hashes stay for [`RequestPages::take_cached`].
    pub fn release(&mut self, pool: &mut BlockPool) {
        pool.release(&std::mem::take(&mut self.pages));
        self.published = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_computed_once_and_match_the_chain() {
        let root = BlockHash::root("m", None);
        let ids: Vec<u32> = (0..12).collect();
        let mut pages = RequestPages::new(Some(root));
        pages.hash_committed(&ids[..5], 4);
        assert_eq!(pages.hashes, BlockHash::chain(root, &ids[..4], 4));
        pages.hash_committed(&ids, 4);
        assert_eq!(pages.hashes, BlockHash::chain(root, &ids, 4));
        let mut private = RequestPages::new(None);
        private.hash_committed(&ids, 4);
        assert!(private.hashes.is_empty(), "no cache, no hashes");
    }

    #[test]
    fn a_released_request_finds_its_published_blocks_again() {
        let mut pool = BlockPool::new(6, 4);
        let ids: Vec<u32> = (0..12).collect();
        let mut pages = RequestPages::new(Some(BlockHash::root("m", None)));
        assert!(pages.grow_to(&mut pool, 4));
        pages.hash_committed(&ids, 4);
        // Only the first two blocks' K/V are final.
        pages.publish(&mut pool, 2);
        assert_eq!(pool.stats().pages_held, 4);
        pages.release(&mut pool);
        let stats = pool.stats();
        assert_eq!((stats.pages_held, stats.pages_cached), (0, 2));
        assert_eq!(pages.take_cached(&mut pool), 2);
        assert!(pages.grow_to(&mut pool, 3));
        assert_eq!(pages.pages().len(), 3);
        assert!(!pages.grow_to(&mut pool, 10), "more than the pool");
        assert_eq!(pages.pages().len(), 3, "nothing taken");
        assert!(pages.grow_to(&mut pool, 4));
        assert_eq!(pages.shrink_to(&mut pool, 3), 1);
        assert_eq!(pool.stats().pages_held, 3);
    }
}
