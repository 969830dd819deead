//! One delivery's shapes: the JSON document (`format = "json"`), Slack's incoming-webhook
//! message, ntfy's published message, and the argument list and environment of the
//! `command`. Plain functions over the alerts of one coalescing window.

use serde_json::{Value, json};

use super::model::{Alert, AlertState};

/// `[alerts] format`: the body a webhook gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// The JSON document of `docs/alerts.md`.
    #[default]
    Json,
    /// A Slack (or Mattermost, Discord `/slack`) incoming webhook: `{"text": …}`.
    Slack,
    /// An ntfy topic URL: the text as the body, `Title`, `Tags` and `Priority` headers.
    Ntfy,
}

impl Format {
    /// The format's name in the configuration: `json`, `slack` or `ntfy`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Slack => "slack",
            Format::Ntfy => "ntfy",
        }
    }
}

/// The version of the JSON document's shape; a change of a field's meaning bumps it.
pub const DOCUMENT_VERSION: u32 = 1;

/// The placeholders a `command` argument may hold.
pub const PLACEHOLDERS: [&str; 13] = [
    "title", "body", "kind", "state", "count", "json", "subject", "provider", "account", "label",
    "thread", "until", "reason",
];

/// One delivery: the alerts of a window, with the text every shape shares.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The alerts of the coalescing window, at least one.
    pub alerts: Vec<Alert>,
    /// When it was assembled (epoch ms).
    pub sent_at: u64,
}

impl Delivery {
    /// The title: the one alert's own, or a count of firing and resolved ones for several.
    pub fn title(&self) -> String {
        match self.alerts.as_slice() {
            [one] => one.title(),
            many => {
                let firing = many
                    .iter()
                    .filter(|a| a.state == AlertState::Firing)
                    .count();
                format!(
                    "pooler: {} alerts ({firing} firing, {} resolved)",
                    many.len(),
                    many.len() - firing
                )
            }
        }
    }

    /// The text: one line per alert.
    pub fn body(&self) -> String {
        self.alerts
            .iter()
            .map(Alert::line)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `firing`, `resolved`, or `mixed`.
    pub fn state(&self) -> &'static str {
        let firing = self.alerts.iter().any(|a| a.state == AlertState::Firing);
        let resolved = self.alerts.iter().any(|a| a.state == AlertState::Resolved);
        match (firing, resolved) {
            (true, true) => "mixed",
            (false, true) => "resolved",
            _ => "firing",
        }
    }

    /// The kinds of the alerts, each once, comma-separated.
    pub fn kinds(&self) -> String {
        let mut kinds: Vec<&str> = Vec::new();
        for a in &self.alerts {
            if !kinds.contains(&a.condition.kind.name()) {
                kinds.push(a.condition.kind.name());
            }
        }
        kinds.join(",")
    }

    /// The JSON document (`docs/alerts.md` lists its fields).
    pub fn document(&self) -> Value {
        let alerts: Vec<Value> = self
            .alerts
            .iter()
            .map(|a| {
                let mut v = serde_json::to_value(a).unwrap_or(Value::Null);
                if let Some(map) = v.as_object_mut() {
                    map.insert("title".into(), a.title().into());
                    map.insert("text".into(), a.line().into());
                }
                v
            })
            .collect();
        json!({
            "source": "pooler",
            "version": DOCUMENT_VERSION,
            "title": self.title(),
            "body": self.body(),
            "state": self.state(),
            "sent_at": self.sent_at,
            "alerts": alerts,
        })
    }

    /// The webhook request's body and extra headers in `format`.
    pub fn webhook(&self, format: Format) -> (Vec<u8>, Vec<(&'static str, String)>) {
        match format {
            Format::Json => (
                self.document().to_string().into_bytes(),
                vec![("content-type", "application/json".into())],
            ),
            Format::Slack => (
                json!({ "text": format!("*{}*\n{}", self.title(), self.body()) })
                    .to_string()
                    .into_bytes(),
                vec![("content-type", "application/json".into())],
            ),
            Format::Ntfy => {
                let (tags, priority) = match self.state() {
                    "resolved" => ("white_check_mark", "default"),
                    _ => ("warning", "high"),
                };
                (
                    self.body().into_bytes(),
                    vec![
                        ("content-type", "text/plain; charset=utf-8".into()),
                        ("title", header_text(&self.title())),
                        ("tags", tags.into()),
                        ("priority", priority.into()),
                    ],
                )
            }
        }
    }

    /// A placeholder's value: the delivery's for `title` … `json`, the single alert's for
    /// the per-alert fields (empty when the delivery holds several).
    fn placeholder(&self, name: &str) -> String {
        let one = match self.alerts.as_slice() {
            [one] => Some(&one.condition),
            _ => None,
        };
        let field =
            |f: fn(&super::model::Condition) -> Option<String>| one.and_then(f).unwrap_or_default();
        match name {
            "title" => self.title(),
            "body" => self.body(),
            "kind" => self.kinds(),
            "state" => self.state().to_string(),
            "count" => self.alerts.len().to_string(),
            "json" => self.document().to_string(),
            "subject" => field(|c| Some(c.subject.clone())),
            "provider" => field(|c| c.provider.clone()),
            "account" => field(|c| c.account.clone()),
            "label" => field(|c| c.label.clone()),
            "thread" => field(|c| c.thread.clone()),
            "until" => field(|c| c.until.map(crate::time::rfc3339)),
            "reason" => field(|c| c.reason.clone()),
            _ => String::new(),
        }
    }

    /// The command's arguments: each `{name}` of [`PLACEHOLDERS`] in `template` replaced by
    /// its value (no shell: a value is one argument, whatever it holds).
    pub fn argv(&self, template: &[String]) -> Vec<String> {
        template
            .iter()
            .map(|arg| {
                let mut out = arg.clone();
                for name in PLACEHOLDERS {
                    let token = format!("{{{name}}}");
                    if out.contains(&token) {
                        out = out.replace(&token, &self.placeholder(name));
                    }
                }
                out
            })
            .collect()
    }

    /// The command's environment: `POOLER_ALERT_<NAME>` for every placeholder.
    pub fn env(&self) -> Vec<(String, String)> {
        PLACEHOLDERS
            .iter()
            .map(|name| {
                (
                    format!("POOLER_ALERT_{}", name.to_ascii_uppercase()),
                    self.placeholder(name),
                )
            })
            .collect()
    }
}

/// The `{name}` placeholders of `arg` that are not [`PLACEHOLDERS`].
pub fn unknown_placeholders(arg: &str) -> Vec<String> {
    let mut unknown = Vec::new();
    let mut rest = arg;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else { break };
        let name = &after[..close];
        if !name.is_empty()
            && name.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            && !PLACEHOLDERS.contains(&name)
        {
            unknown.push(name.to_string());
        }
        rest = &after[close + 1..];
    }
    unknown
}

