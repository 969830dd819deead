//! `pooler status`: one screen that answers "is my pool healthy, and are my threads
//! moving?", from the admin API's `GET /_pooler/overview` (the snapshot the status page
//! shows too, [`crate::operate::wire::overview`]).
//!
//! The screen is [`render`]: a pure function of the snapshot, the time to count from, and
//! the [`Style`] (colour or not, the local UTC offset), so it is tested with fixed inputs.
//! Times are local wall-clock time plus how far away they are ("14:05 (in 2 h 10 m)"),
//! counted from the snapshot's `now` (the server's clock, which schedules the retries).
//! Colour only when standard output is a terminal and `NO_COLOR` is unset. `--json` prints
//! the snapshot itself; `--watch` redraws in place (ANSI home + clear) until Ctrl-C, and
//! with `--json` prints one snapshot per line instead.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::time::Duration;

use super::UsageError;
use super::client::ClientArgs;
use crate::operate::wire::overview::{Overview, Serving};
use crate::operate::wire::{AccountView, AvailabilityView, TokenCountsView};

/// Is the pool healthy, and are the threads moving? Providers, accounts, threads and their
/// retries on one screen.
///
/// Per provider: whether it can serve now, or when next. Per account: its status, usage
/// per quota window as a bar, when it resets (local time, and how long from now), holds and
/// errors with their reason. Per thread: its agent, state, what the pool says about it, and
/// its open retry with the next send time and why. Colour on a terminal (not when piped or
/// with NO_COLOR set).
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    pooler status             # one screen, now\n  \
    pooler status --watch     # redraw every 2 s until Ctrl-C\n  \
    pooler status --watch 10  # every 10 s\n  \
    pooler status --json      # the admin API's snapshot (GET /_pooler/overview)\n\n\
    The same information, live in a browser: `pooler page`.")]
pub struct Args {
    #[command(flatten)]
    pub(super) client: ClientArgs,
    /// Redraw in place every SECS seconds (default 2) until Ctrl-C; with --json, print one
    /// snapshot per line.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2")]
    watch: Option<u64>,
}

/// How the screen is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// ANSI colours.
    pub colour: bool,
    /// The local time zone's offset from UTC, in seconds (east positive).
    pub utc_offset_s: i32,
}

/// Run `pooler status` against the server of `--data-dir`; `--json` prints the JSON answer.
pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.watch == Some(0) {
        return Err(UsageError("--watch needs a number of seconds of at least 1".into()).into());
    }
    let client = args.client.connect()?;
    // "Today" of the token counts is the local day.
    let path = format!("overview?utc_offset_s={}", crate::time::local_offset_s(super::format::now_ms()));
    let Some(every) = args.watch else {
        let answer = client.get(&path).await?;
        return args.client.print(&answer, |answer| {
            let overview: Overview = serde_json::from_value(answer.clone())?;
            print!("{}", render(&overview, overview.now, local_style(overview.now)));
            Ok(())
        });
    };
    // Ctrl-C is heard from before the first screen is drawn.
    let mut interrupted = Box::pin(interrupted()?);
    loop {
        let answer = client.get(&path).await;
        if args.client.json {
            println!("{}", super::format::json_text(&answer?, false));
        } else {
            let screen = match answer.and_then(|a| {
                Ok(serde_json::from_value::<Overview>(
                    super::format::visible_json(&a),
                )?)
            }) {
                Ok(overview) => render(&overview, overview.now, local_style(overview.now)),
                Err(e) => format!(
                    "error: {}\n(retrying every {every} s)\n",
                    super::format::visible(&format!("{e:#}"))
                ),
            };
            // Home, clear the screen, then the new screen.
            print!("\x1b[H\x1b[2J{screen}");
            std::io::Write::flush(&mut std::io::stdout())?;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(every)) => {}
            _ = &mut interrupted => return Ok(()),
        }
    }
}

/// Resolves at Ctrl-C (SIGINT). On Unix the handler is installed at once, not at the first
/// poll, so an interrupt right after the first screen is never lost.
#[cfg(unix)]
fn interrupted() -> anyhow::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigint = signal(SignalKind::interrupt())?;
    Ok(async move {
        sigint.recv().await;
    })
}

