//! `/_pooler/settings…`: both plugins' settings through their `settings` exports, under one
//! key space. A key is shown with its role's prefix (`pool.switch-threshold`,
//! `retry.maximum-wait`); the prefix is stripped before the plugin is called.
//!
//! | method and path          | body        | answer |
//! |--------------------------|-------------|--------|
//! | `GET /settings`          |             | `{"settings": [setting…]}` (every loaded plugin's, by key) |
//! | `GET /settings/{key}`    |             | `{"setting": …}` |
//! | `PUT /settings/{key}`    | `{value}`   | `{"setting": …}` as stored |
//!
//! A setting is `{key, value, default, description}`; values are strings in the key's format
//! (durations `250ms`/`20s`/`5m`, fractions `0.98`, booleans `on`/`off`, URLs).

use super::{Admin, AdminRequest, ApiError, Reply};
use crate::operate::wire::SettingView;
use crate::runtime::bindings::pool::exports::pooler::plugins::settings as pool_settings;
use crate::runtime::bindings::retry::exports::pooler::plugins::settings as retry_settings;
use crate::runtime::imports::http_out::allow::{AllowList, Origin};
use crate::runtime::roles::Role;

/// The key prefix of each role's settings.
const PREFIXES: [(&str, Role); 2] = [("pool.", Role::AccountPool), ("retry.", Role::ProviderRetry)];

fn prefix(role: Role) -> &'static str {
    PREFIXES
        .iter()
        .find(|(_, r)| *r == role)
        .map_or("", |(p, _)| p)
}

/// A plugin's `settings-error`, whichever world it came from.
enum Refusal {
    UnknownKey(String),
    InvalidValue {
        key: String,
        value: String,
        accepted: String,
    },
    Storage(String),
}

/// The two worlds' bindings have distinct (identical) types: convert both the same way.
macro_rules! convert_from {
    ($module:ident, $view:ident) => {
        impl From<$module::SettingsError> for Refusal {
            fn from(e: $module::SettingsError) -> Self {
                match e {
                    $module::SettingsError::UnknownKey(key) => Refusal::UnknownKey(key),
                    $module::SettingsError::InvalidValue(v) => Refusal::InvalidValue {
                        key: v.key,
                        value: v.value,
                        accepted: v.accepted,
                    },
                    $module::SettingsError::Storage(why) => Refusal::Storage(why),
                }
            }
        }

        /// The setting as the admin API shows it: its key with the role's prefix.
        fn $view(s: $module::Setting, prefix: &str) -> SettingView {
            SettingView {
                key: format!("{prefix}{}", s.key),
                value: s.value,
                default_value: s.default_value,
                description: s.description,
            }
        }
    };
}
convert_from!(pool_settings, from_pool);
convert_from!(retry_settings, from_retry);

fn refused(role: Role, e: Refusal) -> ApiError {
    let prefix = prefix(role);
    match e {
        Refusal::UnknownKey(key) => ApiError::not_found(
            "unknown-setting",
            format!("no setting `{prefix}{key}` (`pooler config get` lists them)"),
        ),
        Refusal::InvalidValue {
            key,
            value,
            accepted,
        } => ApiError::bad_request(
            "invalid-value",
            format!("`{prefix}{key}` cannot be `{value}`: accepted values are {accepted}"),
        ),
        Refusal::Storage(why) => ApiError::unavailable(
            "storage",
            format!("the {role} plugin's database failed ({why}); try again"),
        ),
    }
}

/// The role a prefixed key belongs to, and the key without its prefix.
fn split_key(key: &str) -> Result<(Role, String), ApiError> {
    PREFIXES
        .iter()
        .find_map(|(prefix, role)| key.strip_prefix(prefix).map(|rest| (*role, rest.to_owned())))
        .filter(|(_, rest)| !rest.is_empty())
        .ok_or_else(|| {
            ApiError::not_found(
                "unknown-setting",
                format!(
                    "no setting `{key}`: keys start with `pool.` (Account Pooler) or `retry.` (Provider Retry); `pooler config get` lists them"
                ),
            )
        })
}

pub(super) async fn handle(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    match (req.method(), req.rest().as_slice()) {
        ("GET", []) => list(admin).await,
        ("GET", [key]) if key.starts_with("alerts.") => {
            let setting = alerts_settings(admin.host().config())
                .into_iter()
                .find(|s| &s.key == key)
                .ok_or_else(|| {
                    ApiError::not_found(
                        "unknown-setting",
                        format!("no setting `{key}` (`pooler config get` lists them)"),
                    )
                })?;
            Reply::ok(serde_json::json!({ "setting": setting }))
        }
        ("PUT", [key]) if key.starts_with("alerts.") => Err(ApiError::bad_request(
            "read-only",
            format!(
                "`{key}` is set in the configuration file's [alerts] table (docs/alerts.md), then `pooler serve` restarted"
            ),
        )),
        ("GET", [key]) => {
            let (role, key) = split_key(key)?;
            let setting = get(admin, role, key).await?;
            Reply::ok(serde_json::json!({ "setting": setting }))
        }
        ("PUT", [key]) => {
            let (role, key) = split_key(key)?;
            let mut fields = req.fields()?;
            let value = fields.str("value")?;
            fields.finish()?;
            let setting = set(admin, role, key, value).await?;
            Reply::ok(serde_json::json!({ "setting": setting }))
        }
        _ => Err(ApiError::no_endpoint(req)),
    }
}

