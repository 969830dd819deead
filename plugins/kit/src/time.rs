//! Saturating time arithmetic for epoch milliseconds and durations, shared by the plugins.
//!
//! Every "now + wait" a plugin computes goes through [`after`], and every number of seconds
//! an upstream states becomes milliseconds through [`secs_to_ms`], so a hostile or absurd
//! value (`retry-after: 1e300`, a reset a billion years out) gives a time at the far future
//! instead of wrapping around to the past (release builds) or panicking (debug builds).
//!
//! The far future is capped at [`FAR_FUTURE_MS`], `i64::MAX` milliseconds, the largest time
//! an SQLite integer holds: a time written to the database reads back unchanged.

/// The latest time a plugin computes: `i64::MAX` ms (about 292 million years from 1970),
/// the largest value an SQLite integer column stores.
pub const FAR_FUTURE_MS: u64 = i64::MAX as u64;

/// How far ahead an upstream may state a reset or a `Retry-After` and be believed: 30 days.
/// Real windows reset within a week; a time beyond this (a date in year 9999, `1e300`
/// seconds) is a broken or hostile answer, and is treated as unknown rather than holding an
/// account, or telling a client to wait, until then.
pub const RESET_HORIZON_MS: u64 = 30 * 86_400_000;

/// `at` when it lies at most [`RESET_HORIZON_MS`] after `now` (a time already passed
/// included); None beyond.
pub fn within_horizon(at: u64, now: u64) -> Option<u64> {
    (at <= after(now, RESET_HORIZON_MS)).then_some(at)
}

/// `now + ms`, saturating at [`FAR_FUTURE_MS`].
pub fn after(now: u64, ms: u64) -> u64 {
    now.saturating_add(ms).min(FAR_FUTURE_MS)
}

/// A non-negative number of seconds as milliseconds, fractions rounded up to the
/// millisecond, saturating at [`FAR_FUTURE_MS`]. None for a negative, NaN or infinite
/// number.
pub fn secs_to_ms(secs: f64) -> Option<u64> {
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    // `as` saturates a float too large for u64; the cap keeps it storable.
    Some(((secs * 1000.0).ceil() as u64).min(FAR_FUTURE_MS))
}

