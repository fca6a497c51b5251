//! The block pool: every page of the runner's K/V pool, with the cross-request prefix cache.
//!
//! Every page of the runner's pool is in exactly one of three states:
//! - **held**: referenced by one or more running requests (a committed block may be held by many;
//!   an in-flight block is held by exactly one, and is never published);
//! - **cached**: unreferenced, but holding a committed block under its chain hash, so a later
//!   request whose prompt starts with the same blocks takes it instead of recomputing it; these
//!   are evicted least-recently-released first when a request needs pages;
//! - **free**: nothing in it.
//!
//! A block's hash chains its parent's hash with its ids, so a hit on block `i` implies the whole
//! prefix `0..=i` matches. The chain starts from the model identity and the request's
//! `cache_salt`, so tenants with different salts never share a page.

use std::collections::{BTreeMap, HashMap};

use minnow_model::PageId;

/// Chain hash of one block (128 bits of BLAKE3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockHash([u8; 16]);

impl BlockHash {
    /// The hash a chain starts from: the model identity and the tenant's salt.
    pub fn root(model_identity: &str, salt: Option<&str>) -> BlockHash {
        let mut h = blake3::Hasher::new();
        h.update(b"minnow prefix cache v1\0");
        h.update(&(model_identity.len() as u64).to_le_bytes());
        h.update(model_identity.as_bytes());
        match salt {
            Some(s) => {
                h.update(&[1]);
                h.update(s.as_bytes());
            }
            None => {
                h.update(&[0]);
            }
        }
        BlockHash::from(h)
    }

    /// The hash of the block of `ids` that follows `self`.
    pub fn child(&self, ids: &[u32]) -> BlockHash {
        let mut h = blake3::Hasher::new();
        h.update(&self.0);
        for id in ids {
            h.update(&id.to_le_bytes());
        }
        BlockHash::from(h)
    }

    /// The chain hashes of every complete block of `ids`, starting after `root`.
    #[cfg(test)]
    pub fn chain(root: BlockHash, ids: &[u32], block: usize) -> Vec<BlockHash> {
        let mut parent = root;
        ids.chunks_exact(block)
            .map(|b| {
                parent = parent.child(b);
                parent
            })
            .collect()
    }
}

impl From<blake3::Hasher> for BlockHash {
    fn from(h: blake3::Hasher) -> Self {
        let mut out = [0u8; 16];
        out.copy_from_slice(&h.finalize().as_bytes()[..16]);
        BlockHash(out)
    }
}

/// Counters and gauges for `/metrics`, `/slots` and `/props`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub pages_total: usize,
    /// Pages held by running requests.
    pub pages_held: usize,
    /// Unreferenced pages kept for later hits.
    pub pages_cached: usize,
    /// Prompt tokens served from the cache, since start.
    pub hit_tokens: u64,
    /// Cached pages evicted to make room, since start.
    pub evicted_pages: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Page {
    refs: u32,
    hash: Option<BlockHash>,
    /// Release tick while cached (the key of `evictable`).
    released_at: u64,
}

/// The pool of K/V pages (see the module docs).
pub struct BlockPool {
    pages: Vec<Page>,
    free: Vec<PageId>,
    by_hash: HashMap<BlockHash, PageId>,
    /// Cached pages by release tick, oldest first.
    evictable: BTreeMap<u64, PageId>,
    tick: u64,
    block: usize,
    hit_tokens: u64,
    evicted_pages: u64,
}

impl BlockPool {
    /// A manager of `pages` pages of `block` positions each, all free.
    pub fn new(pages: usize, block: usize) -> Self {
        BlockPool {
            pages: vec![Page::default(); pages],
            // Lower ids first, so a lightly used pool touches little memory.
            free: (0..pages as PageId).rev().collect(),
            by_hash: HashMap::new(),
            evictable: BTreeMap::new(),
            tick: 0,
            block,
            hit_tokens: 0,
            evicted_pages: 0,
        }
    }

    pub fn block(&self) -> usize {
        self.block
    }

    pub fn stats(&self) -> CacheStats {
        let pages_total = self.pages.len();
        let pages_cached = self.evictable.len();
        CacheStats {
            pages_total,
            pages_held: pages_total - pages_cached - self.free.len(),
            pages_cached,
            hit_tokens: self.hit_tokens,
            evicted_pages: self.evicted_pages,
        }
    }

    /// Pages a request could get now: free ones plus evictable cached ones.
    pub fn available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Pages in the pool.
    pub fn total(&self) -> usize {
        self.pages.len()
    }

    /// The pages of the longest run of `hashes` (a prompt's complete blocks, in order) that are
    /// cached, each now held once more by the caller.
    pub fn lookup(&mut self, hashes: &[BlockHash]) -> Vec<PageId> {
        let mut hit = Vec::new();
        for hash in hashes {
            let Some(&page) = self.by_hash.get(hash) else {
                break;
            };
            self.hold(page);
            hit.push(page);
        }
        hit
    }

    /// Counts a hit of `tokens` prompt tokens (once the request using it is admitted).
    pub fn record_hit(&mut self, tokens: usize) {
        self.hit_tokens += tokens as u64;
    }

    /// Takes one more reference on a page.
    fn hold(&mut self, page: PageId) {
        let p = &mut self.pages[page as usize];
        if p.refs == 0 {
            self.evictable.remove(&p.released_at);
        }
        p.refs += 1;
    }

