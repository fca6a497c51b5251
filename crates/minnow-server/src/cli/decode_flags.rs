//! The decoding flags shared by `generate` (per run) and `serve` (server-wide defaults that each
//! request may override). Unset flags mean "the checkpoint family's default"; the ranges are the
//! engine's table (`minnow_engine::DECODE_PARAMS`), checked before the model loads.

use minnow_engine::{Algorithm, DecodeParams, DECODE_PARAMS};

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum AlgorithmArg {
    /// LLaDA2.0 threshold decoding.
    LowConfidence,
    /// LLaDA2.1 mask-to-token plus token-to-token editing.
    Joint,
    /// LLaDA2.2 editing with DELETE/SPLIT.
    Indel,
}

impl From<AlgorithmArg> for Algorithm {
    fn from(a: AlgorithmArg) -> Algorithm {
        match a {
            AlgorithmArg::LowConfidence => Algorithm::LowConfidence,
            AlgorithmArg::Joint => Algorithm::Joint,
            AlgorithmArg::Indel => Algorithm::Indel,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct DecodeFlags {
    /// Decoding algorithm (default: the checkpoint family's).
    #[arg(long, value_enum)]
    pub algorithm: Option<AlgorithmArg>,
    /// Mask-to-token confidence threshold (strictly greater commits).
    #[arg(long)]
    pub threshold: Option<f32>,
    /// Token-to-token editing threshold (joint, indel).
    #[arg(long)]
    pub editing_threshold: Option<f32>,
    /// Refinement steps after a block is mask-free (joint, indel).
    #[arg(long)]
    pub max_post_steps: Option<usize>,
    /// Step schedule length (low-confidence, indel).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Minimum mask-to-token transfers per step (joint).
    #[arg(long)]
    pub num_to_transfer: Option<usize>,
    /// Sampling temperature (0 = greedy).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Sample only among the K most likely tokens of each position (0 = no limit).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probabilities add up to P (0-1; 1 = no
    /// limit).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// RNG seed (sampling and the 2.2 anti-loop guard).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl DecodeFlags {
    /// The flags as request parameters, each set one within the engine's range for it (the error
    /// names the flag: `--top-p must be between 0 and 1`).
    pub fn params(&self) -> Result<DecodeParams, String> {
        let params = self.unchecked();
        for spec in DECODE_PARAMS {
            if let Some(value) = (spec.value)(&params) {
                spec.check(value)
                    .map_err(|problem| format!("--{} {problem}", spec.name.replace('_', "-")))?;
            }
        }
        Ok(params)
    }

    fn unchecked(&self) -> DecodeParams {
        DecodeParams {
            algorithm: self.algorithm.map(Algorithm::from),
            threshold: self.threshold,
            editing_threshold: self.editing_threshold,
            max_post_steps: self.max_post_steps,
            steps: self.steps,
            num_to_transfer: self.num_to_transfer,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Probe {
        #[command(flatten)]
        decode: DecodeFlags,
    }

    fn params(argv: &[&str]) -> Result<DecodeParams, String> {
        Probe::try_parse_from(std::iter::once("generate").chain(argv.iter().copied()))
            .unwrap()
            .decode
            .params()
    }

    /// Every flag of the engine's table is range-checked with the engine's bounds: the ends are
    /// accepted, one past them is refused naming the flag (`--temperature 3` was once accepted
    /// by `generate` and refused by the server).
    #[test]
    fn flags_follow_the_engine_ranges() {
        assert_eq!(
            params(&["--temperature", "3"]).unwrap_err(),
            "--temperature must be between 0 and 2"
        );
        for spec in DECODE_PARAMS {
            let flag = format!("--{}", spec.name.replace('_', "-"));
            for (value, ok) in [(spec.min, true), (spec.max, true), (spec.max + 1.0, false)] {
                let result = params(&[flag.as_str(), value.to_string().as_str()]);
                match result {
                    Ok(p) => {
                        assert!(ok, "{flag} {value} accepted");
                        assert_eq!((spec.value)(&p), Some(value), "{flag}");
                    }
                    Err(e) => {
                        assert!(!ok, "{flag} {value}: {e}");
                        assert!(e.starts_with(&flag), "{e}");
                    }
                }
            }
        }
    }
}
