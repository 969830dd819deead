//! The pool's admin exports as the test harnesses call them (the CLI reaches the same ones
//! through the admin API): one wrapper each, returning the plugin's own answer and panicking,
//! with the call's name, only when the host could not make the call (no pool, a trap).

use pooler_host::runtime::Host;
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    AccountInfo, AccountsError, NewAccount,
};
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::settings::{
    Setting, SettingsError,
};
use pooler_host::runtime::bindings::types::Provider;

/// `accounts.add`.
pub async fn add_account(host: &Host, account: NewAccount) -> Result<AccountInfo, AccountsError> {
    host.call_pool("accounts.add", move |store, pool| {
        Box::pin(async move {
            pool.pooler_plugins_accounts()
                .call_add(store, &account)
                .await
        })
    })
    .await
    .expect("accounts.add")
}

/// `accounts.enable`.
pub async fn enable_account(host: &Host, id: &str) -> Result<AccountInfo, AccountsError> {
    let id = id.to_owned();
    host.call_pool("accounts.enable", move |store, pool| {
        Box::pin(async move { pool.pooler_plugins_accounts().call_enable(store, &id).await })
    })
    .await
    .expect("accounts.enable")
}

/// `accounts.disable`.
pub async fn disable_account(host: &Host, id: &str) -> Result<AccountInfo, AccountsError> {
    let id = id.to_owned();
    host.call_pool("accounts.disable", move |store, pool| {
        Box::pin(async move {
            pool.pooler_plugins_accounts()
                .call_disable(store, &id)
                .await
        })
    })
    .await
    .expect("accounts.disable")
}

/// `accounts.list-accounts`, of one provider or all.
pub async fn list_accounts(
    host: &Host,
    provider: Option<Provider>,
) -> Result<Vec<AccountInfo>, AccountsError> {
    host.call_pool("accounts.list-accounts", move |store, pool| {
        Box::pin(async move {
            pool.pooler_plugins_accounts()
                .call_list_accounts(store, provider)
                .await
        })
    })
    .await
    .expect("accounts.list-accounts")
}

/// `settings.set-setting` of the pool.
pub async fn set_pool_setting(
    host: &Host,
    key: &str,
    value: &str,
) -> Result<Setting, SettingsError> {
    let (key, value) = (key.to_owned(), value.to_owned());
    host.call_pool("settings.set-setting", move |store, pool| {
        Box::pin(async move {
            pool.pooler_plugins_settings()
                .call_set_setting(store, &key, &value)
                .await
        })
    })
    .await
    .expect("settings.set-setting")
}
