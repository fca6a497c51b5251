//! The public request/response types of the engine. This file is the contract between the
//! engine, the CLI and the server; the engine implementation lives in other modules.

use serde::{Deserialize, Serialize};

/// Which block-diffusion algorithm decodes a request (decoding doc §5–7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// LLaDA2.0 threshold decoding (mask-to-token only).
    LowConfidence,
    /// LLaDA2.1 mask-to-token plus token-to-token editing.
    Joint,
    /// LLaDA2.2 joint editing plus DELETE/SPLIT edits.
    Indel,
}

/// Per-request decoding parameters. `None` means "the checkpoint family's default".
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DecodeParams {
    pub algorithm: Option<Algorithm>,
    pub threshold: Option<f32>,
    pub editing_threshold: Option<f32>,
    pub max_post_steps: Option<usize>,
    pub steps: Option<usize>,
    pub num_to_transfer: Option<usize>,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
}

/// One generation request. The prompt is already tokenized (see `Engine::render_chat` and
/// `Engine::tokenize`); tool definitions only matter for parsing the output.
#[derive(Clone, Debug, Default)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    /// New tokens at most. `None`: the rest of the context.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub params: DecodeParams,
    /// Text that was appended to the prompt to steer a tool call (chat-format doc §3.3). It is
    /// prepended to the generated text before tool-call parsing.
    pub forced_prefix: Option<String>,
    /// Declared tool names; when non-empty, generated tool-call markup is parsed.
    pub tool_names: Vec<String>,
    /// Whether the prompt may take blocks from the prefix cache and leave its own there
    /// (llama-server's `cache_prompt`). `None` = yes.
    pub cache_prompt: Option<bool>,
    /// Tenant key of the prefix cache (vLLM's `cache_salt`): blocks are shared only between
    /// requests with the same salt (no salt is a salt of its own).
    pub cache_salt: Option<String>,
    /// A grammar every answer obeys (structured outputs, docs/decoding.md §13).
    pub constraint: Option<OutputConstraint>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    Cancelled,
}

/// A streamed tool-call fragment, OpenAI style: the first fragment of a call carries `id` and
/// `name`; later ones only `arguments` text to append.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    pub index: usize,
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: String,
}

/// A complete parsed tool call (arguments as a JSON string).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// Refinement statistics of one finished block.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BlockStats {
    pub block_index: usize,
    /// Denoising forwards spent on the block.
    pub steps: usize,
    /// Forwards including a commit refresh, if one ran.
    pub forwards: usize,
    pub tokens: usize,
    pub seconds: f64,
}

/// Totals of one request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub blocks: usize,
    pub denoise_forwards: usize,
    /// Forwards that only refreshed a final block's K/V before the next block.
    pub commit_forwards: usize,
    /// Final blocks whose K/V refresh rode on the next block's first denoising forward (no
    /// forward of its own).
    #[serde(default)]
    pub merged_commits: usize,
    pub steps_per_block: Vec<usize>,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub tokens_per_second: f64,
    /// Grammar masks a constrained request computed (docs/decoding.md §13), and how many of
    /// them were computed beside the forward.
    #[serde(default)]
    pub grammar_masks: usize,
    #[serde(default)]
    pub grammar_masks_prepared: usize,
    /// Full logits rows a constrained request read because the best tokens a forward returned
    /// held none the grammar allowed.
    #[serde(default)]
    pub grammar_rows_read: usize,
}

/// What a running request reports, in order: zero or more `PrefillProgress`, then one `Block` per
/// finished block, then exactly one `Done` (or one `Error`).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    PrefillProgress {
        total: usize,
        cached: usize,
        processed: usize,
        elapsed_ms: u64,
    },
    Block {
        /// New visible text (content only, tool markup and held-back text excluded).
        text_delta: String,
        /// Token ids committed by this block that belong to the output.
        tokens: Vec<u32>,
        tool_call_deltas: Vec<ToolCallDelta>,
        stats: BlockStats,
    },
    Done {
        finish_reason: FinishReason,
        output_ids: Vec<u32>,
        /// Visible content (tool markup removed).
        text: String,
        tool_calls: Vec<ToolCall>,
        stats: GenerationStats,
    },
    Error(crate::error::EngineError),
}

/// One chat message after OpenAI normalization (chat-format doc §1.3): `developer` becomes
/// `system`, content parts are joined into one string, `null` content becomes "".
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// Assistant turns: earlier tool calls, OpenAI form (arguments as a JSON string).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Tool turns: the call this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// OpenAI `tool_choice`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub enum ToolChoice {
    #[default]
    Auto,
    None,
    Required,
    Function(String),
}

/// A chat conversation to render with the checkpoint's own template.
#[derive(Clone, Debug)]
pub struct ChatPrompt {
    pub messages: Vec<ChatMessage>,
    /// OpenAI tool objects `{"type":"function","function":{name,description,parameters}}`.
    pub tools: Vec<serde_json::Value>,
    pub tool_choice: ToolChoice,
    /// End the rendering with the opening of the assistant's turn, so the model answers (the
    /// default); `false` renders the conversation as it is.
    pub add_generation_prompt: bool,
    /// Extra template variables (`chat_template_kwargs`).
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
}

impl Default for ChatPrompt {
    fn default() -> Self {
        ChatPrompt {
            messages: Vec::new(),
            tools: Vec::new(),
            tool_choice: ToolChoice::default(),
            add_generation_prompt: true,
            template_kwargs: serde_json::Map::new(),
        }
    }
}

/// The rendered prompt text, plus the steering prefix appended for `required`/named tool choice
/// (already included at the end of `text`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RenderedPrompt {
    pub text: String,
    pub forced_prefix: Option<String>,
}

/// What an answer must obey (structured outputs; compiled by `constraint`). Part of
/// [`GenerateRequest`].
#[derive(Clone, Debug, PartialEq)]
pub enum OutputConstraint {
    /// A JSON document valid under this JSON Schema (OpenAI `json_schema`).
    JsonSchema(serde_json::Value),
    /// Any JSON object (OpenAI `json_object`).
    JsonObject,
    /// Text matching this regular expression as a whole.
    Regex(String),
    /// A Lark grammar in llguidance's dialect (`%json { ... }` embeds a JSON Schema).
    Lark(String),
    /// Tool calls whose arguments obey the `strict` tools' schemas, in the checkpoint's markup
    /// (`constraint::tools`); the engine turns it into a Lark grammar.
    ToolCalls {
        tools: Vec<StrictTool>,
        choice: ToolChoice,
    },
}

impl OutputConstraint {
    /// The grammar kind, for error messages and the cache key.
    pub fn kind(&self) -> &'static str {
        match self {
            OutputConstraint::JsonSchema(_) => "json_schema",
            OutputConstraint::JsonObject => "json_object",
            OutputConstraint::Regex(_) => "regex",
            OutputConstraint::Lark(_) => "lark",
            OutputConstraint::ToolCalls { .. } => "tool call",
        }
    }
}

/// One declared tool: its name and, when `strict`, the schema its arguments must satisfy.
#[derive(Clone, Debug, PartialEq)]
pub struct StrictTool {
    pub name: String,
    pub parameters: Option<serde_json::Value>,
}
