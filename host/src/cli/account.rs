//! `pooler account …`: the pool's accounts (admin API `/_pooler/accounts…`). Secrets go in
//! (from stdin, the environment, or a file) and never come out: lists show a hint (`…abcd`).

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{ArgGroup, Subcommand};
use serde_json::{Map, Value, json};

use super::UsageError;
use super::client::{ClientArgs, field};
use super::format::{now_ms, relative, table, when};
use super::login;
use crate::operate::wire::{AccountView, ProviderName, percent_encode};

/// Manage the pool's accounts: add, sign in, import, update, list, enable, disable, remove,
/// refresh, order.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    pooler account add --provider claude --api-key -          # paste the key, then Ctrl-D\n  \
    POOLER_API_KEY=sk-ant-... pooler account add --provider claude --label work\n  \
    pooler account login --provider claude --label max        # sign in in a browser\n  \
    pooler account login --provider codex                     # device code, no browser here\n  \
    pooler account import --provider codex                    # ~/.codex/auth.json\n  \
    pooler account update 01J9Z... --api-key -                # a new key, same account\n  \
    pooler account list --provider claude\n  \
    pooler account disable 01J9Z...\n  \
    pooler account reorder --provider claude B-ID A-ID C-ID")]
pub struct Args {
    #[command(flatten)]
    pub(super) client: ClientArgs,
    #[command(subcommand)]
    command: AccountCommand,
}

#[derive(Debug, Subcommand)]
enum AccountCommand {
    /// Add an account with an API key (Claude) or OAuth credentials (a JSON file).
    Add(AddArgs),
    /// Add an account from a Claude Code or Codex CLI login file.
    Import(ImportArgs),
    /// Sign in to a Claude or Codex subscription here, without the provider's CLI, and add
    /// the account (or, with --replace, give an existing account the new tokens).
    Login(LoginArgs),
    /// Replace an account's credential in place (a new API key or new OAuth tokens), and/or
    /// change its options (last-resort, extra usage, in-flight limit, preserve ceiling).
    ///
    /// With a new credential the account keeps its id, label, priority, order and the
    /// conversations pinned to it; its error (and a hold after a refused token, and the
    /// sign-in flag) clears, and the pool tells Provider Retry its availability changed.
    Update(UpdateArgs),
    /// List accounts in selection order: status, utilization, resets, holds, errors.
    List {
        /// Only this provider's accounts.
        #[arg(long, value_parser = crate::operate::wire::provider_arg())]
        provider: Option<ProviderName>,
    },
    /// Show one account: status, utilization, resets, hold, error.
    Show { id: String },
    /// Enable an account (also clears its error and hold).
    Enable { id: String },
    /// Disable an account; requests in flight finish.
    Disable { id: String },
    /// Remove an account and its secret.
    Remove { id: String },
    /// Refresh an account's usage now (and, for an OAuth account in error, its token).
    Refresh { id: String },
    /// Set an account's priority (lower is tried first; negative allowed).
    Priority {
        id: String,
        #[arg(allow_negative_numbers = true)]
        priority: i32,
    },
    /// Put a provider's accounts in this order (every account, disabled ones included, once).
    Reorder {
        #[arg(long, value_parser = crate::operate::wire::provider_arg())]
        provider: ProviderName,
        /// Every account id of the provider, first-choice first.
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
    },
}

/// A secret from the command line; `Debug` never shows it.
#[derive(Clone)]
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

fn secret(text: &str) -> Result<Secret, String> {
    Ok(Secret(text.to_owned()))
}

