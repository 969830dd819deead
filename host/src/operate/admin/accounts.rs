//! `/_pooler/accounts…`: the pool's accounts, through its `accounts` export.
//!
//! | method and path                      | body                                        | answer |
//! |--------------------------------------|---------------------------------------------|--------|
//! | `GET /accounts[?provider=P]`         |                                             | `{"accounts": [account…]}` |
//! | `POST /accounts`                     | `{provider, credential, label?, priority?}` | 201 `{"account": …}` |
//! | `POST /accounts/import`              | `{provider, contents, label?, priority?}`   | 201 `{"account": …}` |
//! | `POST /accounts/reorder`             | `{provider, ids: [id…]}`                    | `{"accounts": [account…]}` |
//! | `GET /accounts/{id}`                 |                                             | `{"account": …}` |
//! | `DELETE /accounts/{id}`              |                                             | `{"removed": id}` |
//! | `POST /accounts/{id}/enable`         |                                             | `{"account": …}` |
//! | `POST /accounts/{id}/disable`        |                                             | `{"account": …}` |
//! | `POST /accounts/{id}/refresh`        |                                             | `{"account": …}` |
//! | `PUT /accounts/{id}/priority`        | `{priority}`                                | `{"account": …}` |
//! | `PUT /accounts/{id}/credential`      | `{credential}`                              | `{"account": …}` (same id, label, priority, order, pins; error cleared) |
//! | `PUT /accounts/{id}/options`         | `{last_resort?, extra_usage?, max_in_flight?, preserve?}` | `{"account": …}` (fields left out keep their value) |
//!
//! An add or import may carry `options` (the same object; fields left out take the
//! defaults): `last_resort` (bool), `extra_usage` (`allow` or `deny`), `max_in_flight` (0: no
//! limit) and `preserve` (a fraction > 0 and ≤ 1; 1: no ceiling). An account shows them as
//! `last_resort`, `extra_usage`, `max_in_flight` and `preserve`.
//!
//! `credential` is `{"api_key": "…"}` (Claude) or `{"oauth": {"access_token", "refresh_token",
//! "expires_at"?, "chatgpt_account_id"?}}` (`expires_at` in epoch ms; the account id is
//! required for Codex). `contents` is the text of a Claude Code `.credentials.json` or a
//! Codex CLI `auth.json`. No answer ever holds a secret: an account shows a `secret_hint`.

use super::{Admin, AdminRequest, ApiError, Fields, Reply};
use crate::operate::wire::{AccountView, ProviderName};
use crate::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    AccountInfo, AccountOptions, AccountsError, Credential, ExtraUsage, NewAccount,
    OauthCredential, OptionsChange,
};

/// What the pool's `accounts-error` means for a person, with its HTTP status.
pub(super) fn refused(e: AccountsError) -> ApiError {
    match e {
        AccountsError::NoSuchAccount(id) => ApiError::not_found(
            "no-such-account",
            format!("no account has the id `{id}` (`pooler account list` shows them)"),
        ),
        AccountsError::ApiKeyNotSupported(p) => ApiError::bad_request(
            "api-key-not-supported",
            format!(
                "API keys are only for Claude; a {} account needs OAuth credentials (import its login file)",
                ProviderName::from(p)
            ),
        ),
        AccountsError::InvalidCredential(why) => {
            ApiError::bad_request("invalid-credential", format!("invalid credential: {why}"))
        }
        AccountsError::InvalidLoginFile(why) => ApiError::bad_request(
            "invalid-login-file",
            format!("the login file was not understood: {why}"),
        ),
        AccountsError::InvalidLabel(why) => {
            ApiError::bad_request("invalid-label", format!("invalid label: {why}"))
        }
        AccountsError::InvalidOrder(why) => {
            ApiError::bad_request("invalid-order", format!("cannot reorder: {why}"))
        }
        AccountsError::InvalidOptions(why) => {
            ApiError::bad_request("invalid-options", format!("invalid account option: {why}"))
        }
        AccountsError::RefreshRefused(why) => ApiError::new(
            hyper::StatusCode::BAD_GATEWAY,
            "refresh-refused",
            format!("the token endpoint refused the refresh ({why}): sign in again and re-import the login"),
        ),
        AccountsError::UpstreamUnreachable(why) => ApiError::unavailable(
            "upstream-unreachable",
            format!("the provider's endpoint could not be reached ({why}); try again"),
        ),
        AccountsError::Storage(why) => ApiError::unavailable(
            "storage",
            format!("the pool's database failed ({why}); try again"),
        ),
    }
}

