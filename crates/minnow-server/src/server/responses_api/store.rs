//! Stored responses (`store: true`): what `GET /v1/responses/{id}` returns and what
//! `previous_response_id` continues, in memory, within two bounds: at most `--responses-max`
//! responses and at most `--responses-max-mib` of memory; the least recently used are evicted
//! first.
//!
//! What is kept is what continuing and retrieving need, in compact form: the response object as
//! its serialized JSON text (a parsed `Value` took tens of times its text), and the conversation
//! as a chain of turns, each holding only its own input and output items (plain strings) and
//! sharing its ancestors through `Arc`: a long conversation costs its items once, not once per
//! stored response. An evicted response's turn lives on as long as a stored descendant needs it,
//! so evicting an early response never breaks a later one's conversation; every live turn is
//! counted in the store's bytes until it is dropped, so such a turn keeps its memory accounted
//! and eviction goes on until the total is within the bound. Every turn fitted the model's
//! context, so a chain is bounded by what a context holds.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::items::Item;

/// Bytes of live turns (shared by the store and every turn it made).
type Meter = Arc<AtomicUsize>;

/// One turn: the items it added to its conversation (input, then output).
#[derive(Debug)]
pub struct Turn {
    parent: Option<Arc<Turn>>,
    items: Vec<Item>,
    /// What this turn adds to `meter` while it lives.
    bytes: usize,
    meter: Meter,
}

impl Turn {
    fn new(parent: Option<Arc<Turn>>, items: Vec<Item>, meter: &Meter) -> Arc<Turn> {
        let bytes = std::mem::size_of::<Turn>() + items.iter().map(item_bytes).sum::<usize>();
        meter.fetch_add(bytes, Ordering::Relaxed);
        Arc::new(Turn {
            parent,
            items,
            bytes,
            meter: meter.clone(),
        })
    }

    /// The whole conversation up to and including this turn, oldest item first.
    pub fn conversation(&self) -> Vec<Item> {
        let mut chain: Vec<&Turn> = vec![self];
        while let Some(parent) = chain.last().and_then(|turn| turn.parent.as_deref()) {
            chain.push(parent);
        }
        chain
            .iter()
            .rev()
            .flat_map(|turn| turn.items.iter().cloned())
            .collect()
    }
}

/// Memory of one item: the item and its strings.
fn item_bytes(item: &Item) -> usize {
    let strings = match item {
        Item::Message { id, text, .. } => id.as_ref().map_or(0, String::len) + text.len(),
        Item::FunctionCall {
            id,
            call_id,
            name,
            arguments,
        } => id.as_ref().map_or(0, String::len) + call_id.len() + name.len() + arguments.len(),
        Item::FunctionCallOutput {
            id,
            call_id,
            output,
        } => id.as_ref().map_or(0, String::len) + call_id.len() + output.len(),
    };
    std::mem::size_of::<Item>() + strings
}

impl Drop for Turn {
    /// Unlinks the chain iteratively: the default recursive drop of a conversation thousands of
    /// turns long could overflow a worker thread's stack.
    fn drop(&mut self) {
        self.meter.fetch_sub(self.bytes, Ordering::Relaxed);
        let mut next = self.parent.take();
        while let Some(turn) = next {
            next = match Arc::try_unwrap(turn) {
                Ok(mut owned) => owned.parent.take(),
                Err(_) => None,
            };
        }
    }
}

/// A stored response: its JSON object (serialized) and the conversation it ends.
#[derive(Clone, Debug)]
pub struct Stored {
    pub object: Arc<str>,
    pub turn: Arc<Turn>,
}

struct Entry {
    stored: Stored,
    /// Recency stamp: the key of this entry in `Inner::by_use`.
    used: u64,
}

impl Entry {
    /// What the entry holds besides its turn (counted by the meter): the object text and the
    /// entry's place in both maps.
    fn own_bytes(&self, id: &str) -> usize {
        self.stored.object.len() + 2 * id.len() + ENTRY_OVERHEAD
    }
}

