//! The work: for each thread, the tasks its person gives it and the requests each task's
//! turn sends. A task is a person's message followed by a turn of tool loops — requests
//! whose context grows as the conversation does, with tool time between them, sometimes
//! fanning out to subagents that send in parallel on the same session id, as Claude Code
//! does. Everything is drawn up front from the thread's own random stream, so every
//! variant of a comparison gets the same work, whatever the pool does with it.
//!
//! Each task also has an **ideal** start: when the person would have sent it had nothing
//! ever waited (the previous task's ideal end plus the person's think time, inside the
//! person's working hours). A task is *demanded* when its ideal start falls inside the run.

use crate::model::family_of;
use crate::rng::Rng;
use crate::scenario::{DAY, HOUR, ProviderName, Scenario, ThreadGroup};

/// One request of a turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Req {
    /// Its number in the thread (a retry of it sends the same number).
    pub n: u64,
    pub context: u64,
    pub output: u64,
    /// The prompt-cache prefix it extends: `main` or a subagent's `sub<N>`.
    pub cache_key: String,
    /// Tool time after its answer, before the next request.
    pub tool_ms: u64,
}

/// One step of a turn: a request of the main loop, or subagents in parallel (each a chain
/// of requests); the step ends when every chain has.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    One(Req),
    FanOut(Vec<Vec<Req>>),
}

/// A task: the person's think time before it, and its turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub gap_ms: u64,
    pub steps: Vec<Step>,
    /// When the person would have sent it had nothing waited.
    pub ideal_start: u64,
    pub ideal_end: u64,
}

/// A thread's whole plan.
#[derive(Debug, Clone)]
pub struct ThreadPlan {
    pub index: u32,
    pub provider: ProviderName,
    pub model: String,
    pub family: String,
    pub active_hours: [u32; 2],
    /// When the person sends the first task (at the earliest).
    pub first_at: u64,
    pub tasks: Vec<Task>,
}

/// The earliest instant at or after `t` inside `hours` of a day (UTC of the virtual clock).
pub fn next_active(t: u64, [from, to]: [u32; 2]) -> u64 {
    let day = t - t % DAY;
    let hour = (t - day) / HOUR;
    if hour >= u64::from(from) && hour < u64::from(to) {
        t
    } else if hour < u64::from(from) {
        day + u64::from(from) * HOUR
    } else {
        day + DAY + u64::from(from) * HOUR
    }
}

/// Every thread's plan for `scenario`, long enough to cover the run.
pub fn plan(scenario: &Scenario) -> Vec<ThreadPlan> {
    let root = Rng::new(scenario.seed);
    let end = scenario.start_ms + scenario.length_ms();
    let p = &scenario.provider;
    let mean_ttft = (p.ttft_ms[0] + p.ttft_ms[1]) / 2.0;
    let mut plans = Vec::new();
    for group in &scenario.threads {
        let models: Vec<&String> = group
            .models
            .iter()
            .flat_map(|(model, n)| std::iter::repeat_n(model, *n as usize))
            .collect();
        for (i, model) in models.into_iter().enumerate() {
            let index = plans.len() as u32;
            let mut rng = root.fork(u64::from(index));
            let first_at = next_active(
                scenario.start_ms + (group.start_stagger_min * i as f64 * 60_000.0) as u64,
                group.active_hours,
            );
            let mut tasks = Vec::new();
            let mut context = group.context_start;
            let mut n = 0;
            let mut subagents = 0;
            let mut ideal = first_at;
            while ideal < end {
                let gap_ms = if tasks.is_empty() {
                    0
                } else {
                    (rng.uniform(group.task_gap_min) * 60_000.0) as u64
                };
                let steps = turn(group, &mut rng, &mut context, &mut n, &mut subagents);
                let ideal_start = next_active(ideal + gap_ms, group.active_hours);
                let ideal_end = ideal_start + duration(&steps, mean_ttft, p.tokens_per_s);
                tasks.push(Task {
                    gap_ms,
                    steps,
                    ideal_start,
                    ideal_end,
                });
                ideal = ideal_end;
            }
            plans.push(ThreadPlan {
                index,
                provider: group.provider,
                family: family_of(model),
                model: model.clone(),
                active_hours: group.active_hours,
                first_at,
                tasks,
            });
        }
    }
    plans
}

fn turn(
    group: &ThreadGroup,
    rng: &mut Rng,
    context: &mut u64,
    n: &mut u64,
    subagents: &mut u64,
) -> Vec<Step> {
    let mut req = |rng: &mut Rng, context: u64, key: String| {
        *n += 1;
        Req {
            n: *n,
            context,
            output: rng.between(group.output_tokens),
            cache_key: key,
            tool_ms: (rng.uniform(group.tool_s) * 1000.0) as u64,
        }
    };
    let mut steps = Vec::new();
    for _ in 0..rng.between(group.steps).max(1) {
        if rng.chance(group.fan_out_chance) {
            let chains = (0..rng.between(group.fan_out).max(1))
                .map(|_| {
                    *subagents += 1;
                    let key = format!("sub{subagents}");
                    let mut sub_context = group.context_start / 2;
                    (0..rng.between(group.subagent_steps).max(1))
                        .map(|_| {
                            let r = req(rng, sub_context, key.clone());
                            sub_context += rng.between(group.context_growth) + r.output;
                            r
                        })
                        .collect()
                })
                .collect();
            steps.push(Step::FanOut(chains));
        } else {
            let r = req(rng, *context, "main".into());
            *context += rng.between(group.context_growth) + r.output;
            if *context > group.context_max {
                *context = group.context_start;
            }
            steps.push(Step::One(r));
        }
    }
    steps
}

/// How long `steps` take when nothing waits: each request's time to first token, its
/// streaming and the tool time after it; a fan-out takes its longest chain.
fn duration(steps: &[Step], mean_ttft_ms: f64, tokens_per_s: f64) -> u64 {
    let req = |r: &Req| {
        mean_ttft_ms as u64 + (r.output as f64 / tokens_per_s.max(1.0) * 1000.0) as u64 + r.tool_ms
    };
    steps
        .iter()
        .map(|s| match s {
            Step::One(r) => req(r),
            Step::FanOut(chains) => chains
                .iter()
                .map(|c| c.iter().map(req).sum::<u64>())
                .max()
                .unwrap_or(0),
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn working_hours_push_a_time_to_the_next_opening() {
        let day = 10 * DAY;
        assert_eq!(next_active(day + 9 * HOUR, [8, 24]), day + 9 * HOUR);
        assert_eq!(next_active(day + 3 * HOUR, [8, 24]), day + 8 * HOUR);
        assert_eq!(next_active(day + 23 * HOUR, [8, 23]), day + DAY + 8 * HOUR);
        assert_eq!(next_active(day, [0, 24]), day);
    }
}