/// The account options a person sets when adding or updating an account.
#[derive(Debug, Clone, Default, clap::Args)]
struct OptionArgs {
    /// Use this account only when no other account of its provider is eligible (the spare
    /// you would otherwise enable by hand when the others are spent); `--last-resort=false`
    /// makes it an ordinary account again.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    last_resort: Option<bool>,
    /// Whether paid extra usage (Claude overage, Codex credits) may serve once the plan has
    /// spent a model-family window: `deny` (the default: such a window counts as spent) or
    /// `allow` (you are billed for it).
    #[arg(long, value_name = "allow|deny", value_parser = ["allow", "deny"])]
    extra_usage: Option<String>,
    /// The most requests in flight on this account at once (0: no limit). Requests over it
    /// go to another account, or wait briefly when every account is at its limit.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=10_000))]
    max_in_flight: Option<u32>,
    /// Take no new conversation once this share of the weekly window is used (e.g. 0.8;
    /// `off` or 1: no ceiling) while another account can take it.
    #[arg(long, value_name = "FRACTION", value_parser = preserve)]
    preserve: Option<f64>,
}

impl OptionArgs {
    fn is_empty(&self) -> bool {
        self.last_resort.is_none()
            && self.extra_usage.is_none()
            && self.max_in_flight.is_none()
            && self.preserve.is_none()
    }

    /// The admin API's options object: the fields given.
    fn json(&self) -> Value {
        let mut o = Map::new();
        if let Some(v) = self.last_resort {
            o.insert("last_resort".into(), json!(v));
        }
        if let Some(v) = &self.extra_usage {
            o.insert("extra_usage".into(), json!(v));
        }
        if let Some(v) = self.max_in_flight {
            o.insert("max_in_flight".into(), json!(v));
        }
        if let Some(v) = self.preserve {
            o.insert("preserve".into(), json!(v));
        }
        Value::Object(o)
    }

    /// The `options` of an add: absent when no option was given.
    fn for_add(&self) -> Value {
        if self.is_empty() {
            Value::Null
        } else {
            self.json()
        }
    }
}

/// A `--preserve` value: a fraction > 0 and ≤ 1, or `off`.
fn preserve(text: &str) -> Result<f64, String> {
    if text.eq_ignore_ascii_case("off") {
        return Ok(1.0);
    }
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err("a fraction > 0 and ≤ 1 (e.g. 0.8), or `off`".to_owned()),
    }
}

#[derive(Debug, clap::Args)]
#[command(
    group(ArgGroup::new("credential").required(true).args(["api_key", "oauth_file"])),
    after_help = "A key given as `--api-key KEY` stays in your shell history and is visible to \
                  other local users in the process list: prefer `--api-key -` (reads standard \
                  input) or the POOLER_API_KEY environment variable.\n\n\
                  The OAuth file is JSON: {\"access_token\": \"…\", \"refresh_token\": \"…\", \
                  \"expires_at\": <epoch ms, optional>, \"chatgpt_account_id\": \"… (Codex)\"}. \
                  For a Claude Code or Codex CLI login, use `pooler account import`."
)]
struct AddArgs {
    /// The provider: claude or codex.
    #[arg(long, value_parser = crate::operate::wire::provider_arg())]
    provider: ProviderName,
    /// An Anthropic API key (Claude only); `-` reads it from standard input.
    #[arg(
        long,
        value_name = "KEY",
        env = "POOLER_API_KEY",
        hide_env_values = true,
        value_parser = secret
    )]
    api_key: Option<Secret>,
    /// A JSON file with OAuth credentials (see below).
    #[arg(long, value_name = "FILE")]
    oauth_file: Option<PathBuf>,
    /// A label for people (default: "Claude API key", "Claude account", "Codex account").
    #[arg(long)]
    label: Option<String>,
    /// Lower is tried first; ties keep the order added (default 0).
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<i32>,
    #[command(flatten)]
    options: OptionArgs,
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Default files: Claude Code `$CLAUDE_CONFIG_DIR/.credentials.json`, else \
    `~/.claude/.credentials.json`; Codex CLI `$CODEX_HOME/auth.json`, else `~/.codex/auth.json`. \
    On macOS Claude Code keeps its login in the Keychain: save it to a file and pass --from.")]