/// Map slots, `Arc` headers and the recency index of one entry.
const ENTRY_OVERHEAD: usize = 256;

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Entries by last use, oldest first.
    by_use: BTreeMap<u64, String>,
    clock: u64,
    /// Sum of the entries' `own_bytes`.
    own_bytes: usize,
}

impl Inner {
    fn evict_oldest(&mut self) -> Option<Entry> {
        let (_, oldest) = self.by_use.pop_first()?;
        let entry = self.entries.remove(&oldest)?;
        self.own_bytes -= entry.own_bytes(&oldest);
        Some(entry)
    }

    fn touch(&mut self, id: &str) -> Option<Stored> {
        self.clock += 1;
        let clock = self.clock;
        let entry = self.entries.get_mut(id)?;
        self.by_use.remove(&entry.used);
        entry.used = clock;
        self.by_use.insert(clock, id.to_string());
        Some(entry.stored.clone())
    }
}

/// The LRU store (a `HashMap` plus a recency index; small enough not to need a crate).
pub struct ResponseStore {
    capacity: usize,
    max_bytes: usize,
    inner: Mutex<Inner>,
    meter: Meter,
}

impl ResponseStore {
    /// At most `capacity` responses and `max_bytes` of memory; `capacity` 0 keeps nothing
    /// (`store: true` responses are then not retrievable).
    pub fn new(capacity: usize, max_bytes: usize) -> Self {
        Self {
            capacity,
            max_bytes,
            inner: Mutex::new(Inner::default()),
            meter: Meter::default(),
        }
    }

    /// A new turn of a conversation, counted in this store's memory while it lives.
    pub fn turn(&self, parent: Option<Arc<Turn>>, items: Vec<Item>) -> Arc<Turn> {
        Turn::new(parent, items, &self.meter)
    }