pub(super) async fn handle(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    match (req.method(), req.rest().as_slice()) {
        ("GET", []) => list(admin, req).await,
        ("POST", []) => add(admin, req).await,
        ("POST", ["import"]) => import(admin, req).await,
        ("POST", ["reorder"]) => reorder(admin, req).await,
        ("GET", [id]) => show(admin, id).await,
        ("DELETE", [id]) => remove(admin, id).await,
        ("POST", [id, action @ ("enable" | "disable" | "refresh")]) => act(admin, id, action).await,
        ("PUT", [id, "priority"]) => priority(admin, req, id).await,
        ("PUT", [id, "credential"]) => update_credential(admin, req, id).await,
        ("PUT", [id, "options"]) => update_options(admin, req, id).await,
        _ => Err(ApiError::no_endpoint(req)),
    }
}

fn one(account: AccountInfo) -> serde_json::Value {
    serde_json::json!({ "account": AccountView::from(account) })
}

fn many(accounts: Vec<AccountInfo>) -> serde_json::Value {
    let accounts: Vec<AccountView> = accounts.into_iter().map(AccountView::from).collect();
    serde_json::json!({ "accounts": accounts })
}

async fn list(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    let provider = req.query("provider").map(super::path_provider).transpose()?;
    let accounts = admin
        .pool("accounts.list-accounts", move |store, pool| {
            Box::pin(pool.pooler_plugins_accounts().call_list_accounts(store, provider))
        })
        .await?
        .map_err(refused)?;
    Reply::ok(many(accounts))
}

/// One account, from the pool's list (the `accounts` export has no single-account read).
async fn show(admin: &Admin, id: &str) -> Result<Reply, ApiError> {
    let accounts = admin
        .pool("accounts.list-accounts", move |store, pool| {
            Box::pin(pool.pooler_plugins_accounts().call_list_accounts(store, None))
        })
        .await?
        .map_err(refused)?;
    match accounts.into_iter().find(|a| a.id == id) {
        Some(account) => Reply::ok(one(account)),
        None => Err(refused(AccountsError::NoSuchAccount(id.to_owned()))),
    }
}

/// The `credential` object of an add or update request.
fn credential(fields: &mut Fields) -> Result<Credential, ApiError> {
    let Some(mut credential) = fields.object("credential")? else {
        return Err(ApiError::bad_request(
            "missing-field",
            "`credential` is required: `{\"api_key\": …}` or `{\"oauth\": {…}}`",
        ));
    };
    let api_key = credential.opt_str("api_key")?;
    let oauth = credential.object("oauth")?;
    credential.finish()?;
    match (api_key, oauth) {
        (Some(key), None) => Ok(Credential::ApiKey(key)),
        (None, Some(mut o)) => {
            let oauth = OauthCredential {
                access_token: o.str("access_token")?,
                refresh_token: o.str("refresh_token")?,
                expires_at: o.opt_u64("expires_at")?,
                chatgpt_account_id: o.opt_str("chatgpt_account_id")?,
            };
            o.finish()?;
            Ok(Credential::Oauth(oauth))
        }
        _ => Err(ApiError::bad_request(
            "invalid-credential",
            "`credential` must hold exactly one of `api_key` and `oauth`",
        )),
    }
}

/// An options object (`options` of an add or import, or the body of `PUT …/options`):
/// each field read when present.
fn options_change(fields: &mut Fields) -> Result<OptionsChange, ApiError> {
    let extra_usage = match fields.opt_str("extra_usage")?.as_deref() {
        None => None,
        Some("allow") => Some(ExtraUsage::Allow),
        Some("deny") => Some(ExtraUsage::Deny),
        Some(_) => {
            return Err(ApiError::bad_request(
                "invalid-field",
                "`extra_usage` must be `allow` or `deny`",
            ));
        }
    };
    let max_in_flight = fields
        .opt_u64("max_in_flight")?
        .map(|n| {
            u32::try_from(n).map_err(|_| {
                ApiError::bad_request("invalid-field", "`max_in_flight` must be at most 10000")
            })
        })
        .transpose()?;
    Ok(OptionsChange {
        last_resort: fields.opt_bool("last_resort")?,
        extra_usage,
        max_in_flight,
        preserve: fields.opt_f64("preserve")?,
    })
}

/// The `options` of an add or import: what it sets over the defaults.
fn new_options(fields: &mut Fields) -> Result<Option<AccountOptions>, ApiError> {
    let Some(mut object) = fields.object("options")? else {
        return Ok(None);
    };
    let change = options_change(&mut object)?;
    object.finish()?;
    Ok(Some(AccountOptions {
        last_resort: change.last_resort.unwrap_or(false),
        extra_usage: change.extra_usage.unwrap_or(ExtraUsage::Deny),
        max_in_flight: change.max_in_flight.unwrap_or(0),
        preserve: change.preserve.unwrap_or(1.0),
    }))
}