    /// `n` fresh pages, held once by the caller: free pages first, then the least recently
    /// released cached ones (evicted). `None`, and nothing taken, when fewer are available.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<PageId>> {
        if self.available() < n {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let page = match self.free.pop() {
                Some(page) => page,
                None => {
                    let (_, page) = self.evictable.pop_first().expect("counted above");
                    let hash = self.pages[page as usize]
                        .hash
                        .take()
                        .expect("cached pages hash");
                    self.by_hash.remove(&hash);
                    self.evicted_pages += 1;
                    page
                }
            };
            self.pages[page as usize].refs = 1;
            out.push(page);
        }
        Some(out)
    }

    /// Publishes a held page whose K/V are a committed block with chain hash `hash`, so later
    /// requests can share it. When another page already holds that block (two requests computed
    /// it at once), the existing entry stays and this page remains private to its holder.
    pub fn publish(&mut self, page: PageId, hash: BlockHash) {
        let p = &mut self.pages[page as usize];
        debug_assert!(p.refs > 0, "only a held page can be published");
        if p.hash.is_some() || self.by_hash.contains_key(&hash) {
            return;
        }
        p.hash = Some(hash);
        self.by_hash.insert(hash, page);
    }

    /// Drops one reference on each page. Pages nobody holds become cached (if published) or free.
    /// Pass a request's pages in block order: later blocks are released as older, so eviction
    /// takes a chain's tail before its head.
    pub fn release(&mut self, pages: &[PageId]) {
        for &page in pages.iter().rev() {
            let p = &mut self.pages[page as usize];
            debug_assert!(p.refs > 0, "page {page} released more often than held");
            p.refs = p.refs.saturating_sub(1);
            if p.refs > 0 {
                continue;
            }
            if p.hash.is_some() {
                self.tick += 1;
                p.released_at = self.tick;
                self.evictable.insert(self.tick, page);
            } else {
                self.free.push(page);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(ids: &[u32]) -> Vec<BlockHash> {
        BlockHash::chain(BlockHash::root("m", None), ids, 4)
    }

    #[test]
    fn a_published_prefix_is_shared_and_counted_once() {
        let mut cache = BlockPool::new(8, 4);
        let prompt: Vec<u32> = (0..12).collect();
        let hashes = chain(&prompt);
        let a = cache.allocate(3).unwrap();
        for (&p, &h) in a.iter().zip(&hashes) {
            cache.publish(p, h);
        }
        // A second request with the same first two blocks shares those pages.
        let mut other = prompt.clone();
        other[9] = 99;
        let hit = cache.lookup(&chain(&other));
        assert_eq!(hit, a[..2]);
        assert_eq!(cache.stats().pages_held, 3);
        cache.release(&a);
        assert_eq!(
            cache.stats().pages_held,
            2,
            "the shared pages are still held"
        );
        cache.release(&hit);
        let s = cache.stats();
        assert_eq!((s.pages_held, s.pages_cached, s.pages_total), (0, 3, 8));
    }

    #[test]
    fn salts_and_models_keep_chains_apart() {
        let ids: Vec<u32> = (0..4).collect();
        let base = BlockHash::chain(BlockHash::root("m", None), &ids, 4);
        assert_ne!(
            base,
            BlockHash::chain(BlockHash::root("m", Some("t")), &ids, 4)
        );
        assert_ne!(base, BlockHash::chain(BlockHash::root("n", None), &ids, 4));
        assert_ne!(
            BlockHash::chain(BlockHash::root("m", Some("")), &ids, 4),
            base,
            "an empty salt is still a salt"
        );
    }

    #[test]
    fn a_hit_needs_the_whole_prefix() {
        let mut cache = BlockPool::new(4, 4);
        let ids: Vec<u32> = (0..8).collect();
        let hashes = chain(&ids);
        let pages = cache.allocate(2).unwrap();
        cache.publish(pages[1], hashes[1]);
        // Block 1 is cached but block 0 is not: its chain cannot be entered.
        assert!(cache.lookup(&hashes).is_empty());
    }

    #[test]
    fn eviction_takes_free_pages_first_then_the_oldest_tail() {
        let mut cache = BlockPool::new(4, 4);
        let ids: Vec<u32> = (0..12).collect();
        let hashes = chain(&ids);
        let pages = cache.allocate(3).unwrap();
        for (&p, &h) in pages.iter().zip(&hashes) {
            cache.publish(p, h);
        }
        cache.release(&pages);
        // One free page, then the chain's tail (block 2), then block 1.
        let got = cache.allocate(2).unwrap();
        assert_eq!(cache.stats().evicted_pages, 1);
        assert!(got.contains(&pages[2]));
        assert_eq!(cache.lookup(&hashes), pages[..2]);
        assert!(cache.allocate(2).is_none(), "only one page is left");
        assert_eq!(cache.stats().pages_held, 4);
    }

    #[test]
    fn a_duplicate_block_stays_private() {
        let mut cache = BlockPool::new(4, 4);
        let h = chain(&[1, 2, 3, 4])[0];
        let a = cache.allocate(1).unwrap();
        let b = cache.allocate(1).unwrap();
        cache.publish(a[0], h);
        cache.publish(b[0], h);
        cache.release(&b);
        assert_eq!(
            cache.stats().pages_cached,
            0,
            "b went back to the free list"
        );
        assert_eq!(cache.lookup(&[h]), a);
    }
}