struct ImportArgs {
    /// The provider whose login file it is: claude or codex.
    #[arg(long, value_parser = crate::operate::wire::provider_arg())]
    provider: ProviderName,
    /// The login file (default: the provider's CLI login file, see below).
    #[arg(long, value_name = "FILE")]
    from: Option<PathBuf>,
    /// A label for people.
    #[arg(long)]
    label: Option<String>,
    /// Lower is tried first (default 0).
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<i32>,
    #[command(flatten)]
    options: OptionArgs,
}

#[derive(Debug, clap::Args)]
#[command(
    group(ArgGroup::new("credential").args(["api_key", "oauth_file"])),
    after_help = "Examples:\n  \
        pooler account update 01J9Z... --api-key -        # paste the new key, then Ctrl-D\n  \
        pooler account update 01J9Z... --oauth-file tokens.json\n  \
        pooler account update 01J9Z... --last-resort      # the spare, used when the rest are spent\n  \
        pooler account update 01J9Z... --extra-usage allow --max-in-flight 0 --preserve off\n\n\
        Give a new credential, options, or both. An API key is only for a Claude account. The \
        OAuth file is the JSON `account add --oauth-file` takes. To sign an OAuth account in \
        again, use `pooler account login --provider P --replace ID`."
)]
struct UpdateArgs {
    /// The account (`pooler account list` shows the ids).
    id: String,
    /// The new Anthropic API key (Claude only); `-` reads it from standard input.
    #[arg(
        long,
        value_name = "KEY",
        env = "POOLER_API_KEY",
        hide_env_values = true,
        value_parser = secret
    )]
    api_key: Option<Secret>,
    /// A JSON file with the new OAuth credentials.
    #[arg(long, value_name = "FILE")]
    oauth_file: Option<PathBuf>,
    #[command(flatten)]
    options: OptionArgs,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Claude: open the printed URL in any browser, sign in, and paste back the \
    code the page shows (CODE#STATE; the whole callback URL works too).\n\
    Codex: open the printed page, sign in and enter the printed one-time code; this command \
    waits (up to 15 minutes) and then stores the account.\n\n\
    The tokens go straight to the running server; nothing secret is printed. The endpoints \
    default to the providers' own (claude.ai, console.anthropic.com, auth.openai.com); the \
    flags below exist for testing and for proxies.\n\n\
    Examples:\n  \
    pooler account login --provider claude --label max --priority -1\n  \
    pooler account login --provider codex --replace 01J9Z..."
)]
struct LoginArgs {
    /// The provider: claude (authorization code with PKCE) or codex (device code).
    #[arg(long, value_parser = crate::operate::wire::provider_arg())]
    provider: ProviderName,
    /// A label for people (default: "Claude account", "Codex account").
    #[arg(long, conflicts_with = "replace")]
    label: Option<String>,
    /// Lower is tried first; ties keep the order added (default 0).
    #[arg(long, allow_negative_numbers = true, conflicts_with = "replace")]
    priority: Option<i32>,
    /// Give this existing account the new tokens instead of adding one (it keeps its id,
    /// label, priority, order, options and pins).
    #[arg(long, value_name = "ID")]
    replace: Option<String>,
    #[command(flatten)]
    options: OptionArgs,
    /// Claude's authorize URL.
    #[arg(long, value_name = "URL", env = "POOLER_CLAUDE_AUTHORIZE_URL", default_value = login::CLAUDE_AUTHORIZE_URL)]
    authorize_url: String,
    /// Claude's token URL.
    #[arg(long, value_name = "URL", env = "POOLER_CLAUDE_TOKEN_URL", default_value = login::CLAUDE_TOKEN_URL)]
    token_url: String,
    /// Claude's redirect URI (the page that shows the code to paste).
    #[arg(long, value_name = "URL", env = "POOLER_CLAUDE_REDIRECT_URI", default_value = login::CLAUDE_REDIRECT_URI)]
    redirect_uri: String,
    /// Codex's OAuth issuer (device code, verification page and token endpoints hang off it).
    #[arg(long, value_name = "URL", env = "POOLER_CODEX_ISSUER", default_value = login::CODEX_ISSUER)]
    issuer: String,
    /// How long to wait for a Codex device code to be entered, in seconds (tests).
    #[arg(long, hide = true, env = "POOLER_CODEX_DEVICE_TIMEOUT_SECS", default_value_t = login::DEVICE_CODE_LIFETIME.as_secs())]
    device_timeout_secs: u64,
}