/// Text fit for an HTTP header value: printable ASCII, other characters as `?`.
fn header_text(text: &str) -> String {
    text.chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::model::{AlertKind, Condition};
    use super::*;

    fn delivery(states: &[AlertState]) -> Delivery {
        let alerts = states
            .iter()
            .enumerate()
            .map(|(i, state)| {
                let mut c = Condition::new(AlertKind::AccountError, format!("acct-{i}"));
                c.account = Some(format!("acct-{i}"));
                c.label = Some(format!("work {i}"));
                c.provider = Some("claude".into());
                c.reason = Some("invalid x-api-key [redacted]".into());
                Alert {
                    condition: c,
                    state: *state,
                    at: 5,
                    since: 1,
                }
            })
            .collect();
        Delivery { alerts, sent_at: 7 }
    }

    #[test]
    fn the_json_document_has_its_documented_fields() {
        let doc = delivery(&[AlertState::Firing]).document();
        assert_eq!(doc["source"], "pooler");
        assert_eq!(doc["version"], 1);
        assert_eq!(doc["state"], "firing");
        assert_eq!(doc["title"], "claude account work 0 is in error");
        assert_eq!(doc["sent_at"], 7);
        let a = &doc["alerts"][0];
        for (field, value) in [
            ("kind", json!("account-error")),
            ("state", json!("firing")),
            ("subject", json!("acct-0")),
            ("provider", json!("claude")),
            ("account", json!("acct-0")),
            ("label", json!("work 0")),
            ("thread", Value::Null),
            ("until", Value::Null),
            ("reason", json!("invalid x-api-key [redacted]")),
            ("at", json!(5)),
            ("since", json!(1)),
            ("title", json!("claude account work 0 is in error")),
        ] {
            assert_eq!(a[field], value, "{field} in {a}");
        }
    }

    #[test]
    fn slack_and_ntfy_get_their_shapes() {
        let d = delivery(&[AlertState::Firing, AlertState::Resolved]);
        let (body, headers) = d.webhook(Format::Slack);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert!(
            v["text"]
                .as_str()
                .unwrap()
                .starts_with("*pooler: 2 alerts (1 firing, 1 resolved)*\n")
        );
        assert_eq!(
            headers,
            vec![("content-type", "application/json".to_string())]
        );
        let (body, headers) = d.webhook(Format::Ntfy);
        assert_eq!(String::from_utf8(body).unwrap(), d.body());
        assert!(headers.contains(&("title", d.title())));
        assert!(headers.contains(&("priority", "high".into())));
    }

    #[test]
    fn the_command_gets_placeholders_as_whole_arguments_and_environment() {
        let d = delivery(&[AlertState::Firing]);
        let template: Vec<String> = [
            "-t",
            "{title}",
            "-b",
            "{body}",
            "x{kind}y",
            "{count}",
            "$(rm -rf /); {label}",
        ]
        .map(String::from)
        .to_vec();
        let argv = d.argv(&template);
        assert_eq!(argv[1], "claude account work 0 is in error");
        assert_eq!(argv[3], d.body());
        assert_eq!(argv[4], "xaccount-errory");
        assert_eq!(argv[5], "1");
        assert_eq!(
            argv[6], "$(rm -rf /); work 0",
            "no shell: kept as one literal argument"
        );
        let env = d.env();
        assert!(env.contains(&("POOLER_ALERT_ACCOUNT".into(), "acct-0".into())));
        assert!(env.contains(&("POOLER_ALERT_STATE".into(), "firing".into())));
        // Several alerts: the per-alert fields are empty, the summary is filled.
        let many = delivery(&[AlertState::Firing, AlertState::Firing]);
        assert_eq!(
            many.argv(&["{account}|{count}".into()]),
            vec!["|2".to_string()]
        );
    }

    #[test]
    fn unknown_placeholders_are_named() {
        assert_eq!(
            unknown_placeholders("{title} {tittle} {} {A}"),
            vec!["tittle"]
        );
        assert!(unknown_placeholders("{body}").is_empty());
    }
}
