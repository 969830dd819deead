//! The `settings` interface: listing, reading and setting the pool's settings, and
//! the signals a setting that changes availability queues.

use super::Admin;
use crate::engine::{Cancel, Clock, Log, Random, Upstream};
use crate::model::ChangeCause;
use crate::settings::{self, SettingError};
use pooler_plugin_kit::{Db, DbError};

/// A refused setting, or a storage failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingsError {
    Refused(SettingError),
    Storage(String),
}

impl From<DbError> for SettingsError {
    fn from(e: DbError) -> Self {
        SettingsError::Storage(e.to_string())
    }
}

/// One setting as a person sees it: the kit's, which every plugin and the admin API share.
pub use pooler_plugin_kit::settings::Setting;

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics>
    Admin<'a, D, U, E>
{
    pub fn list_settings(&self) -> Result<Vec<Setting>, SettingsError> {
        let pairs = self.store.setting_pairs()?;
        Ok(settings::SPECS
            .iter()
            .map(|spec| Setting {
                key: spec.key.to_owned(),
                value: pairs
                    .iter()
                    .find(|(k, _)| k == spec.key)
                    .map_or_else(|| spec.default.to_owned(), |(_, v)| v.clone()),
                default_value: spec.default.to_owned(),
                description: spec.description.to_owned(),
            })
            .collect())
    }

    pub fn get_setting(&self, key: &str) -> Result<Setting, SettingsError> {
        self.list_settings()?
            .into_iter()
            .find(|s| s.key == key)
            .ok_or_else(|| SettingsError::Refused(SettingError::UnknownKey(key.to_owned())))
    }

    /// Validate and store a setting; a change that may alter availability queues
    /// `config-changed` (or `routing-changed`) for the providers it affects.
    pub fn set_setting(&self, key: &str, value: &str) -> Result<Setting, SettingsError> {
        let canonical = settings::canonical(key, value).map_err(SettingsError::Refused)?;
        settings::check_memory(
            key,
            value,
            &canonical,
            crate::body::can_hold,
            crate::body::largest_held,
        )
        .map_err(SettingsError::Refused)?;
        let before = self.get_setting(key)?.value;
        self.store.put_setting(key, &canonical)?;
        if before != canonical {
            let cause = if key.ends_with("-routing") {
                ChangeCause::RoutingChanged
            } else {
                ChangeCause::ConfigChanged
            };
            let affects =
                key.ends_with("-routing") || key.ends_with("-url") || key == "switch-threshold";
            if affects {
                for p in settings::affected_providers(key) {
                    self.signal(p, cause)?;
                }
            }
        }
        self.get_setting(key)
    }
}
