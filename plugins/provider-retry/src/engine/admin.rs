//! The admin calls (WIT `retry-admin`): status, explain, cancel, and a row a person sent.

use pooler_plugin_kit::Db;

use super::{Engine, candidate};
use crate::store::{self, Chain, ChainState};
use crate::types::{Action, AdminError, Candidate, ChainHistory, Timestamp, Trigger};

impl<D: Db> Engine<'_, D> {
    /// Open candidates of one thread or all, by next send time, watches last.
    pub fn status(&self, thread: Option<&str>) -> Result<Vec<Candidate>, AdminError> {
        let chains = match thread {
            Some(t) => store::chains_of_thread(self.db, t)?,
            None => store::open_chains(self.db, None)?,
        };
        let mut list: Vec<Candidate> = chains.iter().filter_map(candidate).collect();
        list.sort_by_key(|c| (c.send_at.is_none(), c.send_at));
        Ok(list)
    }

    /// The histories of a thread's chains, oldest chain first.
    pub fn explain(&self, thread: &str) -> Result<Vec<ChainHistory>, AdminError> {
        let chains = store::chains_of_thread(self.db, thread)?;
        if chains.is_empty() {
            return Err(AdminError::UnknownThread(thread.to_owned()));
        }
        chains
            .into_iter()
            .map(|c| {
                Ok(ChainHistory {
                    entries: store::history(self.db, c.id)?,
                    thread: c.thread,
                    original_request: c.original_request,
                })
            })
            .collect()
    }

    /// Cancel the thread's open candidate on a person's behalf; returns it as it was.
    pub fn cancel(&self, thread: &str, now: Timestamp) -> Result<Candidate, AdminError> {
        let chain = self.open_chain_of(thread)?;
        let before = candidate(&chain);
        self.db.transaction(|_| {
            self.close(chain, "cancelled by a person", &Trigger::Person, now, None)
        })?;
        before.ok_or_else(|| AdminError::NothingPending(thread.to_owned()))
    }

    /// A person sent the thread's row now, bypassing the gates; record it.
    pub fn sent_by_person(&self, thread: &str, row: u64, now: Timestamp) -> Result<(), AdminError> {
        let mut chain = match store::find_chain_by_row(self.db, row)? {
            Some(c) if c.thread == thread => c,
            _ => self.open_chain_of(thread)?,
        };
        let attempt = chain.failed_attempt + 1;
        chain.state = ChainState::Dispatched;
        chain.row_id = None;
        chain.reason = format!("sent now by a person as attempt {attempt}");
        chain.updated_at = now;
        self.db.transaction(|db| {
            store::save_chain(db, &chain)?;
            self.record(
                &chain,
                now,
                &Trigger::Person,
                None,
                Action::Dispatched(attempt),
                "sent now by a person, bypassing the gates",
            )
        })?;
        Ok(())
    }

    fn open_chain_of(&self, thread: &str) -> Result<Chain, AdminError> {
        let chains = store::chains_of_thread(self.db, thread)?;
        if chains.is_empty() {
            return Err(AdminError::UnknownThread(thread.to_owned()));
        }
        chains
            .into_iter()
            .rev()
            .find(|c| c.state.is_open())
            .ok_or_else(|| AdminError::NothingPending(thread.to_owned()))
    }
}