/// Run `pooler account …` against the server of `--data-dir`; `--json` prints the JSON answer.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let out = &args.client;
    match args.command {
        AccountCommand::Add(add) => {
            let body = add_body(add)?;
            let answer = out.connect()?.post("accounts", &body).await?;
            out.print(&answer, |answer| {
                let account: AccountView = field(answer, "account")?;
                println!("added {}", summary(&account));
                Ok(())
            })
        }
        AccountCommand::Import(import) => {
            let path = match import.from {
                Some(path) => path,
                None => default_login_file(import.provider)?,
            };
            let contents = std::fs::read_to_string(&path).with_context(|| {
                format!("cannot read the login file {} (pass --from FILE)", path.display())
            })?;
            let body = json!({
                "provider": import.provider,
                "contents": contents,
                "label": import.label,
                "priority": import.priority,
                "options": import.options.for_add(),
            });
            let answer = out.connect()?.post("accounts/import", &body).await?;
            out.print(&answer, |answer| {
                let account: AccountView = field(answer, "account")?;
                println!("imported {} from {}", summary(&account), path.display());
                Ok(())
            })
        }
        AccountCommand::Login(args) => sign_in(out, args).await,
        AccountCommand::Update(update) => {
            let has_credential = update.api_key.is_some() || update.oauth_file.is_some();
            if !has_credential && update.options.is_empty() {
                return Err(UsageError(
                    "give a new credential (--api-key or --oauth-file), options \
                     (--last-resort, --extra-usage, --max-in-flight, --preserve), or both"
                        .to_owned(),
                )
                .into());
            }
            let client = out.connect()?;
            let path = |what: &str| format!("accounts/{}/{what}", percent_encode(&update.id));
            let mut answer = None;
            if has_credential {
                let credential = read_credential(update.api_key, update.oauth_file)?;
                answer = Some(
                    client
                        .put(&path("credential"), &json!({ "credential": credential }))
                        .await?,
                );
            }
            if !update.options.is_empty() {
                answer = Some(client.put(&path("options"), &update.options.json()).await?);
            }
            let answer = answer.expect("a credential or options were sent");
            out.print(&answer, |answer| {
                let account: AccountView = field(answer, "account")?;
                println!("updated {}", summary(&account));
                Ok(())
            })
        }
        AccountCommand::List { provider } => {
            let path = match provider {
                Some(p) => format!("accounts?provider={p}"),
                None => "accounts".to_owned(),
            };
            let answer = out.connect()?.get(&path).await?;
            out.print(&answer, |answer| {
                let accounts: Vec<AccountView> = field(answer, "accounts")?;
                print_list(&accounts);
                Ok(())
            })
        }
        AccountCommand::Show { id } => {
            let answer = out
                .connect()?
                .get(&format!("accounts/{}", percent_encode(&id)))
                .await?;
            out.print(&answer, |answer| {
                let account: AccountView = field(answer, "account")?;
                println!("{}", summary(&account));
                print!("{}", details(&account, now_ms()));
                Ok(())
            })
        }
        AccountCommand::Enable { id } => act(out, &id, "enable", "enabled").await,
        AccountCommand::Disable { id } => act(out, &id, "disable", "disabled").await,
        AccountCommand::Refresh { id } => {
            let answer = out
                .connect()?
                .post(&format!("accounts/{}/refresh", percent_encode(&id)), &json!({}))
                .await?;
            out.print(&answer, |answer| {
                let account: AccountView = field(answer, "account")?;
                println!("refreshed {}", summary(&account));
                print!("{}", details(&account, now_ms()));
                Ok(())
            })
        }
        AccountCommand::Remove { id } => {
            let answer = out
                .connect()?
                .delete(&format!("accounts/{}", percent_encode(&id)))
                .await?;
            out.print(&answer, |_| {
                println!("removed account {id}");
                Ok(())
            })
        }
        AccountCommand::Priority { id, priority } => {
            let answer = out
                .connect()?
                .put(
                    &format!("accounts/{}/priority", percent_encode(&id)),
                    &json!({ "priority": priority }),
                )
                .await?;
            out.print(&answer, |answer| {
                let account: AccountView = field(answer, "account")?;
                println!("set priority {priority}: {}", summary(&account));
                Ok(())
            })
        }
        AccountCommand::Reorder { provider, ids } => {
            let answer = out
                .connect()?
                .post("accounts/reorder", &json!({ "provider": provider, "ids": ids }))
                .await?;
            out.print(&answer, |answer| {
                let accounts: Vec<AccountView> = field(answer, "accounts")?;
                print_list(&accounts);
                Ok(())
            })
        }
    }
}

