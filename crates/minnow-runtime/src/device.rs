//! Which compute device a caller asked for, parsed from `--device` strings.

use std::fmt;
use std::str::FromStr;

/// A requested compute device. `Auto` means "a CUDA GPU when one is usable, else the CPU".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    #[default]
    Auto,
    Cpu,
    Cuda(usize),
}

impl FromStr for DeviceRequest {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Self::Cuda(n)),
                _ => Err(format!(
                    "unknown device '{other}': expected auto, cpu, cuda or cuda:N"
                )),
            },
        }
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_strings() {
        assert_eq!("auto".parse::<DeviceRequest>(), Ok(DeviceRequest::Auto));
        assert_eq!("cpu".parse::<DeviceRequest>(), Ok(DeviceRequest::Cpu));
        assert_eq!("cuda".parse::<DeviceRequest>(), Ok(DeviceRequest::Cuda(0)));
        assert_eq!(
            "cuda:3".parse::<DeviceRequest>(),
            Ok(DeviceRequest::Cuda(3))
        );
        assert!("gpu".parse::<DeviceRequest>().is_err());
        assert!("cuda:x".parse::<DeviceRequest>().is_err());
    }
}