async fn list(admin: &Admin) -> Result<Reply, ApiError> {
    let mut all = Vec::new();
    if admin.host().has_role(Role::AccountPool) {
        let settings = admin
            .pool("settings.list-settings", |store, pool| {
                Box::pin(pool.pooler_plugins_settings().call_list_settings(store))
            })
            .await?
            .map_err(|e| refused(Role::AccountPool, e.into()))?;
        all.extend(
            settings
                .into_iter()
                .map(|s| from_pool(s, prefix(Role::AccountPool))),
        );
    }
    if admin.host().has_role(Role::ProviderRetry) {
        let settings = admin
            .retry("settings.list-settings", |store, retry| {
                Box::pin(retry.pooler_plugins_settings().call_list_settings(store))
            })
            .await?
            .map_err(|e| refused(Role::ProviderRetry, e.into()))?;
        all.extend(
            settings
                .into_iter()
                .map(|s| from_retry(s, prefix(Role::ProviderRetry))),
        );
    }
    all.extend(alerts_settings(admin.host().config()));
    all.sort_by(|a, b| a.key.cmp(&b.key));
    Reply::ok(serde_json::json!({ "settings": all }))
}

/// The host's `[alerts]` table as read-only settings (`alerts.…`): it is set in the
/// configuration file. The webhook shows as its origin and the command as its program
/// only: either may carry a notification service's secret.
fn alerts_settings(config: &crate::config::Config) -> Vec<SettingView> {
    let view = super::alerts::config_view(&config.alerts);
    let defaults = super::alerts::config_view(&crate::config::AlertsConfig::default());
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "(none)".to_string(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    [
        ("webhook", "the URL each window of alerts is POSTed to (origin shown)"),
        ("format", "the webhook's body: json, slack or ntfy"),
        ("command", "the program run once per window of alerts (program shown)"),
        ("command_timeout_s", "seconds the command may run"),
        ("coalesce_s", "seconds alerts are gathered into one delivery"),
        ("check_interval_s", "seconds between looks at the accounts and threads"),
    ]
    .into_iter()
    .map(|(field, what)| SettingView {
        key: format!("alerts.{}", field.replace('_', "-")),
        value: text(&view[field]),
        default_value: text(&defaults[field]),
        description: format!("{what}; set in the configuration file's [alerts]"),
    })
    .collect()
}

async fn get(admin: &Admin, role: Role, key: String) -> Result<SettingView, ApiError> {
    match role {
        Role::AccountPool => admin
            .pool("settings.get-setting", move |store, pool| {
                Box::pin(async move { pool.pooler_plugins_settings().call_get_setting(store, &key).await })
            })
            .await?
            .map(|s| from_pool(s, prefix(role)))
            .map_err(|e| refused(role, e.into())),
        Role::ProviderRetry => admin
            .retry("settings.get-setting", move |store, retry| {
                Box::pin(async move { retry.pooler_plugins_settings().call_get_setting(store, &key).await })
            })
            .await?
            .map(|s| from_retry(s, prefix(role)))
            .map_err(|e| refused(role, e.into())),
    }
}

async fn set(admin: &Admin, role: Role, key: String, value: String) -> Result<SettingView, ApiError> {
    // Refused before the plugin stores anything: plain http:// would carry credentials in
    // clear past this machine, and a URL parsers read differently (a port past 65535,
    // `user@`, a backslash, a NUL) would be granted one origin and fail every request.
    AllowList::check_value(&value).map_err(|e| {
        ApiError::bad_request("invalid-value", format!("`{}{key}` cannot be set: {e}", prefix(role)))
    })?;
    let stored = store(admin, role, key.clone(), value.clone()).await?;
    // A URL a person configured is an origin the plugin may now reach (the allow-list's
    // second source). The grant comes from the value the person gave, never from what the
    // plugin answered it stored: a plugin cannot widen its own reach by answering another
    // URL. The setting's earlier grant is revoked.
    let granted = admin.host().set_grant(role, &key, &value).map_err(|e| {
        tracing::error!(error = %e, "cannot keep the allowed host of a URL setting");
        ApiError::internal(
            "grant-failed",
            format!("the setting was stored, but its host could not be allowed: {e}"),
        )
    })?;
    if let Some(origin) = &granted
        && Origin::of_url(&stored.value).is_some_and(|answered| answered != *origin)
    {
        tracing::warn!(
            plugin = role.name(),
            key = %stored.key,
            granted = %origin,
            rule = "a setting grants the origin the person gave",
            "the plugin answered a URL of another origin than the one set; only the one set is allowed"
        );
    }
    Ok(stored)
}

async fn store(admin: &Admin, role: Role, key: String, value: String) -> Result<SettingView, ApiError> {
    match role {
        Role::AccountPool => admin
            .pool("settings.set-setting", move |store, pool| {
                Box::pin(async move {
                    pool.pooler_plugins_settings()
                        .call_set_setting(store, &key, &value)
                        .await
                })
            })
            .await?
            .map(|s| from_pool(s, prefix(role)))
            .map_err(|e| refused(role, e.into())),
        Role::ProviderRetry => admin
            .retry("settings.set-setting", move |store, retry| {
                Box::pin(async move {
                    retry
                        .pooler_plugins_settings()
                        .call_set_setting(store, &key, &value)
                        .await
                })
            })
            .await?
            .map(|s| from_retry(s, prefix(role)))
            .map_err(|e| refused(role, e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_split_by_role_prefix() {
        assert_eq!(
            split_key("pool.switch-threshold").unwrap(),
            (Role::AccountPool, "switch-threshold".to_owned())
        );
        assert_eq!(
            split_key("retry.maximum-wait").unwrap(),
            (Role::ProviderRetry, "maximum-wait".to_owned())
        );
        for bad in ["switch-threshold", "pool.", "pooler.x", ""] {
            let e = split_key(bad).unwrap_err();
            assert_eq!(e.code, "unknown-setting");
            assert!(e.message.contains(&format!("`{bad}`")), "{}", e.message);
        }
    }
}