async fn add(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    let mut fields = req.fields()?;
    let account = NewAccount {
        provider: fields.provider("provider")?,
        credential: credential(&mut fields)?,
        label: fields.opt_str("label")?,
        priority: fields.opt_i32("priority")?,
        options: new_options(&mut fields)?,
    };
    fields.finish()?;
    let added = admin
        .pool("accounts.add", move |store, pool| {
            Box::pin(async move { pool.pooler_plugins_accounts().call_add(store, &account).await })
        })
        .await?
        .map_err(refused)?;
    Reply::created(one(added))
}

async fn import(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    let mut fields = req.fields()?;
    let provider = fields.provider("provider")?;
    let contents = fields.str("contents")?;
    let label = fields.opt_str("label")?;
    let priority = fields.opt_i32("priority")?;
    let options = new_options(&mut fields)?;
    fields.finish()?;
    let added = admin
        .pool("accounts.import-login", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_accounts()
                    .call_import_login(store, provider, &contents, label.as_deref(), priority)
                    .await
            })
        })
        .await?
        .map_err(refused)?;
    let Some(o) = options else {
        return Reply::created(one(added));
    };
    // The import has no options of its own: they follow at once.
    let change = OptionsChange {
        last_resort: Some(o.last_resort),
        extra_usage: Some(o.extra_usage),
        max_in_flight: Some(o.max_in_flight),
        preserve: Some(o.preserve),
    };
    let updated = set_options(admin, &added.id, change).await?;
    Reply::created(one(updated))
}

async fn reorder(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    let mut fields = req.fields()?;
    let provider = fields.provider("provider")?;
    let ids = fields.strings("ids")?;
    fields.finish()?;
    let accounts = admin
        .pool("accounts.reorder", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_accounts()
                    .call_reorder(store, provider, &ids)
                    .await
            })
        })
        .await?
        .map_err(refused)?;
    Reply::ok(many(accounts))
}

async fn remove(admin: &Admin, id: &str) -> Result<Reply, ApiError> {
    let id = id.to_owned();
    let target = id.clone();
    admin
        .pool("accounts.remove", move |store, pool| {
            Box::pin(async move { pool.pooler_plugins_accounts().call_remove(store, &target).await })
        })
        .await?
        .map_err(refused)?;
    Reply::ok(serde_json::json!({ "removed": id }))
}

async fn act(admin: &Admin, id: &str, action: &str) -> Result<Reply, ApiError> {
    let id = id.to_owned();
    let account = match action {
        "enable" => {
            admin
                .pool("accounts.enable", move |store, pool| {
                    Box::pin(async move { pool.pooler_plugins_accounts().call_enable(store, &id).await })
                })
                .await?
        }
        "disable" => {
            admin
                .pool("accounts.disable", move |store, pool| {
                    Box::pin(async move { pool.pooler_plugins_accounts().call_disable(store, &id).await })
                })
                .await?
        }
        _ => {
            admin
                .pool("accounts.refresh", move |store, pool| {
                    Box::pin(async move { pool.pooler_plugins_accounts().call_refresh(store, &id).await })
                })
                .await?
        }
    }
    .map_err(refused)?;
    Reply::ok(one(account))
}

async fn priority(admin: &Admin, req: &AdminRequest, id: &str) -> Result<Reply, ApiError> {
    let mut fields = req.fields()?;
    let priority = fields.i32("priority")?;
    fields.finish()?;
    let id = id.to_owned();
    let account = admin
        .pool("accounts.set-priority", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_accounts()
                    .call_set_priority(store, &id, priority)
                    .await
            })
        })
        .await?
        .map_err(refused)?;
    Reply::ok(one(account))
}

async fn update_credential(admin: &Admin, req: &AdminRequest, id: &str) -> Result<Reply, ApiError> {
    let mut fields = req.fields()?;
    let credential = credential(&mut fields)?;
    fields.finish()?;
    let id = id.to_owned();
    let account = admin
        .pool("accounts.update-credential", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_accounts()
                    .call_update_credential(store, &id, &credential)
                    .await
            })
        })
        .await?
        .map_err(refused)?;
    Reply::ok(one(account))
}

async fn set_options(
    admin: &Admin,
    id: &str,
    change: OptionsChange,
) -> Result<AccountInfo, ApiError> {
    let id = id.to_owned();
    admin
        .pool("accounts.update-options", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_accounts()
                    .call_update_options(store, &id, change)
                    .await
            })
        })
        .await?
        .map_err(refused)
}

async fn update_options(admin: &Admin, req: &AdminRequest, id: &str) -> Result<Reply, ApiError> {
    let mut fields = req.fields()?;
    let change = options_change(&mut fields)?;
    fields.finish()?;
    Reply::ok(one(set_options(admin, id, change).await?))
}
