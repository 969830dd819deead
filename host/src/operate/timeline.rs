//! The threads' waiting periods the status page's quota timeline draws beneath the
//! accounts' charts, from a thread's turns.

use pooler_core::{TurnOutcomeKind, TurnRecord};

/// The periods a thread waited, oldest first, that end at or after `since`: each runs from
/// a failed turn's end to the start of the next turn, or stays open (`None`) when no turn
/// followed yet.
pub fn waiting_periods(turns: &[TurnRecord], since: u64) -> Vec<(u64, Option<u64>)> {
    let mut periods = Vec::new();
    for (i, turn) in turns.iter().enumerate() {
        if turn.outcome != Some(TurnOutcomeKind::Failed) {
            continue;
        }
        let Some(from) = turn.finished_at else {
            continue;
        };
        let until = turns
            .get(i + 1)
            .map(|t| t.started_at.unwrap_or(t.created_at));
        if until.is_none_or(|u| u >= since) {
            periods.push((from, until));
        }
    }
    periods
}

#[cfg(test)]
mod tests {
    use super::*;
    use pooler_core::TurnTrigger;

    fn turn(created: u64, finished: Option<u64>, outcome: Option<TurnOutcomeKind>) -> TurnRecord {
        TurnRecord {
            id: format!("r{created}"),
            input: String::new(),
            trigger: TurnTrigger::User,
            original_request: format!("r{created}"),
            attempt: 1,
            created_at: created,
            started_at: Some(created + 1),
            finished_at: finished,
            outcome,
            reply: None,
            input_accepted: true,
            failure: None,
        }
    }

    #[test]
    fn a_wait_runs_from_a_failed_turn_to_the_next_turn_or_stays_open() {
        let ok = Some(TurnOutcomeKind::Ok);
        let failed = Some(TurnOutcomeKind::Failed);
        let turns = [
            turn(100, Some(150), ok),
            turn(200, Some(250), failed),
            turn(400, Some(450), failed),
            turn(600, Some(650), failed),
        ];
        assert_eq!(
            waiting_periods(&turns, 0),
            [(250, Some(401)), (450, Some(601)), (650, None)]
        );
        // Only the periods that reach `since`.
        assert_eq!(
            waiting_periods(&turns, 500),
            [(450, Some(601)), (650, None)]
        );
        assert!(waiting_periods(&turns[..1], 0).is_empty());
    }
}