#[cfg(not(unix))]
fn interrupted() -> anyhow::Result<impl Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// Colour when stdout is a terminal and `NO_COLOR` is unset; the local offset at `now`.
fn local_style(now: u64) -> Style {
    Style {
        colour: std::io::stdout().is_terminal()
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        utc_offset_s: crate::time::local_offset_s(now),
    }
}

const RESET: &str = "\x1b[0m";
const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";
const GREEN: &str = "\x1b[32m";
const YELLOW: &str = "\x1b[33m";
const RED: &str = "\x1b[31m";

/// The colour a state word is shown in.
fn tone(word: &str) -> &'static str {
    match word {
        "ready" | "idle" | "serving" => GREEN,
        "near-limit" | "held" | "exhausted" | "active" | "blocked" | "scheduled" | "watching" => {
            YELLOW
        }
        _ => RED,
    }
}

struct Painter {
    colour: bool,
}

impl Painter {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.colour {
            format!("{code}{text}{RESET}")
        } else {
            text.to_owned()
        }
    }

    fn state(&self, word: &str) -> String {
        self.paint(tone(word), word)
    }
}

/// `in 2 h 10 m`, `5 m ago`, `now`.
pub fn relative(ms: u64, now: u64) -> String {
    let (delta, future) = if ms >= now {
        (ms - now, true)
    } else {
        (now - ms, false)
    };
    let s = delta / 1000;
    let text = if s < 1 {
        return "now".to_owned();
    } else if s < 60 {
        format!("{s} s")
    } else if s < 3600 {
        format!("{} m", s / 60)
    } else if s < 86_400 {
        match s % 3600 / 60 {
            0 => format!("{} h", s / 3600),
            m => format!("{} h {m} m", s / 3600),
        }
    } else {
        match s % 86_400 / 3600 {
            0 => format!("{} d", s / 86_400),
            h => format!("{} d {h} h", s / 86_400),
        }
    };
    if future {
        format!("in {text}")
    } else {
        format!("{text} ago")
    }
}

/// Local `HH:MM`, with the date first when it is not `now`'s local day.
fn clock(ms: u64, now: u64, offset_s: i32) -> String {
    let local = |t: u64| {
        let secs = i64::try_from(t / 1000).unwrap_or(i64::MAX) + i64::from(offset_s);
        (secs.div_euclid(86_400), secs.rem_euclid(86_400))
    };
    let (day, secs) = local(ms);
    let hm = format!("{:02}:{:02}", secs / 3600, secs % 3600 / 60);
    if day == local(now).0 {
        hm
    } else {
        // Saturating: a plugin's time may be any u64 (a day count past i64 / 86 400 000).
        let date = super::format::iso(u64::try_from(day.saturating_mul(86_400_000)).unwrap_or(0));
        format!("{} {hm}", &date[..10])
    }
}

/// `14:05 (in 2 h 10 m)`.
fn when(ms: u64, now: u64, offset_s: i32) -> String {
    format!("{} ({})", clock(ms, now, offset_s), relative(ms, now))
}

/// `UTC+01:00`.
fn zone(offset_s: i32) -> String {
    let sign = if offset_s < 0 { '-' } else { '+' };
    let abs = offset_s.unsigned_abs();
    format!("UTC{sign}{:02}:{:02}", abs / 3600, abs % 3600 / 60)
}

/// A 20-cell bar for a utilization fraction.
fn bar(utilization: f64) -> String {
    const CELLS: usize = 20;
    let fraction = utilization.clamp(0.0, 1.0);
    // Rounded to whole cells; the clamp keeps it within 0..=CELLS.
    let filled = ((fraction * CELLS as f64).round() as usize).min(CELLS);
    format!("[{}{}]", "#".repeat(filled), "-".repeat(CELLS - filled))
}

/// A token count for people: `950`, `12.3k`, `4.1M`.
pub fn count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// `in 1.2k  out 340  cache read 98.0k  write 2.1k  (cache hit 96 %, 14 answers)`.
pub fn tokens(t: &TokenCountsView) -> String {
    let hit = t
        .cache_hit_share()
        .map_or_else(String::new, |s| format!("cache hit {:.0} %, ", s * 100.0));
    let answers = match t.answers {
        1 => "1 answer".to_owned(),
        n => format!("{n} answers"),
    };
    format!(
        "in {}  out {}  cache read {}  write {}  ({hit}{answers})",
        count(t.input),
        count(t.output),
        count(t.cache_read),
        count(t.cache_write)
    )
}

