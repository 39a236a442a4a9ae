//! Kubernetes quantities (`64Mi`, `1G`, `1.5Gi`, `500m`, `1e9`) read as numbers, for the rules
//! that compare them or turn them into a program's flags.

/// One mebibyte.
pub const MIB: f64 = 1024.0 * 1024.0;

/// The value of `quantity`: a decimal number, then an optional binary (`Ki` … `Ei`), decimal
/// (`k`, `M` … `E`), milli (`m`) or exponent (`e3`, `E3`) suffix.
///
/// # Errors
/// A sentence saying what is wrong with it.
pub fn value(quantity: &str) -> Result<f64, String> {
    let text = quantity.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    if number.is_empty() || number.starts_with('-') {
        return Err(format!(
            "{quantity:?} is no quantity: it must start with a non-negative number"
        ));
    }
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{quantity:?} is no quantity: {number:?} is no number"))?;
    let scale = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent if exponent.starts_with(['e', 'E']) => {
            let power: i32 = exponent[1..]
                .parse()
                .map_err(|_| format!("{quantity:?} is no quantity: {exponent:?} is no exponent"))?;
            10f64.powi(power)
        }
        other => {
            return Err(format!(
                "{quantity:?} is no quantity: {other:?} is no unit (use Ki, Mi, Gi, k, M, G, …)"
            ));
        }
    };
    Ok(number * scale)
}

/// Whole mebibytes in `quantity` of bytes, rounded down.
///
/// # Errors
/// As [`value`].
pub fn mebibytes(quantity: &str) -> Result<u64, String> {
    let bytes = value(quantity)?;
    // Saturating: a quantity beyond u64 MiB is refused by the rules that call this anyway.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok((bytes / MIB).floor() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_suffix_scales_as_kubernetes_does() {
        for (quantity, expected) in [
            ("64Mi", 64.0 * MIB),
            ("1Gi", 1024.0 * MIB),
            ("1.5Gi", 1536.0 * MIB),
            ("1G", 1e9),
            ("500m", 0.5),
            ("2k", 2000.0),
            ("1e6", 1e6),
            ("1048576", MIB),
        ] {
            assert_eq!(value(quantity), Ok(expected), "{quantity}");
        }
        assert_eq!(mebibytes("1G"), Ok(953));
        assert_eq!(mebibytes("64Mi"), Ok(64));
        assert_eq!(mebibytes("512Ki"), Ok(0));
    }

    #[test]
    fn what_is_no_quantity_is_named() {
        for (quantity, says) in [
            ("", "must start with a non-negative number"),
            ("-1Mi", "must start with a non-negative number"),
            ("Mi", "must start with a non-negative number"),
            ("1.2.3Mi", "is no number"),
            ("64MB", "is no unit"),
            ("1eX", "is no exponent"),
        ] {
            let error = value(quantity).expect_err(quantity);
            assert!(error.contains(says), "{quantity}: {error}");
        }
    }
}
