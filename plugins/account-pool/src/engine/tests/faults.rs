//! Faults and absurd input (issue 18): upstream values that would overflow time
//! arithmetic, a token endpoint that stalls past the refresh lease, a refresh whose write
//! loses to another, and storage that fails after an upstream served the answer.

use super::*;
use pooler_plugin_kit::time::FAR_FUTURE_MS;

/// A 429 whose Retry-After is absurd holds the account at the far future: the hold is
/// kept (a wrapped `now + wait` would land in the past and free the account at once, and
/// a debug build panics), the next account serves, and a year later it is still held.
#[test]
fn a_huge_retry_after_holds_the_account_at_the_far_future() {
    let p = Pool::abc();
    p.up.push("a", with_headers(429, &[("retry-after", "1e300".into())]));
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a", "b"]);
    let a = p.store().account(&p.id("a")).unwrap().unwrap();
    assert_eq!(a.held_until, Some(FAR_FUTURE_MS));
    p.env.advance(365 * 86_400_000);
    assert_eq!(p.status_of("a"), crate::model::AccountStatus::Held);
    assert_eq!(p.claude(Some("S2")).status, 200);
    assert!(!p.up.seen().contains(&"a".to_owned()), "a stays held");
}

