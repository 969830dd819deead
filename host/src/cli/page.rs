//! `pooler page`: a one-time sign-in link to the status page (`/_pooler/page`, see
//! `admin/page.rs`). The link carries a random single-use code valid for 5 minutes, never
//! the admin token; opening it signs the browser in with a session cookie.

use serde_json::json;

use super::client::{ClientArgs, field};

/// Print a one-time link that opens the live status page in a browser.
///
/// The page shows what `pooler status` shows, refreshed every 2 s, with buttons to enable or
/// disable an account and to send a thread's retry now. The link works once, within 5
/// minutes; opening it signs that browser in (an HttpOnly cookie, for 12 hours or until the
/// server restarts). The admin token is never part of the link.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    pooler page                  # print the link, then open it in a browser\n  \
    xdg-open \"$(pooler page)\"    # open it at once (Linux)\n  \
    pooler page --json           # {\"url\": …, \"expires_at\": …}")]
pub struct Args {
    #[command(flatten)]
    pub(super) client: ClientArgs,
}

/// Run `pooler page` against the server of `--data-dir`; `--json` prints the JSON answer.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = args.client.connect()?;
    let answer = client.post("page/login-codes", &json!({})).await?;
    args.client.print(&answer, |answer| {
        let url: String = field(answer, "url")?;
        println!("{url}");
        eprintln!("(works once, within 5 minutes)");
        Ok(())
    })
}
