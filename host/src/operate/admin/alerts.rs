//! `/_pooler/alerts…`: what `pooler alerts` asks (`docs/alerts.md`).
//!
//! | method and path      | answer |
//! |----------------------|--------|
//! | `GET /alerts`        | `{"config": {…}, "open": [alert…]}`: the deliveries set (the webhook as its origin only) and the episodes open now |
//! | `POST /alerts/test`  | `{"outcomes": [{via, ok, detail, attempts}…]}`: a test alert sent through every channel at once, once |

use super::{Admin, AdminRequest, ApiError, Reply};

pub(super) async fn handle(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    let alerts = admin.host().alerts();
    match (req.method(), req.rest().as_slice()) {
        ("GET", []) => {
            admin.host().check_alerts().await;
            Reply::ok(serde_json::json!({
                "config": config_view(alerts.config()),
                "open": alerts.open(),
            }))
        }
        ("POST", ["test"]) => {
            let outcomes = alerts.test().await;
            Reply::ok(serde_json::json!({
                "config": config_view(alerts.config()),
                "outcomes": outcomes,
            }))
        }
        _ => Err(ApiError::no_endpoint(req)),
    }
}

/// `[alerts]` as a person may see it: never the webhook's path (it may be its secret), nor
/// the command's arguments (they may hold a notification service's URL with its token),
/// only the program.
pub(crate) fn config_view(c: &crate::config::AlertsConfig) -> serde_json::Value {
    serde_json::json!({
        "webhook": c.webhook_shown(),
        "format": c.format.name(),
        "command": c.command.as_ref().and_then(|argv| argv.first()).map(|p| format!("{p} …")),
        "command_timeout_s": c.command_timeout_s,
        "coalesce_s": c.coalesce_s,
        "check_interval_s": c.check_interval_s,
    })
}
