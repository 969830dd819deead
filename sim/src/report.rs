//! The figures of a run, and how they are shown: a table (variants side by side), a JSON
//! document, and one self-contained HTML page with a timeline per account and per thread.
//!
//! Everything under `figures` repeats byte for byte for the same scenario and seed; the
//! `speed` of a run is the machine's.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use serde::Serialize;

use crate::ledger::Activity;
use crate::model::AttemptEnd;
use crate::pins::Served;
use crate::run::Recorded;
use crate::scenario::{HOUR, MINUTE, Scenario};

/// Percentiles of a set of durations, in seconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    pub count: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Spread {
    fn of(mut ms: Vec<u64>) -> Spread {
        ms.sort_unstable();
        let at = |q: f64| -> f64 {
            if ms.is_empty() {
                return 0.0;
            }
            let rank = ((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len());
            ms[rank - 1] as f64 / 1000.0
        };
        Spread {
            count: ms.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: ms.last().map_or(0.0, |m| *m as f64 / 1000.0),
        }
    }
}

/// A weekly window that ended with quota left.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Expired {
    pub account: String,
    pub at_hour: f64,
    /// Share of the week's capacity that expired unused.
    pub unused: f64,
    /// Some thread waited during the 5 hours before the reset.
    pub work_was_waiting: bool,
}

/// A stretch of a thread's time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stretch {
    pub thread: usize,
    /// Hours after the start.
    pub from_hour: f64,
    pub minutes: f64,
}

/// The figures of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    pub variant: String,
    pub turns_demanded: u32,
    pub turns_completed: u32,
    pub requests_served: u64,
    pub tokens_served: u64,
    /// What the served requests cost, in the plans' units (what the windows count).
    pub units_served: f64,
    /// Share of input tokens read from a prompt cache.
    pub cache_read_share: f64,
    pub working_thread_hours: f64,
    /// Waiting while some enabled account could have served: the pool's fault.
    pub waiting_with_capacity_thread_hours: f64,
    /// Waiting with no capacity anywhere: nobody's fault.
    pub waiting_without_capacity_thread_hours: f64,
    /// From capacity coming back to the waiting thread's next turn.
    pub resume_delay_s: Spread,
    /// The person's actions, by kind.
    pub person_actions: BTreeMap<String, u32>,
    /// Actions threads needed to resume (reserve enabled, messages sent again; sign-ins
    /// after a lost login count too: no pool can avoid them).
    pub person_actions_needed: u32,
    pub conversations: usize,
    /// Served requests on the conversation's pinned account.
    pub home_share: f64,
    pub detours: usize,
    pub repins: usize,
    pub repins_per_conversation: f64,
    /// The most conversations re-pinned onto one account within one minute.
    pub herd: usize,
    /// When that minute began (hours into the run), to look there first.
    pub herd_at_hour: f64,
    pub refused_429: u64,
    pub refused_529: u64,
    pub errors_5xx: u64,
    pub dropped: u64,
    /// 429 and 529 per 1,000 served requests.
    pub refused_per_1000_served: f64,
    pub failed_turn_chains: usize,
    /// Turns the core stopped at the agent's time limit (`[agents] turn-time-limit-s`).
    pub turns_cut_at_time_limit: u32,
    pub retries_per_failed_turn_mean: f64,
    pub retries_per_failed_turn_max: u32,
    pub attempt_cap: u32,
    /// Weekly quota that expired unused, summed over resets, in accounts' weeks.
    pub weekly_expired_unused: f64,
    /// The same, counting only resets with work waiting in the 5 hours before.
    pub weekly_expired_unused_while_waiting: f64,
    pub weekly_expiries: Vec<Expired>,
    /// Weekly quota unused at the run's end, in accounts' weeks: with what expired and what
    /// was served, it accounts for every account's quota, so a variant that expires less
    /// only by leaving more unspent at the end shows it here.
    pub weekly_left_at_end: f64,
    /// The longest stretches of waiting while capacity existed (at most ten), where to look
    /// first for what the pool did wrong.
    pub longest_waits_with_capacity: Vec<Stretch>,
    pub token_refreshes: u64,
    pub token_refreshes_refused: u64,
}

