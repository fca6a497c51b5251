//! The load log line: the bytes of weights a load put in place, per encoding, over the load's
//! wall time (GB/s), for the CPU (mapped) and the GPU (uploaded) alike.

use std::time::Duration;

/// `"{place}: T GiB in S s = R GB/s (label A GiB, label B GiB)"`, `parts` being each
/// encoding's label and bytes.
pub fn line(place: &str, parts: &[(String, u64)], elapsed: Duration) -> String {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let total: u64 = parts.iter().map(|(_, b)| b).sum();
    let secs = elapsed.as_secs_f64();
    let listed: Vec<String> = parts
        .iter()
        .map(|(label, b)| format!("{label} {:.2} GiB", gib(*b)))
        .collect();
    format!(
        "{place}: {:.2} GiB in {secs:.2} s = {:.2} GB/s ({})",
        gib(total),
        total as f64 / secs.max(1e-9) / 1e9,
        listed.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_every_part_the_total_and_the_rate() {
        let parts = [
            ("routed experts i4_mma".to_string(), 3u64 << 30),
            ("other tensors".to_string(), 1u64 << 30),
        ];
        assert_eq!(
            line("weights on X", &parts, Duration::from_millis(2000)),
            "weights on X: 4.00 GiB in 2.00 s = 2.15 GB/s (routed experts i4_mma 3.00 GiB, \
             other tensors 1.00 GiB)"
        );
    }
}
