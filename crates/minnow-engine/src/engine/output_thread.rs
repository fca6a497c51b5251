//! The output thread: it turns what the core reports about each admitted request
//! ([`SequenceUpdate`]s, in order, over one channel) into that request's events. Detokenizing,
//! stop strings and tool-call parsing (`output/`) run here, beside the model thread's next
//! forward; the model thread only hands over ids and statistics.
//!
//! A stop string is found here after the core has gone on decoding. The client gets the block
//! that completed it and `Done` at once, with the text, ids and statistics as of that block
//! (exactly what it would get had decoding stopped there), and the request's [`StopSignal`] tells
//! the core to end the request at its next schedule, which releases its pages. Blocks the core
//! decoded in between are dropped. A traced request waits for the core's end, which carries its
//! trace (cut back to the stop block), before its `Done`.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::core::SequenceUpdate;
use super::handle::{StopSignal, TraceLog};
use crate::api::{BlockStats, Event, FinishReason, GenerationStats, ToolCallDelta};
use crate::decode::request::{FinishedBlock, TraceStep};
use crate::error::{EngineError, EngineResult};
use crate::output::text_stream::OutputStream;
use crate::output::tool_calls::StreamParser;
use crate::text::tokenizer::Tokenizer;
use crate::text::tool_format::ToolCallFormat;

/// What a request's text stream needs, from its submission.
pub(crate) struct OutputRequest {
    pub stop: Vec<String>,
    pub tool_names: Vec<String>,
    pub forced_prefix: Option<String>,
    pub tool_format: ToolCallFormat,
    pub events: UnboundedSender<Event>,
    pub trace: Option<TraceLog>,
    /// Shared with the core: raised here when a stop string ends the answer.
    pub stop_signal: StopSignal,
}

enum OutputMessage {
    /// Request `id` was admitted at `admitted`; its updates follow.
    Open {
        id: u64,
        request: Box<OutputRequest>,
        admitted: Instant,
    },
    Updates(Vec<SequenceUpdate>),
}

/// The model thread's end of the output thread. Dropping it waits until every update sent so
/// far has become events.
pub(crate) struct OutputThread {
    sender: Option<Sender<OutputMessage>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OutputThread {
    pub fn spawn(tokenizer: Arc<Tokenizer>) -> EngineResult<OutputThread> {
        let (sender, messages) = channel();
        let thread = std::thread::Builder::new()
            .name("minnow-output".into())
            .spawn(move || run(&tokenizer, messages))
            .map_err(|e| EngineError::Load(format!("cannot start the output thread: {e}")))?;
        Ok(OutputThread {
            sender: Some(sender),
            thread: Some(thread),
        })
    }

    /// Request `id` was admitted; call before sending any of its updates.
    pub fn open(&self, id: u64, request: OutputRequest) {
        self.send(OutputMessage::Open {
            id,
            request: Box::new(request),
            admitted: Instant::now(),
        });
    }

    pub fn updates(&self, updates: Vec<SequenceUpdate>) {
        if !updates.is_empty() {
            self.send(OutputMessage::Updates(updates));
        }
    }

    fn send(&self, message: OutputMessage) {
        // The thread ends only when this sender is dropped (a panic in one request's text is
        // caught there), so a send cannot fail while `self` lives.
        if let Some(sender) = &self.sender {
            let _ = sender.send(message);
        }
    }
}

impl Drop for OutputThread {
    fn drop(&mut self) {
        drop(self.sender.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(tokenizer: &Tokenizer, messages: Receiver<OutputMessage>) {
    let mut clients: HashMap<u64, Client> = HashMap::new();
    while let Ok(message) = messages.recv() {
        match message {
            OutputMessage::Open {
                id,
                request,
                admitted,
            } => {
                clients.insert(id, Client::new(id, *request, admitted));
            }
            OutputMessage::Updates(updates) => {
                for update in updates {
                    let id = update_id(&update);
                    // A bug in one request's text must fail that request, not every later one.
                    let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        on_update(tokenizer, &mut clients, update)
                    }));
                    if let Err(panic) = handled {
                        let message = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into());
                        tracing::error!("internal error in the output of request {id}: {message}");
                        if let Some(mut client) = clients.remove(&id) {
                            client.stop_signal.stop();
                            client
                                .fail(EngineError::Internal(format!("internal error: {message}")));
                        }
                    }
                }
            }
        }
    }
}

