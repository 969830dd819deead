//! Civil time for what the host shows people: instants as RFC 3339 text and this machine's
//! offset from UTC. Both come from `jiff`, which reads `TZ` and the system's zone database
//! itself (no C library call, safe in a multi-threaded process).

/// `ms` (unix epoch milliseconds) as an RFC 3339 UTC time to the second,
/// `2025-01-31T09:05:00Z`. An instant past the latest the calendar holds (a "never" some
/// records carry) is shown as that latest instant, `9999-12-30T22:00:00Z`.
pub fn rfc3339(ms: u64) -> String {
    let secs = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    let at = jiff::Timestamp::from_second(secs).unwrap_or(jiff::Timestamp::MAX);
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// This machine's offset from UTC at `ms`, in seconds east (the zone `TZ` names, else the
/// system's); 0 when it cannot say.
pub fn local_offset_s(ms: u64) -> i32 {
    offset_in(&jiff::tz::TimeZone::system(), ms)
}

/// `zone`'s offset from UTC at `ms`, in seconds east; 0 past the year 9999.
fn offset_in(zone: &jiff::tz::TimeZone, ms: u64) -> i32 {
    match jiff::Timestamp::from_second(i64::try_from(ms / 1000).unwrap_or(i64::MAX)) {
        Ok(at) => zone.to_offset(at).seconds(),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_is_utc_to_the_second() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000_999), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-30T22:00:00Z");
    }

    #[test]
    fn the_offset_follows_the_zone_and_its_summer_time() {
        // A POSIX rule, so the test needs no zone database on the machine.
        let paris = jiff::tz::TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        assert_eq!(offset_in(&paris, 1_700_000_000_000), 3600);
        assert_eq!(offset_in(&paris, 1_720_000_000_000), 7200);
        let new_york = jiff::tz::TimeZone::posix("EST5EDT,M3.2.0,M11.1.0").unwrap();
        assert_eq!(offset_in(&new_york, 1_700_000_000_000), -5 * 3600);
        assert_eq!(offset_in(&paris, u64::MAX), 0);
    }
}