/// Why an account does not serve (or what a person should know), in words.
fn why(account: &AccountView) -> Option<String> {
    if let Some(error) = &account.error {
        return Some(error.clone());
    }
    match account.status.as_str() {
        "held" => Some("held after a rate limit (Retry-After)".to_owned()),
        "exhausted" => {
            let blocking: Vec<&str> = account
                .windows
                .iter()
                .filter(|w| w.blocking)
                .map(|w| w.name.as_str())
                .collect();
            Some(if blocking.is_empty() {
                "quota exhausted".to_owned()
            } else {
                format!("quota exhausted ({})", blocking.join(", "))
            })
        }
        "disabled" => Some("disabled by a person".to_owned()),
        _ if account.needs_sign_in => Some("token refresh refused: sign in again soon".to_owned()),
        _ => None,
    }
}

fn availability(a: &AvailabilityView, now: u64, offset_s: i32) -> String {
    match a {
        AvailabilityView::NotRouted => "not routed".to_owned(),
        AvailabilityView::Ready => "can serve now".to_owned(),
        AvailabilityView::Blocked { retry_at, cause } => {
            format!("blocked ({cause}) until {}", when(*retry_at, now, offset_s))
        }
        AvailabilityView::Unavailable(reason) => format!("unavailable ({reason})"),
    }
}

