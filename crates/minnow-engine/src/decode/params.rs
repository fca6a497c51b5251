//! Decoding parameters: the checkpoint family's defaults, merged with engine-wide defaults and the
//! request's overrides, then validated into one complete [`ResolvedParams`].

use minnow_model::Family;

use crate::api::{Algorithm, DecodeParams};
use crate::sampling::SamplerSettings;

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

/// Merges request > engine defaults > family defaults and validates. The error is one line that
/// names the parameter.
pub fn resolve(
    request: &DecodeParams,
    engine_defaults: &DecodeParams,
    family: Family,
) -> Result<ResolvedParams, String> {
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
    validate(&p)?;
    Ok(p)
}

fn validate(p: &ResolvedParams) -> Result<(), String> {
    let unit = |name: &str, v: f32| {
        if v.is_finite() && (0.0..=1.0).contains(&v) {
            Ok(())
        } else {
            Err(format!("{name} must be between 0 and 1, got {v}"))
        }
    };
    unit("threshold", p.threshold)?;
    unit("editing_threshold", p.editing_threshold)?;
    let t = p.sampler.temperature;
    if !t.is_finite() || t < 0.0 {
        return Err(format!("temperature must be a finite number >= 0, got {t}"));
    }
    let top_p = p.sampler.top_p;
    if !top_p.is_finite() || !(0.0..=1.0).contains(&top_p) {
        return Err(format!("top_p must be between 0 and 1, got {top_p}"));
    }
    if p.num_to_transfer == 0 {
        return Err("num_to_transfer must be at least 1".into());
    }
    if p.algorithm == Algorithm::LowConfidence && p.steps == 0 {
        return Err("steps must be at least 1 for the low-confidence algorithm".into());
    }
    if p.max_post_steps > 1000 {
        return Err(format!(
            "max_post_steps must be at most 1000, got {}",
            p.max_post_steps
        ));
    }
    Ok(())
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

    #[test]
    fn invalid_values_are_named() {
        let bad = |d: DecodeParams| resolve(&d, &DecodeParams::default(), Family::V21).unwrap_err();
        assert!(bad(DecodeParams {
            threshold: Some(1.5),
            ..Default::default()
        })
        .contains("threshold"));
        assert!(bad(DecodeParams {
            temperature: Some(-1.0),
            ..Default::default()
        })
        .contains("temperature"));
        assert!(bad(DecodeParams {
            top_p: Some(1.5),
            ..Default::default()
        })
        .contains("top_p"));
        assert!(bad(DecodeParams {
            num_to_transfer: Some(0),
            ..Default::default()
        })
        .contains("num_to_transfer"));
        let e = resolve(
            &DecodeParams {
                steps: Some(0),
                ..Default::default()
            },
            &DecodeParams::default(),
            Family::V20,
        )
        .unwrap_err();
        assert!(e.contains("steps"));
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