fn update_id(update: &SequenceUpdate) -> u64 {
    match update {
        SequenceUpdate::Admitted { id, .. }
        | SequenceUpdate::Prefill { id, .. }
        | SequenceUpdate::Block { id, .. }
        | SequenceUpdate::Ended { id, .. }
        | SequenceUpdate::Failed { id, .. } => *id,
    }
}

fn on_update(tokenizer: &Tokenizer, clients: &mut HashMap<u64, Client>, update: SequenceUpdate) {
    match update {
        SequenceUpdate::Admitted { id, cached, total } => {
            if let Some(client) = streaming(clients, id) {
                // The cache hit is the first progress a client sees (a fully cached prompt has
                // no prefill forward to report after).
                client.send(Event::PrefillProgress {
                    total,
                    cached,
                    processed: cached,
                    elapsed_ms: 0,
                });
            }
        }
        SequenceUpdate::Prefill {
            id,
            processed,
            total,
            cached,
        } => {
            if let Some(client) = streaming(clients, id) {
                let elapsed_ms = client.admitted.elapsed().as_millis() as u64;
                client.send(Event::PrefillProgress {
                    total,
                    cached,
                    processed,
                    elapsed_ms,
                });
            }
        }
        SequenceUpdate::Block {
            id,
            block,
            totals,
            trace_len,
        } => {
            let Some(client) = streaming(clients, id) else {
                return;
            };
            match client.on_block(tokenizer, block) {
                Ok(None) => {}
                Ok(Some((pending, last))) => {
                    client.stop_signal.stop();
                    let answer = Box::new(StoppedAnswer {
                        pending,
                        last,
                        totals,
                        trace_len,
                    });
                    if client.trace.is_some() {
                        client.state = State::Stopped(answer);
                    } else {
                        client.finish_stopped(tokenizer, *answer, None);
                        client.state = State::Answered;
                    }
                }
                Err(error) => {
                    client.stop_signal.stop();
                    client.fail(error);
                    client.state = State::Answered;
                }
            }
        }
        SequenceUpdate::Ended {
            id,
            reason,
            last_block,
            decoder,
        } => {
            let Some(mut client) = clients.remove(&id) else {
                return;
            };
            match std::mem::replace(&mut client.state, State::Answered) {
                State::Streaming => {
                    let (pending, last) = match last_block {
                        None => (Vec::new(), None),
                        Some(block) => match client.push(tokenizer, block) {
                            Ok((pending, last, _)) => (vec![pending], Some(last)),
                            Err(error) => return client.fail(error),
                        },
                    };
                    client.finish(
                        tokenizer,
                        reason,
                        pending,
                        last,
                        decoder.output(),
                        decoder.stats(),
                        decoder.trace(),
                    );
                }
                State::Stopped(answer) => {
                    client.finish_stopped(tokenizer, *answer, decoder.trace());
                }
                State::Answered => {}
            }
        }
        SequenceUpdate::Failed { id, error } => {
            let Some(mut client) = clients.remove(&id) else {
                return;
            };
            match std::mem::replace(&mut client.state, State::Answered) {
                State::Streaming => client.fail(error),
                // The answer was complete before the failure (an engine shutdown, say).
                State::Stopped(answer) => client.finish_stopped(tokenizer, *answer, None),
                State::Answered => {}
            }
        }
    }
}

/// Request `id`'s client while its answer is still being streamed.
fn streaming(clients: &mut HashMap<u64, Client>, id: u64) -> Option<&mut Client> {
    clients
        .get_mut(&id)
        .filter(|client| matches!(client.state, State::Streaming))
}

/// Text and tool-call deltas not sent yet, and the last block's ids and statistics.
type Pending = (String, Vec<ToolCallDelta>);
type LastBlock = (Vec<u32>, BlockStats);

/// An answer that a stop string ended, as of the block that completed it.
struct StoppedAnswer {
    pending: Pending,
    last: LastBlock,
    totals: GenerationStats,
    trace_len: usize,
}

enum State {
    Streaming,
    /// A stop string ended the answer; a traced request waits here for the core's end (its
    /// trace).
    Stopped(Box<StoppedAnswer>),
    /// `Done` or `Error` went out; the core's end is awaited only to forget the request.
    Answered,
}

/// The text side of one admitted request.
struct Client {
    output: OutputStream,
    /// Output ids of the blocks so far.
    ids: Vec<u32>,
    events: UnboundedSender<Event>,
    trace: Option<TraceLog>,
    stop_signal: StopSignal,
    admitted: Instant,
    state: State,
}