/// How fast the run went (the machine's, not the scenario's).
#[derive(Debug, Clone, Serialize)]
pub struct Speed {
    pub variant: String,
    pub wall_s: f64,
    pub cpu_s: f64,
    pub requests: u64,
    pub requests_per_s: f64,
    pub simulated_hours: f64,
}

pub fn figures(r: &Recorded) -> Figures {
    // A turn can run faster than the ideal timeline's mean (its time to first token is
    // drawn), so a thread may finish a task the ideal run would have started after the end:
    // that task was demanded too.
    let demanded = r
        .plans
        .iter()
        .zip(&r.ledger.threads)
        .map(|(p, t)| {
            let ideal = p.tasks.iter().filter(|x| x.ideal_start < r.end).count() as u32;
            ideal.max(t.tasks_done)
        })
        .sum();
    let completed = r.ledger.threads.iter().map(|t| t.tasks_done).sum();
    let h = |ms: u64| ms as f64 / HOUR as f64;
    let served: Vec<_> = r
        .attempts
        .iter()
        .filter(|a| a.end == AttemptEnd::Served)
        .collect();
    let count = |end: AttemptEnd| r.attempts.iter().filter(|a| a.end == end).count() as u64;
    let (read, input): (u64, u64) = served.iter().fold((0, 0), |(read, input), a| {
        (read + a.cache_read, input + a.cache_read + a.cache_write)
    });
    let home = r.pins.iter().filter(|p| p.1 == Served::Home).count();
    let detours = r.pins.iter().filter(|p| p.1 == Served::Detour).count();
    let repins: Vec<_> = r.pins.iter().filter(|p| p.1 == Served::Repin).collect();
    let conversations = r
        .pins
        .iter()
        .map(|p| p.2.as_str())
        .collect::<HashSet<_>>()
        .len();
    let (mut herd, mut herd_at) = (0, r.start);
    for (i, (t, ..)) in repins.iter().enumerate() {
        let account = repins[i].3;
        let within = repins
            .iter()
            .filter(|p| p.3 == account && p.0 >= *t && p.0 < t + MINUTE)
            .count();
        if within > herd {
            (herd, herd_at) = (within, *t);
        }
    }
    let refused = count(AttemptEnd::RateLimited) + count(AttemptEnd::Overloaded);
    let waiting_in = |from: u64, to: u64| {
        r.ledger.threads.iter().any(|t| {
            t.segments
                .iter()
                .any(|(a, b, what)| *what != Activity::Working && *a < to && *b > from)
        })
    };
    let expiries: Vec<Expired> = r
        .expiries
        .iter()
        .filter(|e| e.at > r.start && e.unused > 0.0)
        .map(|e| Expired {
            account: r.account_names[e.account].clone(),
            at_hour: round((e.at - r.start) as f64 / HOUR as f64, 2),
            unused: round(e.unused, 4),
            work_was_waiting: waiting_in(e.at.saturating_sub(5 * HOUR), e.at),
        })
        .collect();
    let needed = r
        .ledger
        .actions
        .iter()
        .filter(|(a, _)| {
            !matches!(
                a,
                crate::ledger::Action::DisableReserve | crate::ledger::Action::Scripted
            )
        })
        .map(|(_, n)| *n)
        .sum();
    let retries = &r.retries_per_failed_turn;
    let mut stretches: Vec<Stretch> = r
        .ledger
        .threads
        .iter()
        .enumerate()
        .flat_map(|(i, t)| {
            t.segments
                .iter()
                .filter(|(_, _, a)| *a == Activity::WaitingWithCapacity)
                .map(move |(from, to, _)| Stretch {
                    thread: i + 1,
                    from_hour: round((from - r.start) as f64 / HOUR as f64, 3),
                    minutes: round((to - from) as f64 / MINUTE as f64, 2),
                })
        })
        .collect();
    stretches.sort_by(|a, b| {
        b.minutes
            .total_cmp(&a.minutes)
            .then(a.thread.cmp(&b.thread))
    });
    stretches.truncate(10);
    Figures {
        variant: r.variant.clone(),
        turns_demanded: demanded,
        turns_completed: completed,
        requests_served: served.len() as u64,
        tokens_served: served.iter().map(|a| a.tokens).sum(),
        units_served: round(served.iter().fold(0.0, |sum, a| sum + a.units), 1),
        cache_read_share: round(
            if input == 0 {
                0.0
            } else {
                read as f64 / input as f64
            },
            4,
        ),
        working_thread_hours: round(h(r.ledger.threads.iter().map(|t| t.working_ms).sum()), 3),
        waiting_with_capacity_thread_hours: round(
            h(r.ledger.threads.iter().map(|t| t.waiting_with_ms).sum()),
            3,
        ),
        waiting_without_capacity_thread_hours: round(
            h(r.ledger.threads.iter().map(|t| t.waiting_without_ms).sum()),
            3,
        ),
        resume_delay_s: Spread::of(r.ledger.resume_delays.clone()),
        person_actions: r
            .ledger
            .actions
            .iter()
            .map(|(a, n)| (a.name().to_owned(), *n))
            .collect(),
        person_actions_needed: needed,
        conversations,
        home_share: round(
            if r.pins.is_empty() {
                1.0
            } else {
                home as f64 / r.pins.len() as f64
            },
            4,
        ),
        detours,
        repins: repins.len(),
        repins_per_conversation: round(
            if conversations == 0 {
                0.0
            } else {
                repins.len() as f64 / conversations as f64
            },
            3,
        ),
        herd,
        herd_at_hour: round(h(herd_at.saturating_sub(r.start)), 3),
        refused_429: count(AttemptEnd::RateLimited),
        refused_529: count(AttemptEnd::Overloaded),
        errors_5xx: count(AttemptEnd::Error),
        dropped: count(AttemptEnd::Dropped),
        refused_per_1000_served: round(
            if served.is_empty() {
                0.0
            } else {
                1000.0 * refused as f64 / served.len() as f64
            },
            2,
        ),
        failed_turn_chains: retries.len(),
        turns_cut_at_time_limit: r.ledger.threads.iter().map(|t| t.turns_cut).sum(),
        retries_per_failed_turn_mean: round(
            if retries.is_empty() {
                0.0
            } else {
                retries.iter().sum::<u32>() as f64 / retries.len() as f64
            },
            3,
        ),
        retries_per_failed_turn_max: retries.iter().copied().max().unwrap_or(0),
        attempt_cap: r.attempt_cap,
        // Folded from +0.0: an empty f64 sum is -0.0, which prints as "-0.00".
        weekly_expired_unused: round(expiries.iter().fold(0.0, |sum, e| sum + e.unused), 4),
        weekly_expired_unused_while_waiting: round(
            expiries
                .iter()
                .filter(|e| e.work_was_waiting)
                .fold(0.0, |sum, e| sum + e.unused),
            4,
        ),
        weekly_expiries: expiries,
        weekly_left_at_end: round(r.weekly_left_at_end, 4),
        longest_waits_with_capacity: stretches,
        token_refreshes: r.refreshes.0,
        token_refreshes_refused: r.refreshes.1,
    }
}

