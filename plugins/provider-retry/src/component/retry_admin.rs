//! The `retry-admin` export: status, explain, cancel and a row a person sent, each run by
//! the engine, and the conversions of their answers and errors to WIT.

use super::bindings::exports::pooler::plugins::retry_admin as admin;
use super::{Component, with_engine};
use crate::types::{Action, AdminError, Candidate, CandidateState, HistoryEntry, Trigger};
use pooler_plugin_kit::component::types as wit;

fn to_wit_admin_error(e: AdminError) -> admin::AdminError {
    match e {
        AdminError::UnknownThread(t) => admin::AdminError::UnknownThread(t),
        AdminError::NothingPending(t) => admin::AdminError::NothingPending(t),
        AdminError::Dependency(m) => admin::AdminError::Dependency(m),
        AdminError::Storage(m) => admin::AdminError::Storage(m),
    }
}

fn to_wit_candidate(c: Candidate) -> admin::Candidate {
    admin::Candidate {
        thread: c.thread,
        original_request: c.original_request,
        failed_request: c.failed_request,
        state: match c.state {
            CandidateState::Scheduled => admin::CandidateState::Scheduled,
            CandidateState::Watching => admin::CandidateState::Watching,
        },
        row: c.row,
        send_at: c.send_at,
        next_attempt: c.next_attempt,
        reason: c.reason,
        chain_started_at: c.chain_started_at,
    }
}

fn to_wit_entry(e: HistoryEntry) -> admin::HistoryEntry {
    admin::HistoryEntry {
        at: e.at,
        trigger: match e.trigger {
            Trigger::Failure => admin::Trigger::Failure,
            Trigger::Signal(causes) => {
                admin::Trigger::Signal(causes.into_iter().map(wit::ChangeCause::from).collect())
            }
            Trigger::Start => admin::Trigger::Start,
            Trigger::Tick => admin::Trigger::Tick,
            Trigger::Due => admin::Trigger::Due,
            Trigger::Person => admin::Trigger::Person,
            Trigger::Dispatch => admin::Trigger::Dispatch,
        },
        availability: e.availability.map(Into::into),
        action: match e.action {
            Action::Scheduled(t) => admin::Action::Scheduled(t),
            Action::Rescheduled(old, new) => admin::Action::Rescheduled((old, new)),
            Action::Watching => admin::Action::Watching,
            Action::Declined => admin::Action::Declined,
            Action::Dropped => admin::Action::Dropped,
            Action::Dispatched(n) => admin::Action::Dispatched(n),
            Action::Resolved => admin::Action::Resolved,
            Action::Unchanged => admin::Action::Unchanged,
        },
        reason: e.reason,
    }
}

impl admin::Guest for Component {
    fn status(thread: Option<String>) -> Result<Vec<admin::Candidate>, admin::AdminError> {
        with_engine(|engine| engine.status(thread.as_deref()))
            .map(|list| list.into_iter().map(to_wit_candidate).collect())
            .map_err(to_wit_admin_error)
    }

    fn explain(thread: String) -> Result<Vec<admin::ChainHistory>, admin::AdminError> {
        with_engine(|engine| engine.explain(&thread))
            .map(|chains| {
                chains
                    .into_iter()
                    .map(|c| admin::ChainHistory {
                        thread: c.thread,
                        original_request: c.original_request,
                        entries: c.entries.into_iter().map(to_wit_entry).collect(),
                    })
                    .collect()
            })
            .map_err(to_wit_admin_error)
    }

    fn cancel(thread: String, now: wit::Timestamp) -> Result<admin::Candidate, admin::AdminError> {
        with_engine(|engine| engine.cancel(&thread, now))
            .map(to_wit_candidate)
            .map_err(to_wit_admin_error)
    }

    fn sent_by_person(
        thread: String,
        row: wit::RowId,
        now: wit::Timestamp,
    ) -> Result<(), admin::AdminError> {
        with_engine(|engine| engine.sent_by_person(&thread, row, now)).map_err(to_wit_admin_error)
    }
}
