//! Stored responses (`store: true`): what `GET /v1/responses/{id}` returns and what
//! `previous_response_id` continues, in memory, at most `--responses-max` of them, the least
//! recently used evicted first.
//!
//! A conversation is a chain of turns, each holding only its own input and output items and
//! sharing its ancestors through `Arc`: a long conversation costs its items once, not once per
//! stored response. An evicted response's turn lives on as long as a stored descendant needs it,
//! so evicting an early response never breaks a later one's conversation. Every turn fitted the
//! model's context, so a chain is bounded by what a context holds.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::items::Item;

/// One turn: the items it added to its conversation (input, then output).
#[derive(Debug)]
pub struct Turn {
    parent: Option<Arc<Turn>>,
    items: Vec<Item>,
}

impl Turn {
    pub fn new(parent: Option<Arc<Turn>>, items: Vec<Item>) -> Arc<Turn> {
        Arc::new(Turn { parent, items })
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

impl Drop for Turn {
    /// Unlinks the chain iteratively: the default recursive drop of a conversation thousands of
    /// turns long could overflow a worker thread's stack.
    fn drop(&mut self) {
        let mut next = self.parent.take();
        while let Some(turn) = next {
            next = match Arc::try_unwrap(turn) {
                Ok(mut owned) => owned.parent.take(),
                Err(_) => None,
            };
        }
    }
}

/// A stored response: its JSON object and the conversation it ends.
#[derive(Clone, Debug)]
pub struct Stored {
    pub object: Value,
    pub turn: Arc<Turn>,
}

struct Entry {
    stored: Stored,
    /// Recency stamp: the key of this entry in `Inner::by_use`.
    used: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Entries by last use, oldest first.
    by_use: BTreeMap<u64, String>,
    clock: u64,
}

impl Inner {
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
    inner: Mutex<Inner>,
}

impl ResponseStore {
    /// `capacity` 0 keeps nothing (`store: true` responses are then not retrievable).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
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
        // Evicted entries are dropped after the lock is released (dropping a chain takes time).
        let mut evicted = Vec::new();
        {
            let mut inner = self.lock();
            inner.clock += 1;
            let used = inner.clock;
            if let Some(old) = inner.entries.insert(id.clone(), Entry { stored, used }) {
                inner.by_use.remove(&old.used);
                evicted.push(old);
            }
            inner.by_use.insert(used, id);
            while inner.entries.len() > self.capacity {
                let Some((_, oldest)) = inner.by_use.pop_first() else {
                    break;
                };
                if let Some(entry) = inner.entries.remove(&oldest) {
                    evicted.push(entry);
                }
            }
        }
        drop(evicted);
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
    use serde_json::json;

    use crate::server::responses_api::items::Role;

    fn user(text: &str) -> Item {
        Item::Message {
            id: None,
            role: Role::User,
            text: text.into(),
        }
    }

    fn stored(turn: Arc<Turn>) -> Stored {
        Stored {
            object: json!({}),
            turn,
        }
    }

    #[test]
    fn least_recently_used_is_evicted() {
        let store = ResponseStore::new(2);
        store.insert("a".into(), stored(Turn::new(None, vec![user("a")])));
        store.insert("b".into(), stored(Turn::new(None, vec![user("b")])));
        assert!(store.get("a").is_some(), "touch a: b is now the oldest");
        store.insert("c".into(), stored(Turn::new(None, vec![user("c")])));
        assert!(store.get("b").is_none());
        assert!(store.get("a").is_some() && store.get("c").is_some());
        assert_eq!(store.len(), 2);
        assert!(store.remove("a"));
        assert!(!store.remove("a"));
        assert_eq!(store.len(), 1);
        let none = ResponseStore::new(0);
        none.insert("x".into(), stored(Turn::new(None, vec![])));
        assert!(none.get("x").is_none());
    }

    #[test]
    fn conversations_outlive_evicted_ancestors() {
        let store = ResponseStore::new(1);
        let first = Turn::new(None, vec![user("1")]);
        store.insert("first".into(), stored(first.clone()));
        let second = Turn::new(Some(first), vec![user("2")]);
        store.insert("second".into(), stored(second));
        assert!(store.get("first").is_none());
        let conversation = store.get("second").unwrap().turn.conversation();
        assert_eq!(conversation, vec![user("1"), user("2")]);
    }

    #[test]
    fn long_chains_drop_without_recursion() {
        let mut turn = Turn::new(None, vec![user("0")]);
        for i in 1..200_000 {
            turn = Turn::new(Some(turn), vec![user(&i.to_string())]);
        }
        drop(turn);
    }
}