pub fn speed(r: &Recorded) -> Speed {
    let wall = r.wall.as_secs_f64();
    Speed {
        variant: r.variant.clone(),
        wall_s: round(wall, 2),
        cpu_s: round(r.cpu.as_secs_f64(), 2),
        requests: r.requests,
        requests_per_s: round(
            if wall > 0.0 {
                r.requests as f64 / wall
            } else {
                0.0
            },
            1,
        ),
        simulated_hours: round((r.end - r.start) as f64 / HOUR as f64, 2),
    }
}

fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

/// The rows of the table: (label, value of each variant).
fn rows(all: &[Figures]) -> Vec<(String, Vec<String>)> {
    let row = |label: &str, f: &dyn Fn(&Figures) -> String| {
        (label.to_owned(), all.iter().map(f).collect())
    };
    vec![
        row("turns completed / demanded", &|f| {
            format!("{} / {}", f.turns_completed, f.turns_demanded)
        }),
        row("requests served (units)", &|f| {
            format!("{} ({:.0}k)", f.requests_served, f.units_served / 1000.0)
        }),
        row("tokens served (M)", &|f| {
            format!("{:.1}", f.tokens_served as f64 / 1e6)
        }),
        row("prompt-cache read share", &|f| {
            format!("{:.1} %", 100.0 * f.cache_read_share)
        }),
        row("thread-h working", &|f| {
            format!("{:.1}", f.working_thread_hours)
        }),
        row("thread-h waiting, capacity existed (pool's fault)", &|f| {
            format!("{:.2}", f.waiting_with_capacity_thread_hours)
        }),
        row("thread-h waiting, no capacity anywhere", &|f| {
            format!("{:.1}", f.waiting_without_capacity_thread_hours)
        }),
        row("resume delay p50 / p99 / max (s)", &|f| {
            let s = &f.resume_delay_s;
            format!("{:.0} / {:.0} / {:.0} (n={})", s.p50, s.p99, s.max, s.count)
        }),
        row("person's actions needed", &|f| {
            let kinds: Vec<String> = f
                .person_actions
                .iter()
                .filter(|(k, _)| k.as_str() != "reserve-disabled" && k.as_str() != "scripted")
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            if kinds.is_empty() {
                "0".into()
            } else {
                format!("{} ({})", f.person_actions_needed, kinds.join(", "))
            }
        }),
        row("served on the home account", &|f| {
            format!("{:.2} %", 100.0 * f.home_share)
        }),
        row("re-pins per conversation (detours)", &|f| {
            format!("{:.2} ({})", f.repins_per_conversation, f.detours)
        }),
        row("herd: most re-pins onto one account in a minute", &|f| {
            f.herd.to_string()
        }),
        row("429 + 529 per 1,000 served", &|f| {
            format!(
                "{:.1} ({} + {})",
                f.refused_per_1000_served, f.refused_429, f.refused_529
            )
        }),
        row("turns cut at the agent's time limit", &|f| {
            f.turns_cut_at_time_limit.to_string()
        }),
        row("retries per failed turn, mean / max (cap)", &|f| {
            format!(
                "{:.2} / {} ({})",
                f.retries_per_failed_turn_mean,
                f.retries_per_failed_turn_max,
                f.attempt_cap.saturating_sub(1)
            )
        }),
        row("weekly quota expired unused (while work waited)", &|f| {
            format!(
                "{:.2} ({:.2}) weeks",
                f.weekly_expired_unused, f.weekly_expired_unused_while_waiting
            )
        }),
        row("weekly quota left at the end", &|f| {
            format!("{:.2} weeks", f.weekly_left_at_end)
        }),
        row("token refreshes (refused)", &|f| {
            format!("{} ({})", f.token_refreshes, f.token_refreshes_refused)
        }),
    ]
}

