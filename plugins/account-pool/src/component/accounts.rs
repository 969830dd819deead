//! The `accounts` export: adding, importing, removing, enabling, ordering, refreshing and
//! listing accounts, each through the admin surface, and the conversions of its types.

use super::bindings::exports::pooler::plugins::accounts;
use super::{Component, with_admin};
use crate::admin::{self, NewAccount};
use crate::model;
use crate::model::Provider;
use pooler_plugin_kit::component::types;

fn extra_usage_out(allow: bool) -> accounts::ExtraUsage {
    if allow {
        accounts::ExtraUsage::Allow
    } else {
        accounts::ExtraUsage::Deny
    }
}

fn options_out(o: model::AccountOptions) -> accounts::AccountOptions {
    accounts::AccountOptions {
        last_resort: o.last_resort,
        extra_usage: extra_usage_out(o.extra_usage),
        max_in_flight: o.max_in_flight,
        preserve: o.preserve,
    }
}

fn options_in(o: accounts::AccountOptions) -> model::AccountOptions {
    model::AccountOptions {
        last_resort: o.last_resort,
        extra_usage: o.extra_usage == accounts::ExtraUsage::Allow,
        max_in_flight: o.max_in_flight,
        preserve: o.preserve,
    }
}

fn account_out(a: admin::AccountInfo) -> accounts::AccountInfo {
    accounts::AccountInfo {
        id: a.id,
        provider: types::Provider::from(a.provider),
        kind: match a.kind {
            model::CredentialKind::ApiKey => accounts::CredentialKind::ApiKey,
            model::CredentialKind::OAuth => accounts::CredentialKind::Oauth,
        },
        label: a.label,
        priority: a.priority,
        enabled: a.enabled,
        status: match a.status {
            model::AccountStatus::Disabled => accounts::AccountStatus::Disabled,
            model::AccountStatus::Error => accounts::AccountStatus::Error,
            model::AccountStatus::Held => accounts::AccountStatus::Held,
            model::AccountStatus::Exhausted => accounts::AccountStatus::Exhausted,
            model::AccountStatus::NearLimit => accounts::AccountStatus::NearLimit,
            model::AccountStatus::Ready => accounts::AccountStatus::Ready,
        },
        secret_hint: a.secret_hint,
        created_at: a.created_at,
        last_used_at: a.last_used_at,
        error: a.error,
        held_until: a.held_until,
        needs_sign_in: a.needs_sign_in,
        token_expires_at: a.token_expires_at,
        windows: a
            .windows
            .into_iter()
            .map(|w| accounts::UsageWindow {
                name: w.name,
                family: w.family,
                utilization: w.utilization,
                resets_at: w.resets_at,
                status: w.status,
                blocking: w.blocking,
                observed_at: w.observed_at,
            })
            .collect(),
        blocking_reset: a.blocking_reset,
        options: options_out(a.options),
    }
}

fn accounts_error(e: admin::AccountsError) -> accounts::AccountsError {
    use admin::AccountsError as A;
    match e {
        A::NoSuchAccount(id) => accounts::AccountsError::NoSuchAccount(id),
        A::ApiKeyNotSupported(p) => {
            accounts::AccountsError::ApiKeyNotSupported(types::Provider::from(p))
        }
        A::InvalidCredential(m) => accounts::AccountsError::InvalidCredential(m),
        A::InvalidLoginFile(m) => accounts::AccountsError::InvalidLoginFile(m),
        A::InvalidLabel(m) => accounts::AccountsError::InvalidLabel(m),
        A::InvalidOrder(m) => accounts::AccountsError::InvalidOrder(m),
        A::InvalidOptions(m) => accounts::AccountsError::InvalidOptions(m),
        A::RefreshRefused(m) => accounts::AccountsError::RefreshRefused(m),
        A::UpstreamUnreachable(m) => accounts::AccountsError::UpstreamUnreachable(m),
        A::Storage(m) => accounts::AccountsError::Storage(m),
    }
}

