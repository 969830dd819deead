//! `GET /_pooler/status`: is the server up, which plugins fill which role, how busy it is.

use std::sync::atomic::Ordering;

use super::{Admin, AdminRequest, ApiError, Reply};
use crate::runtime::roles::Role;

pub(super) async fn handle(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    match (req.method(), req.rest().as_slice()) {
        ("GET", []) => {
            let host = admin.host();
            let plugins: Vec<_> = Role::ALL
                .into_iter()
                .map(|role| {
                    serde_json::json!({
                        "role": role.name(),
                        "world": role.world(),
                        "loaded": host.has_role(role),
                        "source": host.plugin_source(role),
                    })
                })
                .collect();
            Reply::ok(serde_json::json!({
                "status": "ok",
                "version": env!("CARGO_PKG_VERSION"),
                "endpoint": admin.endpoint(),
                "data_dir": host.data_dir().display().to_string(),
                // This request is one of them.
                "in_flight": admin.in_flight.load(Ordering::SeqCst),
                "plugins": plugins,
            }))
        }
        _ => Err(ApiError::no_endpoint(req)),
    }
}
