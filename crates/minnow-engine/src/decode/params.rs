//! Decoding parameters: the one table of their ranges ([`DECODE_PARAMS`], read by the engine's
//! validation, the server's request parser, the CLI's flags and docs/api.md), the checkpoint
//! family's defaults, merged with engine-wide defaults and the request's overrides, then
//! validated into one complete [`ResolvedParams`].

use minnow_model::Family;

use crate::api::{Algorithm, DecodeParams};
use crate::error::EngineError;
use crate::sampling::SamplerSettings;

/// Whether a parameter takes any number or only whole numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    Number,
    Integer,
}

/// One bounded decoding parameter: its name (the request field, and the CLI flag with `-` for
/// `_`), its type and inclusive range, and what it does. Its default is the checkpoint family's
/// ([`ParamSpec::family_default`]).
#[derive(Clone, Copy, Debug)]
pub struct ParamSpec {
    pub name: &'static str,
    pub kind: ParamKind,
    pub min: f64,
    pub max: f64,
    pub meaning: &'static str,
    /// Its value in a [`DecodeParams`] (`None`: not set).
    pub value: fn(&DecodeParams) -> Option<f64>,
}

/// Every bounded decoding parameter, in the order docs/api.md lists them. The upper ends are the
/// engine's limits, not the algorithms': a temperature above 2 or thousands of steps per block
/// only spend time (`max_post_steps` bounds the forwards of one block).
pub const DECODE_PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "temperature",
        kind: ParamKind::Number,
        min: 0.0,
        max: 2.0,
        meaning: "sampling temperature; 0 = greedy",
        value: |p| p.temperature.map(f64::from),
    },
    ParamSpec {
        name: "top_p",
        kind: ParamKind::Number,
        min: 0.0,
        max: 1.0,
        meaning: "nucleus sampling: only the most likely tokens whose probabilities add up to it; 1 = off",
        value: |p| p.top_p.map(f64::from),
    },
    ParamSpec {
        name: "top_k",
        kind: ParamKind::Integer,
        min: 0.0,
        max: 16_777_216.0,
        meaning: "only the K most likely tokens of a position; 0 = off",
        value: |p| p.top_k.map(|n| n as f64),
    },
    ParamSpec {
        name: "threshold",
        kind: ParamKind::Number,
        min: 0.0,
        max: 1.0,
        meaning: "diffusion: confidence to commit a masked position",
        value: |p| p.threshold.map(f64::from),
    },
    ParamSpec {
        name: "editing_threshold",
        kind: ParamKind::Number,
        min: 0.0,
        max: 1.0,
        meaning: "diffusion (`joint`, `indel`): confidence to edit a committed token",
        value: |p| p.editing_threshold.map(f64::from),
    },
    ParamSpec {
        name: "max_post_steps",
        kind: ParamKind::Integer,
        min: 0.0,
        max: 1000.0,
        meaning: "diffusion (`joint`, `indel`): editing rounds after a block has no masks",
        value: |p| p.max_post_steps.map(|n| n as f64),
    },
    ParamSpec {
        name: "steps",
        kind: ParamKind::Integer,
        min: 1.0,
        max: 4096.0,
        meaning: "diffusion (`low-confidence`, `indel`): step schedule per block",
        value: |p| p.steps.map(|n| n as f64),
    },
    ParamSpec {
        name: "num_to_transfer",
        kind: ParamKind::Integer,
        min: 1.0,
        max: 4096.0,
        meaning: "diffusion (`joint`): masked positions committed per step at least",
        value: |p| p.num_to_transfer.map(|n| n as f64),
    },
];

/// The table's entry for `name`. Panics on a name the table lacks: callers pass names of
/// [`DECODE_PARAMS`] written in the code, so a miss is a bug caught by the first test that runs
/// it.
pub fn param_spec(name: &str) -> &'static ParamSpec {
    DECODE_PARAMS
        .iter()
        .find(|spec| spec.name == name)
        .unwrap_or_else(|| panic!("no decoding parameter named {name}"))
}