async fn act(out: &ClientArgs, id: &str, action: &str, done: &str) -> anyhow::Result<()> {
    let answer = out
        .connect()?
        .post(&format!("accounts/{}/{action}", percent_encode(id)), &json!({}))
        .await?;
    out.print(&answer, |answer| {
        let account: AccountView = field(answer, "account")?;
        println!("{done} {}", summary(&account));
        Ok(())
    })
}

/// The body of `POST /accounts`, with the secret read from where the flags say.
fn add_body(add: AddArgs) -> anyhow::Result<Value> {
    let credential = read_credential(add.api_key, add.oauth_file)?;
    Ok(json!({
        "provider": add.provider,
        "credential": credential,
        "label": add.label,
        "priority": add.priority,
        "options": add.options.for_add(),
    }))
}

/// The admin API's `credential` object from `--api-key` (`-`: standard input) or
/// `--oauth-file`.
fn read_credential(api_key: Option<Secret>, oauth_path: Option<PathBuf>) -> anyhow::Result<Value> {
    Ok(match (api_key, oauth_path) {
        (Some(Secret(key)), None) => {
            let key = if key == "-" {
                let mut text = String::new();
                std::io::stdin()
                    .read_to_string(&mut text)
                    .context("cannot read the API key from standard input")?;
                text
            } else {
                key
            };
            let key = key.trim();
            if key.is_empty() {
                return Err(UsageError("the API key is empty".to_owned()).into());
            }
            json!({ "api_key": key })
        }
        (None, Some(path)) => json!({ "oauth": oauth_file(&path)? }),
        // clap's group makes exactly one of them present.
        _ => {
            return Err(
                UsageError("give exactly one of --api-key and --oauth-file".to_owned()).into(),
            );
        }
    })
}

/// `account login`: run the provider's sign-in here, then add (or, with `--replace`, update)
/// the account through the admin API. The server is found first, so a sign-in is never
/// wasted on a server that is not there.
async fn sign_in(out: &ClientArgs, args: LoginArgs) -> anyhow::Result<()> {
    let client = out.connect()?;
    let http = login::OAuthHttp::new();
    let tokens = match args.provider {
        ProviderName::Claude => {
            let sign_in = login::ClaudeSignIn::start(login::ClaudeEndpoints {
                authorize_url: args.authorize_url,
                token_url: args.token_url,
                redirect_uri: args.redirect_uri,
                ..login::ClaudeEndpoints::default()
            })?;
            eprintln!(
                "Open this URL in a browser, sign in to Claude, and paste the code the page \
                 shows (CODE#STATE):\n\n  {}\n",
                sign_in.authorize_url()
            );
            eprint!("Code: ");
            let pasted = tokio::task::spawn_blocking(|| {
                let mut line = String::new();
                std::io::stdin().read_line(&mut line).map(|_| line)
            })
            .await
            .context("cannot read the pasted code")?
            .context("cannot read the pasted code from standard input")?;
            if pasted.trim().is_empty() {
                return Err(UsageError("no code was pasted; nothing was stored".to_owned()).into());
            }
            sign_in.finish(&http, &pasted, now_ms()).await?
        }
        ProviderName::Codex => {
            login::codex_device_login(
                &http,
                &login::CodexEndpoints {
                    issuer: args.issuer,
                    lifetime: std::time::Duration::from_secs(args.device_timeout_secs),
                    ..login::CodexEndpoints::default()
                },
            )
            .await?
        }
    };
    let (answer, done) = match &args.replace {
        Some(id) => {
            let mut answer = client
                .put(
                    &format!("accounts/{}/credential", percent_encode(id)),
                    &json!({ "credential": tokens.credential() }),
                )
                .await?;
            if !args.options.is_empty() {
                answer = client
                    .put(
                        &format!("accounts/{}/options", percent_encode(id)),
                        &args.options.json(),
                    )
                    .await?;
            }
            (answer, "signed in again:")
        }
        None => (
            client
                .post(
                    "accounts",
                    &json!({
                        "provider": args.provider,
                        "credential": tokens.credential(),
                        "label": args.label,
                        "priority": args.priority,
                        "options": args.options.for_add(),
                    }),
                )
                .await?,
            "signed in and added",
        ),
    };
    out.print(&answer, |answer| {
        let account: AccountView = field(answer, "account")?;
        println!("{done} {}", summary(&account));
        Ok(())
    })
}