fn credential_in(c: accounts::Credential) -> model::Credential {
    match c {
        accounts::Credential::ApiKey(k) => model::Credential::ApiKey(k),
        accounts::Credential::Oauth(o) => model::Credential::OAuth(model::OAuthTokens {
            access_token: o.access_token,
            refresh_token: o.refresh_token,
            expires_at: o.expires_at,
            chatgpt_account_id: o.chatgpt_account_id,
        }),
    }
}

impl accounts::Guest for Component {
    fn add(
        account: accounts::NewAccount,
    ) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        let credential = credential_in(account.credential);
        let new = NewAccount {
            provider: Provider::from(account.provider),
            credential,
            label: account.label,
            priority: account.priority,
            options: account.options.map(options_in),
        };
        with_admin(accounts::AccountsError::Storage, |a| {
            a.add(new).map(account_out).map_err(accounts_error)
        })
    }

    fn import_login(
        provider: types::Provider,
        contents: String,
        label: Option<String>,
        priority: Option<i32>,
    ) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.import_login(Provider::from(provider), &contents, label, priority)
                .map(account_out)
                .map_err(accounts_error)
        })
    }

    fn remove(id: String) -> Result<(), accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.remove(&id).map_err(accounts_error)
        })
    }

    fn enable(id: String) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.enable(&id).map(account_out).map_err(accounts_error)
        })
    }

    fn disable(id: String) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.disable(&id).map(account_out).map_err(accounts_error)
        })
    }

    fn set_priority(
        id: String,
        priority: i32,
    ) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.set_priority(&id, priority)
                .map(account_out)
                .map_err(accounts_error)
        })
    }

    fn reorder(
        provider: types::Provider,
        ids: Vec<String>,
    ) -> Result<Vec<accounts::AccountInfo>, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.reorder(Provider::from(provider), &ids)
                .map(|l| l.into_iter().map(account_out).collect())
                .map_err(accounts_error)
        })
    }

    fn update_credential(
        id: String,
        credential: accounts::Credential,
    ) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        let credential = credential_in(credential);
        with_admin(accounts::AccountsError::Storage, |a| {
            a.update_credential(&id, credential)
                .map(account_out)
                .map_err(accounts_error)
        })
    }

    fn update_options(
        id: String,
        change: accounts::OptionsChange,
    ) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        let change = model::OptionsChange {
            last_resort: change.last_resort,
            extra_usage: change.extra_usage.map(|e| e == accounts::ExtraUsage::Allow),
            max_in_flight: change.max_in_flight,
            preserve: change.preserve,
        };
        with_admin(accounts::AccountsError::Storage, |a| {
            a.update_options(&id, change)
                .map(account_out)
                .map_err(accounts_error)
        })
    }

    fn refresh(id: String) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            wstd::runtime::block_on(a.refresh(&id))
                .map(account_out)
                .map_err(accounts_error)
        })
    }

    fn list_accounts(
        provider: Option<types::Provider>,
    ) -> Result<Vec<accounts::AccountInfo>, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.list(provider.map(Provider::from))
                .map(|l| l.into_iter().map(account_out).collect())
                .map_err(accounts_error)
        })
    }

    fn quota_history(
        provider: Option<types::Provider>,
        since: u64,
    ) -> Result<Vec<accounts::QuotaEntry>, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.quota_history(provider.map(Provider::from), since)
                .map(|l| l.into_iter().map(quota_entry_out).collect())
                .map_err(accounts_error)
        })
    }
}

fn quota_entry_out(e: crate::history::HistoryEntry) -> accounts::QuotaEntry {
    use crate::history::HistoryEvent;
    accounts::QuotaEntry {
        account: e.account,
        at: e.at,
        event: match e.event {
            HistoryEvent::Window(w) => accounts::QuotaEvent::Window(accounts::WindowSample {
                name: w.name,
                family: w.family.map(|f| f.as_str().to_owned()),
                utilization: w.utilization,
                resets_at: w.resets_at,
                status: w.status,
            }),
            HistoryEvent::Hold { until } => accounts::QuotaEvent::Hold(until),
            HistoryEvent::Error => accounts::QuotaEvent::Error,
        },
    }
}
