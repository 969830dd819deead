//! What the person (and the measurement) asks of the plugins, through their WIT exports —
//! the calls `pooler account …`, `pooler config set` and `pooler session explain` make
//! through the admin API.

use anyhow::anyhow;
use pooler_host::runtime::Host;
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    AccountInfo, Credential, NewAccount, OptionsChange,
};

type Pool = pooler_host::runtime::bindings::types::Provider;

fn err(what: &str, e: impl std::fmt::Debug) -> anyhow::Error {
    anyhow!("{what}: {e:?}")
}

pub async fn add_account(host: &Host, account: NewAccount) -> anyhow::Result<AccountInfo> {
    host.call_pool("accounts.add", move |store, pool| {
        Box::pin(async move {
            pool.pooler_plugins_accounts()
                .call_add(store, &account)
                .await
        })
    })
    .await
    .map_err(|e| err("accounts.add", e))?
    .map_err(|e| err("accounts.add", e))
}

pub async fn set_enabled(host: &Host, id: &str, on: bool) -> anyhow::Result<AccountInfo> {
    let id = id.to_owned();
    host.call_pool("accounts.enable", move |store, pool| {
        Box::pin(async move {
            let accounts = pool.pooler_plugins_accounts();
            if on {
                accounts.call_enable(store, &id).await
            } else {
                accounts.call_disable(store, &id).await
            }
        })
    })
    .await
    .map_err(|e| err("accounts.enable", e))?
    .map_err(|e| err("accounts.enable", e))
}

pub async fn update_credential(
    host: &Host,
    id: &str,
    credential: Credential,
) -> anyhow::Result<AccountInfo> {
    let id = id.to_owned();
    host.call_pool("accounts.update-credential", move |store, pool| {
        Box::pin(async move {
            pool.pooler_plugins_accounts()
                .call_update_credential(store, &id, &credential)
                .await
        })
    })
    .await
    .map_err(|e| err("accounts.update-credential", e))?
    .map_err(|e| err("accounts.update-credential", e))
}

/// `pooler account update ID --last-resort …`: change an account's options.
pub async fn update_options(
    host: &Host,
    id: &str,
    change: OptionsChange,
) -> anyhow::Result<AccountInfo> {
    let id = id.to_owned();
    host.call_pool("accounts.update-options", move |store, pool| {
        Box::pin(async move {
            pool.pooler_plugins_accounts()
                .call_update_options(store, &id, change)
                .await
        })
    })
    .await
    .map_err(|e| err("accounts.update-options", e))?
    .map_err(|e| err("accounts.update-options", e))
}

pub async fn list_accounts(host: &Host) -> anyhow::Result<Vec<AccountInfo>> {
    host.call_pool("accounts.list-accounts", move |store, pool| {
        Box::pin(async move {
            pool.pooler_plugins_accounts()
                .call_list_accounts(store, None)
                .await
        })
    })
    .await
    .map_err(|e| err("accounts.list-accounts", e))?
    .map_err(|e| err("accounts.list-accounts", e))
}

/// `pooler config set pool.<key> <value>`.
pub async fn set_pool(host: &Host, key: &str, value: &str) -> anyhow::Result<()> {
    let (k, v) = (key.to_owned(), value.to_owned());
    host.call_pool("settings.set-setting", move |store, pool| {
        Box::pin(async move {
            pool.pooler_plugins_settings()
                .call_set_setting(store, &k, &v)
                .await
        })
    })
    .await
    .map_err(|e| err("settings.set-setting", e))?
    .map_err(|e| anyhow!("pool.{key} = {value:?} refused: {e:?}"))?;
    Ok(())
}

/// `pooler config set retry.<key> <value>`.
pub async fn set_retry(host: &Host, key: &str, value: &str) -> anyhow::Result<()> {
    let (k, v) = (key.to_owned(), value.to_owned());
    host.call_retry("settings.set-setting", move |store, retry| {
        Box::pin(async move {
            retry
                .pooler_plugins_settings()
                .call_set_setting(store, &k, &v)
                .await
        })
    })
    .await
    .map_err(|e| err("settings.set-setting", e))?
    .map_err(|e| anyhow!("retry.{key} = {value:?} refused: {e:?}"))?;
    Ok(())
}

/// The account a session is pinned to now (`pooler session explain`).
pub async fn pinned(host: &Host, provider: Pool, session: &str) -> anyhow::Result<Option<String>> {
    let session = session.to_owned();
    let answer = host
        .call_pool("routing.explain-session", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_routing()
                    .call_explain_session(store, provider, &session)
                    .await
            })
        })
        .await
        .map_err(|e| err("routing.explain-session", e))?
        .map_err(|e| err("routing.explain-session", e))?;
    Ok(answer.account)
}