/// Read an OAuth credentials file into the API's `oauth` object (camelCase names accepted).
fn oauth_file(path: &Path) -> anyhow::Result<Map<String, Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the OAuth file {}", path.display()))?;
    // A syntax error names a position, never the text.
    let value: Value = serde_json::from_str(&text).map_err(|e| {
        UsageError(format!("the OAuth file {} is not JSON: {e}", path.display()))
    })?;
    let Value::Object(object) = value else {
        return Err(UsageError(format!(
            "the OAuth file {} must hold a JSON object",
            path.display()
        ))
        .into());
    };
    if object.contains_key("claudeAiOauth") || object.contains_key("tokens") {
        return Err(UsageError(format!(
            "{} is a Claude Code or Codex CLI login file: use `pooler account import --from {}`",
            path.display(),
            path.display()
        ))
        .into());
    }
    let mut oauth = Map::new();
    for (name, value) in object {
        let name = match name.as_str() {
            "accessToken" => "access_token",
            "refreshToken" => "refresh_token",
            "expiresAt" => "expires_at",
            "chatgptAccountId" | "account_id" | "accountId" => "chatgpt_account_id",
            other => other,
        };
        oauth.insert(name.to_owned(), value);
    }
    Ok(oauth)
}

/// Where the provider's own CLI keeps its login.
fn default_login_file(provider: ProviderName) -> anyhow::Result<PathBuf> {
    let from_env = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let home = || {
        super::home_dir().context("no home directory to find the login file in: pass --from FILE")
    };
    Ok(match provider {
        ProviderName::Claude => match from_env("CLAUDE_CONFIG_DIR") {
            Some(dir) => dir.join(".credentials.json"),
            None => home()?.join(".claude").join(".credentials.json"),
        },
        ProviderName::Codex => match from_env("CODEX_HOME") {
            Some(dir) => dir.join("auth.json"),
            None => home()?.join(".codex").join("auth.json"),
        },
    })
}

/// `claude account 01J… "work" (…abcd), ready`.
fn summary(a: &AccountView) -> String {
    let options = a.options.words();
    let options = if options.is_empty() {
        String::new()
    } else {
        format!(" [{}]", options.join(", "))
    };
    format!(
        "{} account {} \"{}\" ({}), {}{options}",
        a.provider, a.id, a.label, a.secret_hint, a.status
    )
}

/// The most used window: `87% 5h`.
fn utilization(a: &AccountView) -> Option<String> {
    a.windows
        .iter()
        .filter_map(|w| w.utilization.map(|u| (u, w)))
        .max_by(|x, y| x.0.total_cmp(&y.0))
        .map(|(u, w)| format!("{:.0}% {}", u * 100.0, w.name))
}