    /// Memory held by the stored responses and the turns still alive, in bytes.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.lock().own_bytes + self.meter.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps inconsistent in a way that
        // matters more than losing the store, so a poisoned lock is used as is.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn insert(&self, id: String, stored: Stored) {
        if self.capacity == 0 {
            return;
        }
        // Evicted entries are dropped after the lock is released (dropping a chain takes time),
        // then the memory bound is checked again: an evicted entry's turns are only freed then.
        let mut evicted = Vec::new();
        {
            let mut inner = self.lock();
            inner.clock += 1;
            let used = inner.clock;
            let entry = Entry { stored, used };
            inner.own_bytes += entry.own_bytes(&id);
            if let Some(old) = inner.entries.insert(id.clone(), entry) {
                inner.by_use.remove(&old.used);
                inner.own_bytes -= old.own_bytes(&id);
                evicted.push(old);
            }
            inner.by_use.insert(used, id);
            while inner.entries.len() > self.capacity {
                if let Some(entry) = inner.evict_oldest() {
                    evicted.push(entry);
                }
            }
        }
        drop(evicted);
        self.evict_to_memory_bound();
    }

    /// Evicts the least recently used responses while the memory bound is exceeded (the newest
    /// one stays, alone, even if it is larger than the bound by itself).
    fn evict_to_memory_bound(&self) {
        loop {
            let evicted = {
                let mut inner = self.lock();
                if inner.own_bytes + self.meter.load(Ordering::Relaxed) <= self.max_bytes
                    || inner.entries.len() <= 1
                {
                    return;
                }
                inner.evict_oldest()
            };
            // Dropped outside the lock; its turns leave the meter as they go.
            drop(evicted);
        }
    }

    /// The stored response, marked as just used.
    pub fn get(&self, id: &str) -> Option<Stored> {
        self.lock().touch(id)
    }

    pub fn remove(&self, id: &str) -> bool {
        let removed = {
            let mut inner = self.lock();
            let removed = inner.entries.remove(id);
            if let Some(entry) = &removed {
                inner.by_use.remove(&entry.used);
                inner.own_bytes -= entry.own_bytes(id);
            }
            removed
        };
        removed.is_some()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::server::responses_api::items::Role;

    const UNBOUNDED: usize = usize::MAX;

    fn user(text: &str) -> Item {
        Item::Message {
            id: None,
            role: Role::User,
            text: text.into(),
        }
    }

    fn stored(turn: Arc<Turn>) -> Stored {
        Stored {
            object: Arc::from("{}"),
            turn,
        }
    }

    #[test]
    fn least_recently_used_is_evicted() {
        let store = ResponseStore::new(2, UNBOUNDED);
        store.insert("a".into(), stored(store.turn(None, vec![user("a")])));
        store.insert("b".into(), stored(store.turn(None, vec![user("b")])));
        assert!(store.get("a").is_some(), "touch a: b is now the oldest");
        store.insert("c".into(), stored(store.turn(None, vec![user("c")])));
        assert!(store.get("b").is_none());
        assert!(store.get("a").is_some() && store.get("c").is_some());
        assert_eq!(store.len(), 2);
        assert!(store.remove("a"));
        assert!(!store.remove("a"));
        assert_eq!(store.len(), 1);
        let none = ResponseStore::new(0, UNBOUNDED);
        none.insert("x".into(), stored(none.turn(None, vec![])));
        assert!(none.get("x").is_none());
    }

    #[test]
    fn conversations_outlive_evicted_ancestors() {
        let store = ResponseStore::new(1, UNBOUNDED);
        let first = store.turn(None, vec![user("1")]);
        store.insert("first".into(), stored(first.clone()));
        let second = store.turn(Some(first), vec![user("2")]);
        store.insert("second".into(), stored(second));
        assert!(store.get("first").is_none());
        let conversation = store.get("second").unwrap().turn.conversation();
        assert_eq!(conversation, vec![user("1"), user("2")]);
    }

    #[test]
    fn memory_is_counted_and_bounded() {
        let text = "x".repeat(10_000);
        let one = {
            let probe = ResponseStore::new(10, UNBOUNDED);
            probe.insert("r".into(), stored(probe.turn(None, vec![user(&text)])));
            probe.bytes()
        };
        assert!((10_000..11_000).contains(&one), "{one}");
        // Room for three such responses: the fourth evicts the oldest.
        let store = ResponseStore::new(100, 3 * one + one / 2);
        for id in ["a", "b", "c", "d"] {
            store.insert(id.into(), stored(store.turn(None, vec![user(&text)])));
        }
        assert_eq!(store.len(), 3);
        assert!(store.get("a").is_none());
        assert!(store.bytes() <= 3 * one + one / 2, "{}", store.bytes());
        // Removing and evicting give the memory back, turns included.
        for id in ["b", "c", "d"] {
            assert!(store.remove(id));
        }
        assert_eq!(store.bytes(), 0);
        // A chain whose early responses were evicted stays counted while a descendant holds it.
        let store = ResponseStore::new(100, 2 * one + one / 2);
        let mut parent = None;
        for id in ["t1", "t2", "t3"] {
            let turn = store.turn(parent.take(), vec![user(&text)]);
            parent = Some(turn.clone());
            store.insert(id.into(), stored(turn));
        }
        // t3's chain holds three turns (more than the bound): only t3 is left.
        assert_eq!(store.len(), 1);
        assert!(store.get("t3").is_some());
        drop(parent);
        assert!(store.remove("t3"));
        assert_eq!(store.bytes(), 0);
    }

    #[test]
    fn long_chains_drop_without_recursion() {
        let store = ResponseStore::new(1, UNBOUNDED);
        let mut turn = store.turn(None, vec![user("0")]);
        for i in 1..200_000 {
            turn = store.turn(Some(turn), vec![user(&i.to_string())]);
        }
        drop(turn);
        assert_eq!(store.bytes(), 0);
    }
}