impl ParamSpec {
    /// `Err("must be between MIN and MAX")` when `value` is outside the range (or not finite);
    /// callers prefix the name as their users spell it (`'top_p'`, `--top-p`).
    pub fn check(&self, value: f64) -> Result<(), String> {
        if value.is_finite() && value >= self.min && value <= self.max {
            Ok(())
        } else {
            Err(format!("must be between {} and {}", self.min, self.max))
        }
    }

    /// [`ParamSpec::check`] as the engine's error: `'name' must be between MIN and MAX`, naming
    /// the parameter.
    pub fn check_param(&self, value: f64) -> Result<(), EngineError> {
        self.check(value)
            .map_err(|problem| EngineError::InvalidParam {
                param: self.name,
                message: format!("'{}' {problem}", self.name),
            })
    }

    /// The checkpoint families' defaults, as docs/api.md states them: one value when every family
    /// shares it, else each family's.
    pub fn family_default(&self) -> String {
        let families = [
            (Family::V20, "2.0"),
            (Family::V21, "2.1"),
            (Family::V22, "2.2"),
        ];
        let values: Vec<(String, &str)> = families
            .iter()
            .map(|&(family, name)| {
                let value = (self.value)(&family_defaults(family))
                    .map_or_else(|| "none".to_string(), |x| format!("{}", x as f32));
                (value, name)
            })
            .collect();
        if values.iter().all(|(value, _)| *value == values[0].0) {
            return values[0].0.clone();
        }
        // Families sharing a value are listed together: "0.95 (2.0), 0.5 (2.1, 2.2)".
        let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
        for (value, family) in values {
            match groups.iter_mut().find(|(v, _)| *v == value) {
                Some((_, names)) => names.push(family),
                None => groups.push((value, vec![family])),
            }
        }
        groups
            .iter()
            .map(|(value, names)| format!("{value} ({})", names.join(", ")))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Checks every parameter that `params` sets against [`DECODE_PARAMS`]; the error names the first
/// one out of range.
pub fn check_ranges(params: &DecodeParams) -> Result<(), EngineError> {
    for spec in DECODE_PARAMS {
        if let Some(value) = (spec.value)(params) {
            spec.check_param(value)?;
        }
    }
    Ok(())
}

/// docs/api.md's table of the decoding parameters, generated from [`DECODE_PARAMS`] (a unit test
/// fails, printing this, when the document differs).
pub fn decode_params_markdown() -> String {
    let mut out = String::from("| field | type | min | max | default | meaning |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    for spec in DECODE_PARAMS {
        let kind = match spec.kind {
            ParamKind::Number => "number",
            ParamKind::Integer => "integer",
        };
        out.push_str(&format!(
            "| `{}` | {kind} | {} | {} | {} | {} |\n",
            spec.name,
            spec.min,
            spec.max,
            spec.family_default(),
            spec.meaning
        ));
    }
    out
}

/// Every knob of one request, after defaults were applied and values checked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResolvedParams {
    pub algorithm: Algorithm,
    /// Mask-to-token threshold τ / τm (strict `>`).
    pub threshold: f32,
    /// Token-to-token threshold τe (joint, indel).
    pub editing_threshold: f32,
    /// Post steps after the block became mask-free (joint, indel).
    pub max_post_steps: usize,
    /// Step schedule length (low-confidence: over the block length; indel: over the masks).
    pub steps: usize,
    /// Minimum mask-to-token transfers per step (joint).
    pub num_to_transfer: usize,
    pub sampler: SamplerSettings,
    /// `None`: see [`ResolvedParams::rng_seed`].
    pub seed: Option<u64>,
}

/// The seed used when a greedy request gives none. Greedy decoding must be reproducible even
/// though the 2.2 anti-loop guard draws random numbers (decoding doc §7.7 point 3).
pub const GREEDY_DEFAULT_SEED: u64 = 42;

impl ResolvedParams {
    /// The request's RNG seed. UNCONFIRMED point (§4.5): with no seed, greedy requests use the
    /// fixed [`GREEDY_DEFAULT_SEED`] (so they are deterministic, as users expect of temperature
    /// 0), and sampling requests draw fresh entropy (so repeated calls differ, as with any
    /// OpenAI-style server).
    pub fn rng_seed(&self) -> u64 {
        match self.seed {
            Some(seed) => seed,
            None if self.sampler.temperature <= 0.0 => GREEDY_DEFAULT_SEED,
            None => rand::random(),
        }
    }
}

/// The decoding defaults of a checkpoint family, every field but `seed` set (decoding doc §5, §6.3,
/// §7.2). Fields that an algorithm does not read are still filled so `/props` can show them.
pub fn family_defaults(family: Family) -> DecodeParams {
    let (algorithm, threshold) = match family {
        // 2.0 report and official generate: τ 0.95, 32 steps (one token per step at least).
        Family::V20 => (Algorithm::LowConfidence, 0.95),
        // 2.1: SGLang's serving defaults (the spec's recommendation), not the official "quality"
        // preset 0.95 / 0.9.
        Family::V21 => (Algorithm::Joint, 0.5),
        // 2.2: the reference port's and SGLang's defaults.
        Family::V22 => (Algorithm::Indel, 0.5),
    };
    DecodeParams {
        algorithm: Some(algorithm),
        threshold: Some(threshold),
        editing_threshold: Some(0.0),
        max_post_steps: Some(16),
        steps: Some(32),
        num_to_transfer: Some(1),
        temperature: Some(0.0),
        top_k: Some(0),
        top_p: Some(1.0),
        seed: None,
    }
}

/// `first` where set, else `second`, field by field.
pub fn overlay(first: &DecodeParams, second: &DecodeParams) -> DecodeParams {
    DecodeParams {
        algorithm: first.algorithm.or(second.algorithm),
        threshold: first.threshold.or(second.threshold),
        editing_threshold: first.editing_threshold.or(second.editing_threshold),
        max_post_steps: first.max_post_steps.or(second.max_post_steps),
        steps: first.steps.or(second.steps),
        num_to_transfer: first.num_to_transfer.or(second.num_to_transfer),
        temperature: first.temperature.or(second.temperature),
        top_k: first.top_k.or(second.top_k),
        top_p: first.top_p.or(second.top_p),
        seed: first.seed.or(second.seed),
    }
}

/// Merges request > engine defaults > family defaults and checks the ranges of [`DECODE_PARAMS`].
/// The error names the parameter.
pub fn resolve(
    request: &DecodeParams,
    engine_defaults: &DecodeParams,
    family: Family,
) -> Result<ResolvedParams, EngineError> {
    let merged = overlay(request, &overlay(engine_defaults, &family_defaults(family)));
    // family_defaults sets every field but the seed, so these unwraps cannot fail.
    let p = ResolvedParams {
        algorithm: merged.algorithm.unwrap_or(Algorithm::LowConfidence),
        threshold: merged.threshold.unwrap_or(0.95),
        editing_threshold: merged.editing_threshold.unwrap_or(0.0),
        max_post_steps: merged.max_post_steps.unwrap_or(16),
        steps: merged.steps.unwrap_or(32),
        num_to_transfer: merged.num_to_transfer.unwrap_or(1),
        sampler: SamplerSettings {
            temperature: merged.temperature.unwrap_or(0.0),
            top_k: merged.top_k.unwrap_or(0),
            top_p: merged.top_p.unwrap_or(1.0),
        },
        seed: merged.seed,
    };
    // Ranges are checked on the merged values, so a bad engine-wide default fails too.
    check_ranges(&merged)?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_decides_algorithm_and_thresholds() {
        let none = DecodeParams::default();
        let v20 = resolve(&none, &none, Family::V20).unwrap();
        assert_eq!(v20.algorithm, Algorithm::LowConfidence);
        assert_eq!((v20.threshold, v20.steps), (0.95, 32));
        let v21 = resolve(&none, &none, Family::V21).unwrap();
        assert_eq!(v21.algorithm, Algorithm::Joint);
        assert_eq!(
            (v21.threshold, v21.editing_threshold, v21.max_post_steps),
            (0.5, 0.0, 16)
        );
        let v22 = resolve(&none, &none, Family::V22).unwrap();
        assert_eq!(v22.algorithm, Algorithm::Indel);
        assert_eq!(v22.sampler, SamplerSettings::GREEDY);
    }

    #[test]
    fn request_overrides_engine_defaults_which_override_family() {
        let engine = DecodeParams {
            threshold: Some(0.7),
            steps: Some(8),
            ..Default::default()
        };
        let request = DecodeParams {
            threshold: Some(0.9),
            ..Default::default()
        };
        let p = resolve(&request, &engine, Family::V20).unwrap();
        assert_eq!((p.threshold, p.steps), (0.9, 8));
    }

    /// The parameter a refused request names.
    fn refused(request: DecodeParams, family: Family) -> (&'static str, String) {
        match resolve(&request, &DecodeParams::default(), family) {
            Err(EngineError::InvalidParam { param, message }) => (param, message),
            other => panic!("expected a refusal naming the parameter, got {other:?}"),
        }
    }

    #[test]
    fn invalid_values_are_named() {
        let (param, message) = refused(
            DecodeParams {
                threshold: Some(1.5),
                ..Default::default()
            },
            Family::V21,
        );
        assert_eq!(param, "threshold");
        assert_eq!(message, "'threshold' must be between 0 and 1");
        let (param, message) = refused(
            DecodeParams {
                temperature: Some(3.0),
                ..Default::default()
            },
            Family::V21,
        );
        assert_eq!(
            (param, message.as_str()),
            ("temperature", "'temperature' must be between 0 and 2")
        );
        let nan = DecodeParams {
            top_p: Some(f32::NAN),
            ..Default::default()
        };
        assert_eq!(refused(nan, Family::V22).0, "top_p");
        let zero = DecodeParams {
            num_to_transfer: Some(0),
            ..Default::default()
        };
        assert_eq!(refused(zero, Family::V21).0, "num_to_transfer");
        // Zero steps is refused whatever the algorithm (it was once only for low-confidence).
        for family in [Family::V20, Family::V21, Family::V22] {
            let zero = DecodeParams {
                steps: Some(0),
                ..Default::default()
            };
            assert_eq!(refused(zero, family).0, "steps");
        }
    }

    #[test]
    fn every_range_is_enforced_at_its_ends() {
        for spec in DECODE_PARAMS {
            for (value, ok) in [
                (spec.min, true),
                (spec.max, true),
                (spec.min - 1.0, false),
                (spec.max + 1.0, false),
            ] {
                let result = spec.check_param(value);
                assert_eq!(result.is_ok(), ok, "{}={value}", spec.name);
                if let Err(EngineError::InvalidParam { param, .. }) = result {
                    assert_eq!(param, spec.name);
                }
            }
        }
    }

    #[test]
    fn the_table_reads_and_defaults_every_field() {
        let all = family_defaults(Family::V21);
        for spec in DECODE_PARAMS {
            let value = (spec.value)(&all).unwrap_or_else(|| panic!("{} unset", spec.name));
            assert!(spec.check(value).is_ok(), "{}'s default {value}", spec.name);
            assert_eq!(
                (spec.value)(&DecodeParams::default()),
                None,
                "{}",
                spec.name
            );
            assert_eq!(param_spec(spec.name).name, spec.name);
        }
        assert_eq!(
            param_spec("threshold").family_default(),
            "0.95 (2.0), 0.5 (2.1, 2.2)"
        );
        assert_eq!(param_spec("temperature").family_default(), "0");
    }

    /// docs/api.md carries the table between two markers; it must be what the code generates.
    #[test]
    fn docs_api_md_states_the_engine_table() {
        let docs = include_str!("../../../../docs/api.md");
        let begin = "<!-- decode-params: begin -->\n";
        let end = "<!-- decode-params: end -->";
        let expected = decode_params_markdown();
        let found = docs
            .split_once(begin)
            .and_then(|(_, rest)| rest.split_once(end))
            .map(|(table, _)| table);
        assert!(
            found == Some(expected.as_str()),
            "docs/api.md's decoding parameter table (between {begin:?} and {end:?}) differs from \
             the engine's DECODE_PARAMS; replace it with:\n\n{expected}\nfound:\n\n{}",
            found.unwrap_or("(no markers)")
        );
    }

    #[test]
    fn greedy_without_seed_is_reproducible() {
        let p = resolve(
            &DecodeParams::default(),
            &DecodeParams::default(),
            Family::V22,
        )
        .unwrap();
        assert_eq!(p.rng_seed(), GREEDY_DEFAULT_SEED);
    }
}