/// When the account serves again if blocked, else its next known window reset.
fn next_reset(a: &AccountView, now: u64) -> Option<u64> {
    a.blocking_reset.or_else(|| {
        a.windows
            .iter()
            .filter_map(|w| w.resets_at)
            .filter(|&t| t > now)
            .min()
    })
}

fn print_list(accounts: &[AccountView]) {
    if accounts.is_empty() {
        println!("no accounts (add one with `pooler account add` or `pooler account import`)");
        return;
    }
    let now = now_ms();
    let dash = || "-".to_owned();
    let rows: Vec<Vec<String>> = accounts
        .iter()
        .map(|a| {
            vec![
                a.id.clone(),
                a.provider.to_string(),
                a.priority.to_string(),
                a.label.clone(),
                a.status.to_string(),
                utilization(a).unwrap_or_else(dash),
                next_reset(a, now).map_or_else(dash, |t| relative(t, now)),
                a.held_until.map_or_else(dash, |t| format!("until {}", relative(t, now))),
                flags(a).unwrap_or_else(dash),
                a.secret_hint.clone(),
                a.error.clone().unwrap_or_else(dash),
            ]
        })
        .collect();
    println!(
        "{}",
        table(
            &[
                "ID", "PROVIDER", "PRIO", "LABEL", "STATUS", "USED", "RESETS", "HOLD", "FLAG",
                "SECRET", "ERROR",
            ],
            &rows,
        )
    );
}

/// The FLAG column: the sign-in flag and the options that differ from the defaults.
fn flags(a: &AccountView) -> Option<String> {
    let mut words = Vec::new();
    if a.needs_sign_in {
        words.push("sign-in".to_owned());
    }
    let o = &a.options;
    if o.last_resort {
        words.push("last-resort".to_owned());
    }
    if o.extra_usage {
        words.push("extra-usage".to_owned());
    }
    if o.max_in_flight > 0 {
        words.push(format!("max {}", o.max_in_flight));
    }
    if o.preserve < 1.0 {
        words.push(format!("preserve {:.0}%", o.preserve * 100.0));
    }
    (!words.is_empty()).then(|| words.join(","))
}

/// Every known fact of one account, one per line.
fn details(a: &AccountView, now: u64) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("  {k:<14}{v}\n"));
    let o = &a.options;
    line("kind", a.kind.to_string());
    line("priority", a.priority.to_string());
    line(
        "last resort",
        if o.last_resort {
            "yes: used only when no other account is eligible".to_owned()
        } else {
            "no".to_owned()
        },
    );
    line(
        "extra usage",
        (if o.extra_usage { "allow" } else { "deny" }).to_owned(),
    );
    line(
        "in flight",
        match o.max_in_flight {
            0 => "no limit".to_owned(),
            n => format!("at most {n}"),
        },
    );
    line(
        "preserve",
        if o.preserve < 1.0 {
            format!("no new conversation from {:.0}% weekly", o.preserve * 100.0)
        } else {
            "off".to_owned()
        },
    );
    if let Some(t) = a.last_used_at {
        line("last used", when(t, now));
    }
    if let Some(t) = a.held_until {
        line("held until", when(t, now));
    }
    if let Some(t) = a.blocking_reset {
        line("serves again", when(t, now));
    }
    if let Some(t) = a.token_expires_at {
        line("token expires", when(t, now));
    }
    if a.needs_sign_in {
        line("sign in", "needed soon: the token refresh was refused".to_owned());
    }
    if let Some(e) = &a.error {
        line("error", e.clone());
    }
    for w in &a.windows {
        let mut text = w
            .utilization
            .map_or_else(|| "?".to_owned(), |u| format!("{:.0}%", u * 100.0));
        if let Some(f) = &w.family {
            text.push_str(&format!(" ({f})"));
        }
        if let Some(t) = w.resets_at {
            text.push_str(&format!(", resets {}", when(t, now)));
        }
        if w.blocking {
            text.push_str(", blocking");
        }
        line(&format!("window {}", w.name), text);
    }
    out
}
