//! A Responses request ready to submit: the chat job, the response's header, and what the
//! store keeps of the turn once it is answered.

use std::sync::Arc;

use serde_json::Value;

use super::super::generation::Job;
use super::super::state::AppState;
use super::items::Item;
use super::object::Header;
use super::store::{Stored, Turn};

/// A request ready to submit, with what its response needs to report and store.
pub struct Prepared {
    pub job: Job,
    pub header: Header,
    /// This turn's new input items (stored with the output).
    pub input: Vec<Item>,
    /// The conversation this turn continues (`previous_response_id`).
    pub parent: Option<Arc<Turn>>,
    pub store: bool,
    pub return_progress: bool,
}

impl Prepared {
    /// Keeps a finished response (`store: true`) for `GET` and `previous_response_id`.
    pub fn remember(&self, state: &AppState, object: &Value, output: Vec<Item>) {
        if !self.store {
            return;
        }
        let mut items = self.input.clone();
        items.extend(output);
        state.responses.insert(
            self.header.id.clone(),
            Stored {
                object: Arc::from(object.to_string()),
                turn: state.responses.turn(self.parent.clone(), items),
            },
        );
    }
}
