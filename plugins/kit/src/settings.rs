//! One setting as a person sees it (WIT `settings.setting`): every plugin's `settings`
//! interface answers with it, and the host's admin API serves it as JSON, its key prefixed
//! with the plugin's role (`pool.switch-threshold`) and `default_value` spelled `default`
//! (feature `serde`).

/// One setting: its key, its current and default values in the key's canonical format, and
/// what it does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Setting {
    /// The key (with its role's prefix on the admin API).
    pub key: String,
    /// The current value, in the key's canonical format.
    pub value: String,
    /// The default value, in the same format.
    #[cfg_attr(feature = "serde", serde(rename = "default"))]
    pub default_value: String,
    /// What the setting does and which values it accepts.
    pub description: String,
}

#[cfg(test)]
mod tests {
    /// The admin API's spelling, which `pooler config` and scripts read.
    #[cfg(feature = "serde")]
    #[test]
    fn a_setting_shows_its_default_as_default() {
        let setting = super::Setting {
            key: "pool.switch-threshold".into(),
            value: "0.9".into(),
            default_value: "0.95".into(),
            description: "when to move on".into(),
        };
        let json = serde_json::to_value(&setting).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "key": "pool.switch-threshold",
                "value": "0.9",
                "default": "0.95",
                "description": "when to move on",
            })
        );
        assert_eq!(
            serde_json::from_value::<super::Setting>(json).unwrap(),
            setting
        );
    }
}
