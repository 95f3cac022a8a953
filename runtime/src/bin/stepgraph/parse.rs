//! Value parsers for flags, so clap itself reports a bad value with the
//! flag's name (`invalid value '-1' for '--lr <LR>': must be > 0`) and exit
//! code 2, before anything runs.

use stepgraph::Precision;

/// A count of at least 1.
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// A `u64` count of at least 1.
pub fn at_least_one_u64(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// A range of sizes `LO-HI` with `LO <= HI`.
pub fn size_range(s: &str) -> Result<[usize; 2], String> {
    let (lo, hi) = s
        .split_once('-')
        .ok_or_else(|| "must be a range LO-HI, e.g. 20-128".to_owned())?;
    let n = |v: &str| v.trim().parse::<usize>().map_err(|e| format!("{v:?}: {e}"));
    let (lo, hi) = (n(lo)?, n(hi)?);
    if lo > hi {
        return Err(format!("{lo} is above {hi}: LO-HI needs LO <= HI"));
    }
    Ok([lo, hi])
}

fn float(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|e: std::num::ParseFloatError| e.to_string())?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err("must be a finite number".into())
    }
}

/// A finite number above 0.
pub fn positive(s: &str) -> Result<f64, String> {
    let v = float(s)?;
    if v > 0.0 {
        Ok(v)
    } else {
        Err("must be > 0".into())
    }
}

/// A finite number of at least 0.
pub fn non_negative(s: &str) -> Result<f64, String> {
    let v = float(s)?;
    if v >= 0.0 {
        Ok(v)
    } else {
        Err("must be >= 0".into())
    }
}

/// A fraction from 0 to 1, both included.
pub fn fraction(s: &str) -> Result<f64, String> {
    let v = float(s)?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err("must lie between 0 and 1".into())
    }
}

/// A fraction strictly between 0 and 1.
pub fn open_fraction(s: &str) -> Result<f64, String> {
    let v = float(s)?;
    if v > 0.0 && v < 1.0 {
        Ok(v)
    } else {
        Err("must lie strictly between 0 and 1".into())
    }
}

/// `--precision` (or `--dtype`) limited to the values `values` lists, each
/// with its help line, parsed into the crate's one [`Precision`]: clap
/// reports any other value with the possible ones, as for an enum flag.
pub fn precision(
    values: &'static [(Precision, &'static str)],
) -> impl clap::builder::TypedValueParser<Value = Precision> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new(values.iter().map(|&(p, help)| {
        let v = PossibleValue::new(p.name());
        if help.is_empty() { v } else { v.help(help) }
    }))
    .try_map(|s: String| s.parse::<Precision>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        assert_eq!(at_least_one("0"), Err("must be at least 1".into()));
        assert_eq!(at_least_one("7"), Ok(7));
        assert!(at_least_one("-1").is_err());
        assert_eq!(positive("nan"), Err("must be a finite number".into()));
        assert_eq!(positive("-1"), Err("must be > 0".into()));
        assert_eq!(non_negative("0"), Ok(0.0));
        assert_eq!(non_negative("-1e-9"), Err("must be >= 0".into()));
        assert_eq!(
            open_fraction("1"),
            Err("must lie strictly between 0 and 1".into())
        );
        assert_eq!(open_fraction("0.1"), Ok(0.1));
        assert_eq!(size_range("20-128"), Ok([20, 128]));
        assert_eq!(size_range("7-7"), Ok([7, 7]));
        for bad in ["128-20", "20", "a-5", "-5", "5-"] {
            assert!(size_range(bad).is_err(), "{bad}");
        }
    }
}