/// Seconds written as text (`7`, `0.0015`, `1e3`) as milliseconds, rounded up, saturating
/// at [`FAR_FUTURE_MS`]. Plain decimals are read digit by digit, exactly: through an `f64`,
/// `131168.746` s became 131 168 747 ms (the product is 131168746.00000001 before it is
/// rounded up). Other numbers (exponents) go through [`secs_to_ms`]. None for text that is
/// not a non-negative number.
pub fn secs_text_to_ms(text: &str) -> Option<u64> {
    let t = text.trim();
    let (whole, fraction) = t.split_once('.').unwrap_or((t, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty()
        || !digits(whole)
        || !digits(fraction)
        || (t.contains('.') && fraction.is_empty())
    {
        return t.parse::<f64>().ok().and_then(secs_to_ms);
    }
    // Leading zeros cannot overflow; more than 20 significant digits is past u64 anyway.
    let whole = whole.trim_start_matches('0');
    let secs: u64 = if whole.is_empty() {
        0
    } else if whole.len() > 20 {
        return Some(FAR_FUTURE_MS);
    } else {
        whole.parse().ok()?
    };
    let mut ms = 0u64;
    for (k, b) in fraction.bytes().take(3).enumerate() {
        ms += u64::from(b - b'0') * [100, 10, 1][k];
    }
    let rest_nonzero = fraction.bytes().skip(3).any(|b| b != b'0');
    Some(
        secs.saturating_mul(1000)
            .saturating_add(ms)
            .saturating_add(u64::from(rest_nonzero))
            .min(FAR_FUTURE_MS),
    )
}

/// A `Retry-After` value as the upstream stated it ([`parse_retry_after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    /// A delay in seconds, as milliseconds rounded up ([`secs_text_to_ms`]).
    Delay(u64),
    /// An HTTP date, as epoch milliseconds.
    At(u64),
}

/// Read a `Retry-After` value: delay seconds (a number; upstreams send fractions too) or an
/// HTTP date. None for anything else, a negative or non-finite number included. The one
/// reading of the header: the pool turns it into a wait, the core into a deadline, each
/// with its own rounding.
pub fn parse_retry_after(value: &str) -> Option<RetryAfter> {
    let v = value.trim();
    if v.parse::<f64>().is_ok() {
        secs_text_to_ms(v).map(RetryAfter::Delay)
    } else {
        parse_http_date(v).map(RetryAfter::At)
    }
}

/// An HTTP date (IMF-fixdate, and the obsolete RFC 850 and asctime forms) as epoch
/// milliseconds.
pub fn parse_http_date(text: &str) -> Option<u64> {
    let t = httpdate::parse_http_date(text.trim()).ok()?;
    let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    u64::try_from(d.as_millis()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_saturates_at_the_far_future() {
        assert_eq!(after(1_000, 500), 1_500);
        assert_eq!(after(1_000, u64::MAX), FAR_FUTURE_MS);
        assert_eq!(after(u64::MAX, 1), FAR_FUTURE_MS);
        assert_eq!(after(FAR_FUTURE_MS, 0), FAR_FUTURE_MS);
    }

    #[test]
    fn times_past_the_horizon_are_unknown() {
        let now = 1_000;
        assert_eq!(within_horizon(0, now), Some(0), "passed");
        assert_eq!(
            within_horizon(now + RESET_HORIZON_MS, now),
            Some(now + RESET_HORIZON_MS)
        );
        assert_eq!(within_horizon(now + RESET_HORIZON_MS + 1, now), None);
        assert_eq!(within_horizon(FAR_FUTURE_MS, u64::MAX), Some(FAR_FUTURE_MS));
        assert_eq!(within_horizon(u64::MAX, u64::MAX), None);
    }

    #[test]
    fn seconds_become_milliseconds_rounded_up_and_capped() {
        assert_eq!(secs_to_ms(1.5), Some(1_500));
        assert_eq!(secs_to_ms(0.0001), Some(1));
        assert_eq!(secs_to_ms(0.0), Some(0));
        assert_eq!(secs_to_ms(1e300), Some(FAR_FUTURE_MS));
        assert_eq!(secs_to_ms(9.3e15), Some(FAR_FUTURE_MS));
        assert_eq!(secs_to_ms(-1.0), None);
        assert_eq!(secs_to_ms(f64::NAN), None);
        assert_eq!(secs_to_ms(f64::INFINITY), None);
    }

    #[test]
    fn seconds_as_text_are_read_exactly() {
        let table = [
            ("7", Some(7_000)),
            (" 7 ", Some(7_000)),
            ("131168.746", Some(131_168_746)),
            ("0.0015", Some(2)),
            ("0.001", Some(1)),
            ("1.5000", Some(1_500)),
            ("007.25", Some(7_250)),
            (".5", Some(500)),
            ("1e3", Some(1_000_000)),
            ("1e300", Some(FAR_FUTURE_MS)),
            ("99999999999999999999999999", Some(FAR_FUTURE_MS)),
            ("18446744073709551615", Some(FAR_FUTURE_MS)),
            ("-1", None),
            ("1.", Some(1_000)),
            ("NaN", None),
            ("soon", None),
            ("", None),
        ];
        for (text, want) in table {
            assert_eq!(secs_text_to_ms(text), want, "{text:?}");
        }
    }

    #[test]
    fn retry_after_is_delay_seconds_or_an_http_date() {
        assert_eq!(parse_retry_after("7"), Some(RetryAfter::Delay(7_000)));
        assert_eq!(parse_retry_after(" 1.5 "), Some(RetryAfter::Delay(1_500)));
        assert_eq!(parse_retry_after("0.0001"), Some(RetryAfter::Delay(1)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(RetryAfter::At(1_445_412_480_000))
        );
        assert_eq!(
            parse_retry_after("1e300"),
            Some(RetryAfter::Delay(FAR_FUTURE_MS))
        );
        for bad in ["-1", "NaN", "inf", "", "soon", "Wed, 21 Oct 2015"] {
            assert_eq!(parse_retry_after(bad), None, "{bad:?}");
        }
    }
}