/// The table: one column per variant.
pub fn table(scenario: &Scenario, all: &[Figures], speeds: &[Speed]) -> String {
    let mut rows = rows(all);
    rows.push((
        "simulator wall / CPU (s), requests/s".into(),
        speeds
            .iter()
            .map(|s| format!("{:.1} / {:.1}, {:.0}", s.wall_s, s.cpu_s, s.requests_per_s))
            .collect(),
    ));
    let head: Vec<String> = all.iter().map(|f| f.variant.clone()).collect();
    let label_w = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..head.len())
        .map(|i| {
            rows.iter()
                .map(|(_, v)| v[i].chars().count())
                .chain([head[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = format!(
        "{} — seed {}, {} days\n",
        scenario.name, scenario.seed, scenario.days
    );
    let _ = write!(out, "| {:label_w$} |", "");
    for (h, w) in head.iter().zip(&widths) {
        let _ = write!(out, " {h:>w$} |");
    }
    out.push('\n');
    let _ = write!(out, "|{}|", "-".repeat(label_w + 2));
    for w in &widths {
        let _ = write!(out, "{}:|", "-".repeat(w + 1));
    }
    out.push('\n');
    for (label, values) in rows {
        let _ = write!(out, "| {label:label_w$} |");
        for (v, w) in values.iter().zip(&widths) {
            let _ = write!(out, " {v:>w$} |");
        }
        out.push('\n');
    }
    out
}

/// The JSON document of a comparison.
pub fn json(scenario: &Scenario, all: &[Figures], speeds: &[Speed]) -> serde_json::Value {
    serde_json::json!({
        "scenario": scenario.name,
        "seed": scenario.seed,
        "days": scenario.days,
        "figures": all,
        "speed": speeds,
    })
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const WIDTH: f64 = 1100.0;
const LANE: f64 = 34.0;
const LABEL: f64 = 110.0;

/// One self-contained page: the table, then per variant a timeline per account and per
/// thread.
pub fn html(scenario: &Scenario, all: &[Figures], runs: &[Recorded]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{name} — pooler week simulator</title>\
         <style>body{{font:14px system-ui,sans-serif;margin:24px;color:#222}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}td:first-child,th:first-child{{text-align:left}}\
         h2{{margin-top:32px}}.legend span{{display:inline-block;margin-right:14px}}.sw{{display:inline-block;width:12px;height:12px;vertical-align:middle;margin-right:4px}}\
         svg text{{font:11px system-ui,sans-serif}}</style></head><body>\
         <h1>{name}</h1><p>{desc}</p><p>seed {seed}, {days} days. Utilization lines are the provider's true values; \
         bands are the pool's own view of each account, looked at every 10 minutes.</p>",
        name = escape(&scenario.name),
        desc = escape(&scenario.description),
        seed = scenario.seed,
        days = scenario.days,
    );
    out.push_str("<table><tr><th></th>");
    for f in all {
        let _ = write!(out, "<th>{}</th>", escape(&f.variant));
    }
    out.push_str("</tr>");
    for (label, values) in rows(all) {
        let _ = write!(out, "<tr><td>{}</td>", escape(&label));
        for v in values {
            let _ = write!(out, "<td>{}</td>", escape(&v));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out.push_str(
        "<p class=\"legend\"><span><i class=\"sw\" style=\"background:#e8710a\"></i>5-hour utilization</span>\
         <span><i class=\"sw\" style=\"background:#1a73e8\"></i>weekly utilization</span>\
         <span><i class=\"sw\" style=\"background:#fbe3a6\"></i>held</span>\
         <span><i class=\"sw\" style=\"background:#f5c2c0\"></i>exhausted</span>\
         <span><i class=\"sw\" style=\"background:#8a1c1c\"></i>error</span>\
         <span><i class=\"sw\" style=\"background:#ddd\"></i>disabled</span>\
         <span><i class=\"sw\" style=\"background:#d93025\"></i>429/529 refused</span>\
         <span><i class=\"sw\" style=\"background:#34a853\"></i>thread working</span>\
         <span><i class=\"sw\" style=\"background:#ea4335\"></i>waiting while capacity existed</span>\
         <span><i class=\"sw\" style=\"background:#9aa0a6\"></i>waiting, no capacity</span></p>",
    );
    for r in runs {
        let _ = write!(out, "<h2>{}</h2>", escape(&r.variant));
        out.push_str(&timeline(r));
    }
    out.push_str("</body></html>\n");
    out
}

/// Where instant `t` of run `r` is drawn on its timeline (pixels from the left).
pub fn x_of(r: &Recorded, t: u64) -> f64 {
    let span = (r.end - r.start).max(1) as f64;
    LABEL + (WIDTH - LABEL) * (t.saturating_sub(r.start) as f64 / span).min(1.0)
}

fn timeline(r: &Recorded) -> String {
    let x = |t: u64| x_of(r, t);
    let lanes = r.account_names.len() + r.ledger.threads.len();
    let height = 24.0 + LANE * lanes as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" role=\"img\" \
         aria-label=\"timeline of {}\">",
        escape(&r.variant)
    );
    // Day lines.
    let mut day = r.start;
    while day <= r.end {
        let _ = write!(
            s,
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"14\" y2=\"{height}\" stroke=\"#eee\"/>\
             <text x=\"{1:.1}\" y=\"11\">day {2}</text>",
            x(day),
            x(day) + 2.0,
            (day - r.start) / (24 * HOUR) + 1
        );
        day += 24 * HOUR;
    }
    for (i, name) in r.account_names.iter().enumerate() {
        let top = 20.0 + LANE * i as f64;
        let _ = write!(
            s,
            "<g class=\"lane\" data-lane=\"{0}\"><text x=\"0\" y=\"{1:.1}\">{0}</text>",
            escape(name),
            top + 18.0
        );
        // The pool's view, as bands.
        let statuses = &r.statuses[i];
        for (j, (from, status)) in statuses.iter().enumerate() {
            let to = statuses.get(j + 1).map_or(r.end, |(t, _)| *t);
            let fill = match status.as_str() {
                "held" => "#fbe3a6",
                "exhausted" => "#f5c2c0",
                "error" => "#8a1c1c",
                "disabled" => "#ddd",
                _ => continue,
            };
            let _ = write!(
                s,
                "<rect x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{fill}\"><title>{status}</title></rect>",
                x(*from),
                (x(to) - x(*from)).max(0.5),
                LANE - 6.0
            );
        }
        // Utilization as steps (a value holds until the next sample), at most one point per
        // pixel.
        for (pick, color) in [(0, "#e8710a"), (1, "#1a73e8")] {
            let mut points = String::new();
            let mut last: Option<(f64, f64)> = None;
            for sample in &r.samples[i] {
                let px = x(sample.at);
                let u = if pick == 0 {
                    sample.five_hour
                } else {
                    sample.weekly
                } as f64;
                let py = top + (LANE - 6.0) * (1.0 - u.clamp(0.0, 1.0));
                match last {
                    Some((lx, ly)) if px - lx < 1.0 => {
                        // Same pixel column: keep the latest value.
                        if (py - ly).abs() > f64::EPSILON {
                            let _ = write!(points, "{px:.1},{py:.1} ");
                            last = Some((lx, py));
                        }
                        continue;
                    }
                    Some((_, ly)) => {
                        let _ = write!(points, "{px:.1},{ly:.1} ");
                    }
                    None => {}
                }
                let _ = write!(points, "{px:.1},{py:.1} ");
                last = Some((px, py));
            }
            let _ = write!(
                s,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.2\" points=\"{points}\"/>"
            );
        }
        // Refusals, one tick per pixel column.
        let mut seen = HashSet::new();
        for a in r.attempts.iter().filter(|a| {
            a.account == i && matches!(a.end, AttemptEnd::RateLimited | AttemptEnd::Overloaded)
        }) {
            let px = x(a.at).round() as i64;
            if seen.insert(px) {
                let _ = write!(
                    s,
                    "<line x1=\"{px}\" x2=\"{px}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#d93025\"/>",
                    top + LANE - 9.0,
                    top + LANE - 5.0
                );
            }
        }
        s.push_str("</g>");
    }
    for (i, t) in r.ledger.threads.iter().enumerate() {
        let top = 20.0 + LANE * (r.account_names.len() + i) as f64;
        let _ = write!(
            s,
            "<g class=\"lane\" data-lane=\"thread {1}\"><text x=\"0\" y=\"{0:.1}\">thread {1} ({2})</text>",
            top + 18.0,
            i + 1,
            escape(&t.family)
        );
        for (from, to, what) in &t.segments {
            let fill = match what {
                Activity::Working => "#34a853",
                Activity::WaitingWithCapacity => "#ea4335",
                Activity::WaitingWithout => "#9aa0a6",
            };
            let _ = write!(
                s,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{:.1}\" fill=\"{fill}\"/>",
                x(*from),
                top + 6.0,
                (x(*to) - x(*from)).max(0.3),
                LANE - 16.0
            );
        }
        s.push_str("</g>");
    }
    s.push_str("</svg>");
    s
}