impl Client {
    fn new(id: u64, request: OutputRequest, admitted: Instant) -> Client {
        let parser = StreamParser::new(
            request.tool_format,
            request.tool_names,
            request.forced_prefix,
            format!("call_{id}"),
        );
        Client {
            output: OutputStream::new(request.stop, parser),
            ids: Vec::new(),
            events: request.events,
            trace: request.trace,
            stop_signal: request.stop_signal,
            admitted,
            state: State::Streaming,
        }
    }

    fn send(&mut self, event: Event) {
        // A send fails only when the handle is gone; its Drop also set the cancel flag, which
        // the core sees at its next step.
        let _ = self.events.send(event);
    }

    /// A block that did not end the request: its text goes out, unless it completed a stop
    /// string, which ends the request (then its text and ids come back for the last `Block`).
    fn on_block(
        &mut self,
        tokenizer: &Tokenizer,
        block: FinishedBlock,
    ) -> EngineResult<Option<(Pending, LastBlock)>> {
        let (pending, last, stopped) = self.push(tokenizer, block)?;
        if stopped {
            return Ok(Some((pending, last)));
        }
        let (text_delta, tool_call_deltas) = pending;
        let (tokens, stats) = last;
        self.send(Event::Block {
            text_delta,
            tokens,
            tool_call_deltas,
            stats,
        });
        Ok(None)
    }

    /// Detokenizes a block through the stop strings and tool-call parser; its ids are cut after
    /// a stop string's last token.
    fn push(
        &mut self,
        tokenizer: &Tokenizer,
        block: FinishedBlock,
    ) -> EngineResult<(Pending, LastBlock, bool)> {
        let mut tokens = block.tokens;
        self.ids.extend_from_slice(&tokens);
        let text = self.output.push_block(tokenizer, &self.ids)?;
        let stopped = match &text.stop {
            Some(hit) => {
                // Keep only this block's ids up to the token that completed the stop.
                let before = self.ids.len() - tokens.len();
                tokens.truncate(hit.keep_tokens.saturating_sub(before));
                true
            }
            None => false,
        };
        Ok((
            (text.text_delta, text.tool_call_deltas),
            (tokens, block.stats),
            stopped,
        ))
    }

    /// Ends an answer that a stop string ended: the ids and statistics as of its stop block,
    /// and the trace up to that block.
    fn finish_stopped(
        &mut self,
        tokenizer: &Tokenizer,
        answer: StoppedAnswer,
        trace: Option<&[TraceStep]>,
    ) {
        let ids = std::mem::take(&mut self.ids);
        let trace = trace.map(|steps| &steps[..answer.trace_len.min(steps.len())]);
        self.finish(
            tokenizer,
            FinishReason::Stop,
            vec![answer.pending],
            Some(answer.last),
            &ids,
            answer.totals,
            trace,
        );
    }

    /// Ends the request: final text and tool calls, the last `Block` (when a block ended it),
    /// then `Done`. `ids` are the output ids, `stats` the decoder's totals.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        tokenizer: &Tokenizer,
        reason: FinishReason,
        mut pending: Vec<Pending>,
        last_block: Option<LastBlock>,
        ids: &[u32],
        mut stats: GenerationStats,
        trace: Option<&[TraceStep]>,
    ) {
        let final_text = match self.output.finish(tokenizer, ids, reason) {
            Ok(f) => f,
            Err(error) => return self.fail(error),
        };
        pending.push((final_text.text_delta, final_text.tool_call_deltas));
        if let Some((tokens, block_stats)) = last_block {
            let text_delta = pending.iter().map(|(t, _)| t.as_str()).collect();
            let tool_call_deltas = pending.into_iter().flat_map(|(_, d)| d).collect();
            self.send(Event::Block {
                text_delta,
                tokens,
                tool_call_deltas,
                stats: block_stats,
            });
        }
        let output_ids = ids[..final_text.kept_tokens.min(ids.len())].to_vec();
        stats.completion_tokens = output_ids.len();
        if let (Some(log), Some(steps)) = (&self.trace, trace) {
            log.store(steps);
        }
        self.send(Event::Done {
            finish_reason: final_text.finish_reason,
            output_ids,
            text: final_text.content,
            tool_calls: final_text.tool_calls,
            stats,
        });
    }

    fn fail(&mut self, error: EngineError) {
        tracing::warn!("generation failed: {error}");
        self.send(Event::Error(error));
    }
}
