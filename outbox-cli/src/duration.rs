//! Durations on the command line: `90s`, `15m`, `2h`, `7d`, `500ms`.

use std::time::Duration;

/// Parses a whole number followed by a unit (`ms`, `s`, `m`, `h`, `d`).
/// A bare number, another unit or an overflow is refused with the reason:
/// `--older-than 7` could mean seconds or days, so it means neither.
pub fn parse(text: &str) -> Result<Duration, String> {
    let digits = text.trim().chars().take_while(char::is_ascii_digit).count();
    let (number, unit) = text.trim().split_at(digits);
    let Ok(number) = number.parse::<u64>() else {
        return Err(format!(
            "{text:?} is not a duration (a whole number and a unit: 500ms, 90s, 15m, 2h, 7d)"
        ));
    };
    let seconds_per_unit: u64 = match unit {
        "ms" => return Ok(Duration::from_millis(number)),
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "" => return Err(format!("{text:?} has no unit (ms, s, m, h or d)")),
        other => return Err(format!("{other:?} is not a unit (ms, s, m, h or d)")),
    };
    number
        .checked_mul(seconds_per_unit)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_scale_and_bad_input_says_why() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(604_800)));
        assert!(parse("7").unwrap_err().contains("no unit"));
        assert!(parse("7w").unwrap_err().contains("not a unit"));
        assert!(parse("-1s").unwrap_err().contains("not a duration"));
        assert!(parse("").unwrap_err().contains("not a duration"));
        assert!(
            parse("99999999999999999999d")
                .unwrap_err()
                .contains("not a duration")
        );
        assert!(
            parse("999999999999999999d")
                .unwrap_err()
                .contains("too long")
        );
    }
}
