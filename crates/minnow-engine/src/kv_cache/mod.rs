//! The K/V cache: the pool of pages every request's K/V live in, shared across requests through
//! the prefix cache ([`block_pool`]), and each request's share of it ([`request_pages`]: its
//! block table and the chain hashes of its committed blocks, computed once).

pub mod block_pool;
pub(crate) mod request_pages;

pub use block_pool::{BlockHash, BlockPool, CacheStats};
pub(crate) use request_pages::RequestPages;