/// The whole screen (see the module docs); every line ends with a newline.
pub fn render(o: &Overview, now: u64, style: Style) -> String {
    let p = Painter {
        colour: style.colour,
    };
    let off = style.utc_offset_s;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} at {} ({}; times are local)",
        p.paint(BOLD, "Pooler"),
        clock(now, now, off),
        zone(off)
    );

    out.push('\n');
    let _ = writeln!(out, "{}", p.paint(BOLD, "Providers"));
    let listed: Vec<_> = o.providers.iter().filter(|x| x.accounts > 0).collect();
    if listed.is_empty() {
        let _ = writeln!(out, "  no accounts (add one with `pooler account add`)");
    }
    for x in listed {
        let serving = match &x.serving {
            Serving::Ready => p.state("serving"),
            Serving::Blocked { retry_at, cause } => format!(
                "{} ({cause}): serves again {}",
                p.state("blocked"),
                when(*retry_at, now, off)
            ),
            Serving::Unavailable { reason } => format!("{} ({reason})", p.paint(RED, "unavailable")),
        };
        let strategy = x
            .strategy
            .as_deref()
            .map_or_else(String::new, |s| format!(", new conversations: {s}"));
        let _ = writeln!(
            out,
            "  {:<7} {serving}  {}",
            x.provider.as_str(),
            p.paint(
                DIM,
                &format!(
                    "{} of {} accounts serving, {} enabled{strategy}",
                    x.serving_accounts, x.accounts, x.enabled
                )
            )
        );
    }

    out.push('\n');
    let _ = writeln!(out, "{}", p.paint(BOLD, "Accounts"));
    if o.accounts.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for a in &o.accounts {
        let mut line = format!(
            "  {:<7} {}  {}  {}",
            a.provider.as_str(),
            a.label,
            p.paint(DIM, &a.id),
            p.state(a.status.as_str())
        );
        if let Some(reset) = a.blocking_reset.or(a.held_until) {
            let _ = write!(line, "  serves again {}", when(reset, now, off));
        }
        match o.pinned_sessions.get(&a.id).copied().unwrap_or(0) {
            0 => {}
            1 => line.push_str("  1 pinned session"),
            n => {
                let _ = write!(line, "  {n} pinned sessions");
            }
        }
        let options = a.options.words();
        if !options.is_empty() {
            let _ = write!(line, "  {}", p.paint(DIM, &format!("[{}]", options.join(", "))));
        }
        let _ = writeln!(out, "{line}");
        if let Some(why) = why(a) {
            let _ = writeln!(out, "          why: {why}");
        }
        if let Some(t) = o.tokens.get(&a.id).filter(|t| !t.today.is_empty()) {
            for (name, span, counts) in [("tokens", "today", &t.today), ("", "last 5 h", &t.last_5h)] {
                let _ = writeln!(out, "          {name:<10} {span:<8} {}", tokens(counts));
            }
        }
        for w in &a.windows {
            let name = match &w.family {
                Some(family) => format!("{} ({family})", w.name),
                None => w.name.clone(),
            };
            let mut line = format!("          {name:<10}");
            match w.utilization {
                Some(u) => {
                    let _ = write!(line, " {} {:>3.0}%", bar(u), u * 100.0);
                }
                None => line.push_str(" usage unknown"),
            }
            if let Some(reset) = w.resets_at {
                let _ = write!(line, "  resets {}", when(reset, now, off));
            }
            if w.blocking {
                let _ = write!(line, "  {}", p.paint(RED, "blocking"));
            }
            let _ = writeln!(out, "{line}");
        }
    }

    out.push('\n');
    let _ = writeln!(out, "{}", p.paint(BOLD, "Threads"));
    if o.threads.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for t in &o.threads {
        let mut line = format!(
            "  {}  {} {}  {}",
            t.id,
            t.agent,
            t.provider.as_str(),
            p.state(&t.status)
        );
        if t.input_queued {
            line.push_str(" (message queued)");
        }
        if let Some(a) = &t.availability {
            let _ = write!(line, "  pool: {}", availability(a, now, off));
        }
        let _ = writeln!(out, "{line}");
        let send_at = t
            .row
            .as_ref()
            .map(|r| r.send_at)
            .or(t.retry.as_ref().and_then(|r| r.send_at));
        let attempt = t
            .row
            .as_ref()
            .map(|r| r.attempt)
            .or(t.retry.as_ref().map(|r| r.next_attempt));
        let reason = t
            .retry
            .as_ref()
            .map(|r| r.reason.clone())
            .or(t.row.as_ref().map(|r| r.reason.clone()));
        match (send_at, &t.retry) {
            (Some(at), _) => {
                let _ = write!(
                    out,
                    "          retry: attempt {} at {}",
                    attempt.unwrap_or(0),
                    when(at, now, off)
                );
                if t.row.as_ref().is_some_and(|r| r.waiting_for_slot) {
                    out.push_str(", waiting for a free slot");
                }
                match reason {
                    Some(reason) => {
                        let _ = writeln!(out, " — {reason}");
                    }
                    None => out.push('\n'),
                }
            }
            (None, Some(r)) => {
                let _ = writeln!(
                    out,
                    "          retry: {} until the pool can serve — {}",
                    p.state(r.state.as_str()),
                    r.reason
                );
            }
            (None, None) if t.retry_opt_out => {
                let _ = writeln!(out, "          retry: opted out");
            }
            (None, None) => {}
        }
    }

    if !o.problems.is_empty() {
        out.push('\n');
        let _ = writeln!(out, "{}", p.paint(RED, "Could not read"));
        for problem in &o.problems {
            let _ = writeln!(out, "  {}: {}", problem.part, problem.message);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operate::wire::overview::{
        Problem, ProviderOverview, RowOverview, ThreadOverview, summarize,
    };
    use crate::operate::wire::{
        AccountOptions, AccountStatus, AccountTokensView, BlockCause, CandidateState,
        CandidateView, CredentialKind,
        ProviderName, WindowView,
    };

    const NOW: u64 = 1_764_650_000_000; // 2025-12-02T04:33:20Z
    const MIN: u64 = 60_000;

    fn account(id: &str, label: &str, status: &str) -> AccountView {
        AccountView {
            id: id.into(),
            provider: ProviderName::Claude,
            kind: CredentialKind::ApiKey,
            label: label.into(),
            priority: 0,
            enabled: status != "disabled",
            status: AccountStatus::parse(status).expect("a status word"),
            secret_hint: "…abcd".into(),
            created_at: 0,
            last_used_at: None,
            error: None,
            held_until: None,
            needs_sign_in: false,
            token_expires_at: None,
            windows: Vec::new(),
            blocking_reset: None,
            options: AccountOptions::default(),
        }
    }

    fn snapshot() -> Overview {
        let mut held = account("acc_a", "Key A", "held");
        held.held_until = Some(NOW + 130 * MIN);
        held.blocking_reset = Some(NOW + 130 * MIN);
        held.windows = vec![WindowView {
            name: "5h".into(),
            family: None,
            utilization: Some(0.4),
            resets_at: Some(NOW + 27 * 60 * MIN),
            status: Some("allowed".into()),
            blocking: false,
            observed_at: NOW - MIN,
        }];
        let mut disabled = account("acc_b", "Key B", "disabled");
        disabled.options.last_resort = true;
        disabled.options.max_in_flight = 4;
        let accounts = vec![held, disabled];
        let providers: Vec<ProviderOverview> = [ProviderName::Claude, ProviderName::Codex]
            .into_iter()
            .map(|p| ProviderOverview {
                strategy: Some("spread".into()),
                ..summarize(p, &accounts)
            })
            .collect();
        Overview {
            now: NOW,
            providers,
            accounts,
            threads: vec![ThreadOverview {
                id: "th_1".into(),
                provider: ProviderName::Claude,
                model: Some("claude-test".into()),
                agent: "http".into(),
                status: "error".into(),
                retry_opt_out: false,
                input_queued: false,
                created_at: NOW - 5 * MIN,
                availability: Some(AvailabilityView::Blocked {
                    retry_at: NOW + 130 * MIN,
                    cause: BlockCause::Held,
                }),
                retry: Some(CandidateView {
                    thread: "th_1".into(),
                    original_request: "rq_1".into(),
                    failed_request: "rq_1".into(),
                    state: CandidateState::Scheduled,
                    row: Some(7),
                    send_at: Some(NOW + 130 * MIN + 20_000),
                    next_attempt: 2,
                    reason: "rate-limited".into(),
                    chain_started_at: NOW - 4 * MIN,
                }),
                row: Some(RowOverview {
                    id: 7,
                    send_at: NOW + 130 * MIN + 20_000,
                    attempt: 2,
                    reason: "rate-limited".into(),
                    waiting_for_slot: false,
                }),
            }],
            pinned_sessions: [("acc_a".to_owned(), 2)].into_iter().collect(),
            tokens: [(
                "acc_a".to_owned(),
                AccountTokensView {
                    today: TokenCountsView {
                        answers: 14,
                        input: 1_200,
                        output: 340,
                        cache_read: 98_000,
                        cache_write: 2_100,
                    },
                    last_5h: TokenCountsView {
                        answers: 1,
                        input: 10,
                        output: 5,
                        cache_read: 0,
                        cache_write: 30,
                    },
                },
            )]
            .into_iter()
            .collect(),
            tokens_today_since: NOW - 4 * 60 * MIN,
            problems: vec![],
        }
    }

    const PLAIN: Style = Style {
        colour: false,
        utc_offset_s: 0,
    };

    #[test]
    fn the_screen_shows_providers_accounts_and_threads_with_their_retries() {
        let golden = "\
Pooler at 04:33 (UTC+00:00; times are local)

Providers
  claude  blocked (held): serves again 06:43 (in 2 h 10 m)  0 of 2 accounts serving, 1 enabled, new conversations: spread

Accounts
  claude  Key A  acc_a  held  serves again 06:43 (in 2 h 10 m)  2 pinned sessions
          why: held after a rate limit (Retry-After)
          tokens     today    in 1.2k  out 340  cache read 98.0k  write 2.1k  (cache hit 97 %, 14 answers)
                     last 5 h in 10  out 5  cache read 0  write 30  (cache hit 0 %, 1 answer)
          5h         [########------------]  40%  resets 2025-12-03 07:33 (in 1 d 3 h)
  claude  Key B  acc_b  disabled  [last-resort, ≤ 4 in flight]
          why: disabled by a person

Threads
  th_1  http claude  error  pool: blocked (held) until 06:43 (in 2 h 10 m)
          retry: attempt 2 at 06:43 (in 2 h 10 m) — rate-limited
";
        assert_eq!(render(&snapshot(), NOW, PLAIN), golden);
    }

    #[test]
    fn times_are_local_and_colour_is_only_escape_codes() {
        let east = Style {
            colour: false,
            utc_offset_s: 3600 + 1800,
        };
        let text = render(&snapshot(), NOW, east);
        assert!(text.starts_with("Pooler at 06:03 (UTC+01:30;"), "{text}");
        assert!(text.contains("serves again 08:13 (in 2 h 10 m)"), "{text}");
        let west = render(
            &snapshot(),
            NOW,
            Style {
                colour: false,
                utc_offset_s: -5 * 3600,
            },
        );
        assert!(west.starts_with("Pooler at 23:33 (UTC-05:00;"), "{west}");

        let coloured = render(
            &snapshot(),
            NOW,
            Style {
                colour: true,
                utc_offset_s: 0,
            },
        );
        assert!(coloured.contains(&format!("{YELLOW}held{RESET}")), "{coloured}");
        assert!(coloured.contains(&format!("{RED}disabled{RESET}")));
        let stripped = coloured
            .split('\x1b')
            .enumerate()
            .map(|(i, part)| {
                if i == 0 {
                    part
                } else {
                    part.split_once('m').map_or("", |(_, rest)| rest)
                }
            })
            .collect::<String>();
        assert_eq!(stripped, render(&snapshot(), NOW, PLAIN));
    }

    #[test]
    fn watches_opt_outs_problems_and_an_empty_pool_are_said_in_words() {
        let mut o = snapshot();
        let thread = &mut o.threads[0];
        thread.row = None;
        let retry = thread.retry.as_mut().unwrap();
        retry.state = CandidateState::Watching;
        retry.send_at = None;
        retry.reason = "pool-unavailable(authentication)".into();
        o.problems.push(Problem {
            part: "retries".into(),
            message: "the retry plugin's database failed".into(),
        });
        let text = render(&o, NOW, PLAIN);
        assert!(
            text.contains(
                "retry: watching until the pool can serve — pool-unavailable(authentication)"
            ),
            "{text}"
        );
        assert!(
            text.ends_with(
                "Could not read\n  retries: the retry plugin's database failed\n"
            ),
            "{text}"
        );
        o.threads[0].retry = None;
        o.threads[0].retry_opt_out = true;
        assert!(render(&o, NOW, PLAIN).contains("retry: opted out"));

        let empty = Overview {
            now: NOW,
            providers: vec![summarize(ProviderName::Claude, &[])],
            accounts: vec![],
            threads: vec![],
            pinned_sessions: Default::default(),
            tokens: Default::default(),
            tokens_today_since: 0,
            problems: vec![],
        };
        let text = render(&empty, NOW, PLAIN);
        assert!(text.contains("no accounts (add one with `pooler account add`)"), "{text}");
        assert!(text.contains("Threads\n  none\n"), "{text}");
    }

    #[test]
    fn relative_times_and_bars() {
        assert_eq!(relative(NOW, NOW), "now");
        assert_eq!(relative(NOW + 42_000, NOW), "in 42 s");
        assert_eq!(relative(NOW + 130 * MIN, NOW), "in 2 h 10 m");
        assert_eq!(relative(NOW + 120 * MIN, NOW), "in 2 h");
        assert_eq!(relative(NOW - 5 * MIN, NOW), "5 m ago");
        assert_eq!(relative(NOW + 49 * 60 * MIN, NOW), "in 2 d 1 h");
        assert_eq!(bar(0.0), format!("[{}]", "-".repeat(20)));
        assert_eq!(bar(1.7), format!("[{}]", "#".repeat(20)));
        assert_eq!(bar(0.5), format!("[{}{}]", "#".repeat(10), "-".repeat(10)));
    }

    mod properties {
        //! The times a plugin answers (a hold, a reset, a row's send time) may be any
        //! `u64`: rendering them never panics.
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn any_time_renders(ms in any::<u64>(), now in any::<u64>(), offset_s in -50_400i32..=50_400) {
                let text = when(ms, now, offset_s);
                prop_assert!(!text.is_empty());
                prop_assert!(!crate::cli::explain::date_time(ms).is_empty());
                prop_assert!(!crate::cli::format::when(ms, now).is_empty());
            }
        }
    }
}
